"""Bash's ``$((...))`` and ``printf`` on plain values, without a shell and without ``eval``.

Arithmetic follows bash's own grammar (its ``expr.c``), read by precedence climbing over bash's
table: unary ``- + ! ~`` bind tighter than ``**`` (``-2**2`` is 4), ``**`` is right-associative,
then ``* / %``, ``+ -``, shifts, comparisons, ``& ^ |``, ``&& ||`` (short-circuit), ``?:`` and
``,``.  Integers are bash's: decimal, ``0x`` hex, ``0`` octal, ``BASE#DIGITS``, 64 bits wrapping
around as bash's do, division truncated toward zero.  Assignments (``=``, ``+=``, ``++``...) go
to the caller's ``assign`` (``(( X += 8 ))`` and ``let`` change the script's variables); without
one they are refused.  Sizes stay bounded, so a hostile script cannot make the reader allocate
or recurse without end.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import lru_cache

from ray_layout.errors import quoted
from ray_layout.shell.escapes import as_argv, backslash_escape

MAX_NESTING = 64  # parentheses, unary operators and ?: inside each other
MAX_VARIABLE_DEPTH = 8  # a variable whose text names a variable whose text names ...
MAX_PRINTF_CHARS = 100_000
_BITS = 2**64

# Bash's binary operators, loosest first; each is left-associative but ``**``.
_PRECEDENCE = {
    **dict.fromkeys(["||"], 1),
    **dict.fromkeys(["&&"], 2),
    **dict.fromkeys(["|"], 3),
    **dict.fromkeys(["^"], 4),
    **dict.fromkeys(["&"], 5),
    **dict.fromkeys(["==", "!="], 6),
    **dict.fromkeys(["<", "<=", ">", ">="], 7),
    **dict.fromkeys(["<<", ">>"], 8),
    **dict.fromkeys(["+", "-"], 9),
    **dict.fromkeys(["*", "/", "%"], 10),
    **dict.fromkeys(["**"], 11),
}
_OPERATIONS: dict[str, Callable[[int, int], int]] = {
    "||": lambda a, b: int(bool(a or b)),
    "&&": lambda a, b: int(bool(a and b)),
    "|": int.__or__,
    "^": int.__xor__,
    "&": int.__and__,
    "==": lambda a, b: int(a == b),
    "!=": lambda a, b: int(a != b),
    "<": lambda a, b: int(a < b),
    "<=": lambda a, b: int(a <= b),
    ">": lambda a, b: int(a > b),
    ">=": lambda a, b: int(a >= b),
    "<<": lambda a, b: a << (b & 63),  # the count modulo 64, as bash's C shift on 64 bits
    ">>": lambda a, b: a >> (b & 63),
    "+": int.__add__,
    "-": int.__sub__,
    "*": int.__mul__,
}
_UNARY: dict[str, Callable[[int], int]] = {
    "-": int.__neg__,
    "+": int.__pos__,
    "!": lambda a: int(not a),
    "~": int.__invert__,
}
_TOKEN = re.compile(
    r"[ \t\n]*(?:(?P<number>[0-9][0-9A-Za-z@_#]*)|(?P<name>[A-Za-z_][A-Za-z0-9_]*)"
    r"|(?P<operator><<=|>>=|\*\*|<<|>>|<=|>=|==|!=|&&|\|\||\+\+|--|[-+*/%&|^]="
    r"|[-+*/%<>&|^!~?:,()=]))"
)


Assign = Callable[[str, int], None]


class BeyondReach(ValueError):
    """Arithmetic past this reader's bounds (not an error of bash's): its value is unknown."""


def evaluate_arithmetic(
    expression: str, lookup: Callable[[str], str | None], assign: Assign | None = None
) -> int:
    """The value of a bash arithmetic expression; ``lookup`` gives a variable's text (a name
    whose text is itself an expression is evaluated, as bash does), ``assign`` takes what an
    assignment sets.  ``ValueError`` names what is not plain arithmetic."""
    try:
        return _Reader(expression.strip(), lookup, 0, assign).whole()
    except RecursionError:
        raise BeyondReach(f"{quoted(expression.strip())} is nested too deeply") from None


def _evaluate(expression: str, lookup: Callable[[str], str | None], depth: int) -> int:
    """A variable's text as an expression (no assignment: bash's values are read, not run)."""
    if depth > MAX_VARIABLE_DEPTH:
        raise BeyondReach("variables refer to each other too deeply")
    return _Reader(expression.strip(), lookup, depth, None).whole()


_ASSIGNMENTS = frozenset({"=", "+=", "-=", "*=", "/=", "%=", "<<=", ">>=", "&=", "^=", "|="})


def _wrap(value: int) -> int:
    """``value`` as bash's signed 64-bit integers hold it."""
    return (value + _BITS // 2) % _BITS - _BITS // 2


@lru_cache(maxsize=4096)
def _tokens(text: str) -> tuple[str, ...]:
    """The expression's tokens; ``++``/``--`` only where bash reads an increment (next to a
    name), elsewhere two signs (``--1`` is 1), as bash's tokenizer decides."""
    tokens: list[str] = []
    position = 0
    while position < len(text):
        match = _TOKEN.match(text, position)
        if match is None:
            if text[position:].strip(" \t\n"):
                raise ValueError(f"{quoted(text)} is not arithmetic this reader evaluates")
            break
        token = match[match.lastgroup or "operator"]
        position = match.end()
        if token in ("++", "--"):
            after_name = bool(tokens) and _is_name(tokens[-1])
            before_name = _is_name(text[position:].lstrip(" \t\n")[:1])
            if not (after_name or before_name):
                token, position = token[0], position - 1
        tokens.append(token)
    return tuple(tokens)


def _is_name(token: str) -> bool:
    return token[:1].isascii() and (token[:1].isalpha() or token[:1] == "_")


class _Reader:
    """One expression, read and computed at once as bash's evaluator does: a side that a
    ``&&``, ``||`` or ``?:`` skips is read with ``live`` False (names 0, no division error)."""

    def __init__(
        self, text: str, lookup: Callable[[str], str | None], depth: int, assign: Assign | None
    ) -> None:
        self.text, self.lookup, self.depth, self.assign = text, lookup, depth, assign
        self.tokens = _tokens(text)
        self.position = 0
        self.nesting = 0

    def error(self, problem: str = "is not arithmetic this reader evaluates") -> ValueError:
        return ValueError(f"{quoted(self.text)} {problem}")

    def peek(self) -> str:
        return self.tokens[self.position] if self.position < len(self.tokens) else ""

    def take(self) -> str:
        token = self.peek()
        self.position += 1
        return token

    @contextmanager
    def nested(self) -> Iterator[None]:
        self.nesting += 1
        if self.nesting > MAX_NESTING:
            raise BeyondReach(f"{quoted(self.text)} is nested too deeply")
        yield
        self.nesting -= 1

    def whole(self) -> int:
        if not self.tokens:
            return 0  # $(( )) is 0, as in bash
        value = self.comma(live=True)
        if self.position < len(self.tokens):
            raise self.error()
        return value

    def comma(self, live: bool) -> int:
        value = self.assignment(live)
        while self.peek() == ",":
            self.take()
            value = self.assignment(live)
        return value

    def assignment(self, live: bool) -> int:
        """``NAME op= value`` (right-associative, below ``?:``), else a conditional."""
        following = self.tokens[self.position + 1] if self.position + 1 < len(self.tokens) else ""
        if not (_is_name(self.peek()) and following in _ASSIGNMENTS):
            return self.conditional(live)
        name, operator = self.take(), self.take()
        with self.nested():
            value = self.assignment(live)
        if operator != "=":
            value = self.apply(operator[:-1], self.variable(name, live), value, live)
        return self.store(name, value, live)

    def variable(self, name: str, live: bool) -> int:
        if not live:
            return 0
        return _evaluate(self.lookup(name) or "0", self.lookup, self.depth + 1)

    def store(self, name: str, value: int, live: bool) -> int:
        if live:
            if self.assign is None:
                raise self.error(f"assigns {name}, which only a running shell does here")
            self.assign(name, value)
        return value

    def conditional(self, live: bool) -> int:
        condition = self.binary(1, live)
        if self.peek() != "?":
            return condition
        self.take()
        with self.nested():
            chosen = self.comma(live and condition != 0)
            if self.take() != ":":
                raise self.error()
            other = self.conditional(live and condition == 0)
        return chosen if condition else other

    def binary(self, lowest: int, live: bool) -> int:
        left = self.unary(live)
        while (operator := self.peek()) in _PRECEDENCE and _PRECEDENCE[operator] >= lowest:
            self.take()
            skipped = (operator == "&&" and not left) or (operator == "||" and left)
            runs = live and not skipped
            precedence = _PRECEDENCE[operator]
            right = self.binary(precedence + (operator != "**"), runs)
            left = self.apply(operator, left, right, runs)
        return left

    def apply(self, operator: str, left: int, right: int, live: bool) -> int:
        if operator in ("/", "%"):
            if right == 0:
                if live:
                    raise self.error("divides by zero")
                return 0
            quotient = abs(left) // abs(right) * (1 if (left >= 0) == (right >= 0) else -1)
            return _wrap(quotient if operator == "/" else left - right * quotient)
        if operator == "**":
            if right < 0:
                raise self.error("has a negative exponent (exponent out of range)")
            return _wrap(pow(left, right, _BITS))
        return _wrap(_OPERATIONS[operator](left, right))

    def unary(self, live: bool) -> int:
        token = self.take()
        if token in ("++", "--") and _is_name(self.peek()):
            name = self.take()
            return self.store(
                name, _wrap(self.variable(name, live) + (1 if token == "++" else -1)), live
            )
        if token in _UNARY:
            with self.nested():
                return _wrap(_UNARY[token](self.unary(live)))
        if token == "(":
            with self.nested():
                value = self.comma(live)
            if self.take() != ")":
                raise self.error()
            return value
        if token[:1].isdigit():
            return _number(token, self.text)
        if _is_name(token):
            value = self.variable(token, live)
            if self.peek() in ("++", "--"):
                self.store(token, _wrap(value + (1 if self.take() == "++" else -1)), live)
            return value
        raise self.error()


def _number(token: str, text: str) -> int:
    """A bash integer constant: decimal, ``0x`` hex, ``0`` octal or ``BASE#DIGITS`` (bases 2 to
    64: ``0-9a-zA-Z@_``), wrapped to 64 bits as bash's are."""
    base, digits = 10, token
    if token[:2] in ("0x", "0X"):
        base, digits = 16, token[2:]
    elif token.startswith("0"):
        base, digits = 8, token[1:]
    if "#" in digits:
        prefix, _, digits = digits.partition("#")
        if base != 10 or not prefix.isdigit() or not 2 <= int(prefix) <= 64 or not digits:
            raise ValueError(f"{quoted(text)}: {quoted(token)} is not a number bash reads")
        base = int(prefix)
    value = 0
    for char in digits:
        digit = _digit(char, base)
        if digit is None or digit >= base:
            raise ValueError(f"{quoted(text)}: {quoted(token)} is not a number bash reads")
        value = (value * base + digit) % _BITS
    return _wrap(value)


def _digit(char: str, base: int) -> int | None:
    if char.isdigit():
        return int(char)
    if "a" <= char <= "z":
        return ord(char) - ord("a") + 10
    if "A" <= char <= "Z":
        return ord(char) - ord("A") + (10 if base <= 36 else 36)
    return {"@": 62, "_": 63}.get(char)


# printf: a specifier's flags, width, precision and conversion, as C's printf (and bash's).
_SPECIFIER = re.compile(r"%([-+ 0]*)(\d*)(?:\.(\d*))?([sdiuxX%])")
_INTEGER = re.compile(r"[ \t\n]*([-+]?)(?:0[xX]([0-9a-fA-F]+)|(0[0-7]*)|([1-9][0-9]*))")


def printf(template: str, arguments: list[str]) -> str:
    """``printf -v NAME template arguments``: ``%s``, ``%d``/``%i``, ``%u``, ``%x``/``%X`` and
    ``%%``, with C's flags (``-+ 0``), width and precision, and the format's backslash escapes;
    the template is reused while arguments remain, as bash reuses it."""
    pieces = _pieces(template)
    consumes = any(isinstance(p, re.Match) and p[4] != "%" for p in pieces)
    pending = list(arguments)
    out: list[str] = []
    size = 0
    while True:
        for piece in pieces:
            text = piece if isinstance(piece, str) else _format(piece, pending)
            out.append(text)
            size += len(text)
            if size > MAX_PRINTF_CHARS:
                raise ValueError("printf output is too long")
        if not pending or not consumes:
            return "".join(out).partition("\0")[0]  # a variable ends at a NUL, as bash's do


def _pieces(template: str) -> list[str | re.Match[str]]:
    """The format as literal text (its escapes decoded) and specifiers, read left to right as
    bash reads it."""
    pieces: list[str | re.Match[str]] = []
    literal: list[str] = []
    position = 0
    while position < len(template):
        char = template[position]
        if char == "%":
            match = _SPECIFIER.match(template, position)
            if match is None:
                raise ValueError(
                    f"printf format {quoted(template)} uses a specifier this reader does not know"
                )
            pieces += [as_argv("".join(literal)), match]
            literal, position = [], match.end()
        elif char == "\\":
            text, position = backslash_escape(template, position, ansi_c=False)
            literal.append(text)
        else:
            literal.append(char)
            position += 1
    return [*pieces, as_argv("".join(literal))]


def _format(match: re.Match[str], pending: list[str]) -> str:
    flags, width, precision, kind = match[1], match[2], match[3], match[4]
    if kind == "%":
        return "%"
    if max(int(width or 0), int(precision or 0)) > MAX_PRINTF_CHARS:
        raise ValueError("printf width is too large")
    argument = pending.pop(0) if pending else ""
    dot = "" if precision is None else f".{precision}"
    if kind == "s":
        return f"%{flags}{width}{dot}s" % argument
    value = _integer(argument, kind)
    if kind in "uxX":
        flags = flags.replace("+", "").replace(" ", "")  # C: signs are for signed numbers
    if precision is not None:
        flags = flags.replace("0", "")  # C pads with zeros up to the precision, not the width
        if value == 0 and not int(precision or 0):  # C prints no digit, only a sign flag
            sign = "+" if "+" in flags else " " if " " in flags else ""
            return f"%{'-' if '-' in flags else ''}{width}s" % sign
    return f"%{flags}{width}{dot}{'d' if kind in 'diu' else kind}" % value


def _integer(argument: str, kind: str) -> int:
    """An argument of ``%d`` (or ``%u``, ``%x``) as bash's printf reads it: an integer constant
    in C's notation, an empty one 0, ``'C`` the character's code; unsigned ones modulo 2**64."""
    if argument[:1] in ("'", '"'):
        if argument[1:2].isascii():
            return ord(argument[1]) if argument[1:] else 0
        raise ValueError(f"printf %{kind} got {quoted(argument)}, not an integer")
    match = _INTEGER.fullmatch(argument)
    if argument and match is None:
        raise ValueError(f"printf %{kind} got {quoted(argument)}, not an integer")
    value = 0
    if match is not None:
        hexadecimal, octal, decimal = match[2], match[3], match[4]
        magnitude = (
            int(hexadecimal, 16) if hexadecimal else int(octal, 8) if octal else int(decimal)
        )
        value = -magnitude if match[1] == "-" else magnitude
    if kind in "di":
        if not -_BITS // 2 <= value < _BITS // 2:
            raise ValueError(f"printf %{kind} got {quoted(argument)}, not an integer of 64 bits")
        return value
    if abs(value) >= _BITS:
        raise ValueError(f"printf %{kind} got {quoted(argument)}, not an integer of 64 bits")
    return value % _BITS
