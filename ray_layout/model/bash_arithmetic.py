"""Bash's ``$((...))`` and ``printf`` on plain values, without a shell and without ``eval``.

Arithmetic is read over Python's syntax tree, which shares bash's precedence for the operators
kept here: integers, names, ``+ - * / % **``, unary ``- + !``, comparisons and parentheses, with
bash's integer division and remainder (truncated toward zero).  Sizes stay bounded, so a hostile
script cannot make the reader allocate.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable

MAX_MAGNITUDE = 2**63  # bash's integers are 64-bit
MAX_PRINTF_CHARS = 100_000

_BINARY = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
}
_COMPARE = {
    ast.Lt: int.__lt__, ast.LtE: int.__le__, ast.Gt: int.__gt__, ast.GtE: int.__ge__,
    ast.Eq: int.__eq__, ast.NotEq: int.__ne__,
}  # fmt: skip


def evaluate_arithmetic(expression: str, lookup: Callable[[str], str | None]) -> int:
    """The value of a bash arithmetic expression; ``lookup`` gives a variable's text (a name
    whose text is itself an expression is evaluated, as bash does).  ``ValueError`` names what
    is not plain arithmetic."""
    return _evaluate(expression, lookup, depth=0)


def _evaluate(expression: str, lookup: Callable[[str], str | None], depth: int) -> int:
    if depth > 8:
        raise ValueError("variables refer to each other too deeply")
    text = expression.strip().replace("&&", " and ").replace("||", " or ")
    text = re.sub(r"!(?!=)", " not ", text)
    if not text:
        return 0
    try:
        tree = ast.parse(text, mode="eval").body
    except (SyntaxError, ValueError):
        raise ValueError(
            f"{expression.strip()!r} is not arithmetic this reader evaluates"
        ) from None

    def value(node: ast.AST) -> int:
        result = operation(node)
        if abs(result) >= MAX_MAGNITUDE:
            raise ValueError(f"{expression.strip()!r} overflows 64 bits")
        return result

    def operation(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.Name):
            text = lookup(node.id)
            return _evaluate(text or "0", lookup, depth + 1)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd | ast.Not):
            operand = value(node.operand)
            if isinstance(node.op, ast.Not):
                return int(not operand)
            return -operand if isinstance(node.op, ast.USub) else operand
        if isinstance(node, ast.BinOp):
            left, right = value(node.left), value(node.right)
            if type(node.op) in _BINARY:
                return _BINARY[type(node.op)](left, right)
            if isinstance(node.op, ast.Div | ast.FloorDiv | ast.Mod):
                if right == 0:
                    raise ValueError(f"{expression.strip()!r} divides by zero")
                quotient = abs(left) // abs(right) * (1 if (left >= 0) == (right >= 0) else -1)
                return quotient if not isinstance(node.op, ast.Mod) else left - right * quotient
            if isinstance(node.op, ast.Pow):
                if right < 0 or (abs(left) > 1 and right > 63):
                    raise ValueError(f"{expression.strip()!r}: exponent out of range")
                return left**right
        if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _COMPARE:
            return int(_COMPARE[type(node.ops[0])](value(node.left), value(node.comparators[0])))
        if isinstance(node, ast.BoolOp):
            values = [value(v) for v in node.values]
            return int(all(values) if isinstance(node.op, ast.And) else any(values))
        if isinstance(node, ast.IfExp):
            return value(node.body) if value(node.test) else value(node.orelse)
        raise ValueError(f"{expression.strip()!r} is not arithmetic this reader evaluates")

    try:
        return value(tree)
    except RecursionError:
        raise ValueError(f"{expression.strip()!r} is nested too deeply") from None


_SPECIFIER = re.compile(r"%(-?\d*)([sdiu%])")


def printf(template: str, arguments: list[str]) -> str:
    """``printf -v NAME template arguments``: ``%s``, ``%d``/``%i``/``%u`` (with a width) and
    ``%%``; the template is reused while arguments remain, as bash reuses it."""
    if re.search(r"%(?!-?\d*[sdiu%])", template):
        raise ValueError(f"printf format {template!r} uses a specifier this reader does not know")
    consumes = sum(1 for m in _SPECIFIER.finditer(template) if m[2] != "%")
    pending = list(arguments)
    out: list[str] = []
    while True:
        out.append(_SPECIFIER.sub(lambda m: _format(m, pending), template))
        if sum(map(len, out)) > MAX_PRINTF_CHARS:
            raise ValueError("printf output is too long")
        if not pending or not consumes:
            return "".join(out).replace("\\n", "\n").replace("\\t", "\t")


def _format(match: re.Match[str], pending: list[str]) -> str:
    width, kind = match[1], match[2]
    if kind == "%":
        return "%"
    argument = pending.pop(0) if pending else ""
    if kind != "s":
        try:
            argument = str(int(argument or "0"))
        except ValueError:
            raise ValueError(f"printf %{kind} got {argument!r}, not an integer") from None
    if width:
        size = int(width)
        if abs(size) > MAX_PRINTF_CHARS:
            raise ValueError("printf width is too large")
        argument = argument.ljust(-size) if size < 0 else argument.rjust(size)
    return argument
