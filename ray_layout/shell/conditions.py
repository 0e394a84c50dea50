"""Bash's tests on values the reader has: ``test``/``[ ]`` (``!``, ``-a``, ``-o``, parentheses),
``[[ ]]`` (``&&``, ``||``, ``!``, patterns after ``==``/``!=``, ``=~``), and ``case`` patterns.
A test on a value the reader lacks, or on the file system, has no answer here: its reason is
returned instead, and the caller follows both outcomes."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ray_layout.errors import clipped
from ray_layout.shell.expand import expand_whole, pattern_of
from ray_layout.shell.tokens import Operator, Word
from ray_layout.shell.values import ExpandedWord, Unresolved, Variables

_NUMERIC = {
    "-eq": int.__eq__,
    "-ne": int.__ne__,
    "-lt": int.__lt__,
    "-le": int.__le__,
    "-gt": int.__gt__,
    "-ge": int.__ge__,
}
_FILE_TESTS = frozenset(
    [
        "-a",
        "-b",
        "-c",
        "-d",
        "-e",
        "-f",
        "-g",
        "-h",
        "-k",
        "-p",
        "-r",
        "-s",
        "-t",
        "-u",
        "-w",
        "-x",
        "-G",
        "-L",
        "-N",
        "-O",
        "-S",
    ]
)


@dataclass(frozen=True)
class NoAnswer:
    reason: str
    refused: bool = False  # bash's own test refuses it: its status is 2, a failure


Answer = bool | NoAnswer


def evaluate_test(operands: list[str]) -> Answer:
    """``test operands...`` on plain values, as bash's ``test`` reads them."""
    reader = _TestReader(operands)
    refused = NoAnswer(f"a test bash refuses ({clipped(' '.join(operands))})", refused=True)
    try:
        answer = reader.disjunction() if operands else False
    except _TooShort:
        return refused
    except _NotATest as exc:
        return NoAnswer(str(exc))
    return refused if reader.position != len(operands) else answer


class _NotATest(Exception):
    pass


class _TooShort(_NotATest):
    """A test whose operator lacks its operand: bash refuses it."""


class _TestReader:
    def __init__(self, operands: list[str]) -> None:
        self.operands, self.position = operands, 0

    def peek(self, ahead: int = 0) -> str | None:
        index = self.position + ahead
        return self.operands[index] if index < len(self.operands) else None

    def take(self) -> str:
        if self.position >= len(self.operands):
            raise _TooShort("a test that ends too early")
        self.position += 1
        return self.operands[self.position - 1]

    def disjunction(self) -> Answer:
        answer = self.conjunction()
        while self.peek() == "-o":
            self.take()
            answer = _or(answer, self.conjunction())
        return answer

    def conjunction(self) -> Answer:
        answer = self.negation()
        while self.peek() == "-a" and self.peek(1) is not None:
            self.take()
            answer = _and(answer, self.negation())
        return answer

    def negation(self) -> Answer:
        remaining = len(self.operands) - self.position
        if self.peek() == "!" and remaining > 1 and self.peek(1) not in ("=", "!="):
            self.take()
            return _not(self.negation())
        return self.primary()

    def primary(self) -> Answer:
        first = self.take()
        following = self.peek()
        if following is not None and (following in _NUMERIC or following in ("=", "==", "!=")):
            self.take()
            return binary(first, following, self.take())
        if first == "(" and self.peek(1) == ")":
            inner = self.disjunction()
            self.take()
            return inner
        if first in ("-z", "-n") and following is not None:
            return (self.take() == "") == (first == "-z")
        if first in _FILE_TESTS and following is not None:
            return NoAnswer(f"a test on the file system ({first} {clipped(self.take())})")
        if first == "-v" and following is not None:
            raise _NotATest(f"-v {clipped(self.take())}")
        return first != ""


def binary(left: str, operator: str, right: str) -> Answer:
    if operator in ("=", "=="):
        return left == right
    if operator == "!=":
        return left != right
    try:
        return _NUMERIC[operator](int(left.strip()), int(right.strip()))
    except ValueError:
        return NoAnswer(f"{clipped(left)} {operator} {clipped(right)}: an integer expected")


def _not(answer: Answer) -> Answer:
    return answer if isinstance(answer, NoAnswer) else not answer


def _and(one: Answer, other: Answer) -> Answer:
    if one is False or other is False:
        return False
    return one if isinstance(one, NoAnswer) else other


def _or(one: Answer, other: Answer) -> Answer:
    if one is True or other is True:
        return True
    return one if isinstance(one, NoAnswer) else other


class DoubleBracket:
    """``[[ ... ]]`` over its tokens; ``missing`` collects unset variables it read."""

    def __init__(self, tokens: tuple[Word | Operator, ...], variables: Variables) -> None:
        self.tokens, self.variables, self.position = tokens, variables, 0
        self.missing: list[str] = []

    def evaluate(self) -> Answer:
        if not self.tokens:
            return NoAnswer("an empty [[ ]]")
        answer = self.disjunction()
        if self.position != len(self.tokens):
            return NoAnswer("a [[ ]] this reader does not read")
        return answer

    def peek(self, ahead: int = 0) -> Word | Operator | None:
        index = self.position + ahead
        return self.tokens[index] if index < len(self.tokens) else None

    def at(self, text: str, ahead: int = 0) -> bool:
        token = self.peek(ahead)
        if isinstance(token, Operator):
            return token.text == text
        return isinstance(token, Word) and token.plain == text

    def take(self) -> Word | Operator:
        token = self.peek()
        if token is None:
            raise _NotATest("a [[ ]] that ends too early")
        self.position += 1
        return token

    def disjunction(self) -> Answer:
        answer = self.conjunction()
        while self.at("||"):
            self.take()
            other = self.conjunction()
            answer = answer if answer is True else _or(answer, other)
        return answer

    def conjunction(self) -> Answer:
        answer = self.negation()
        while self.at("&&"):
            self.take()
            other = self.negation()
            answer = answer if answer is False else _and(answer, other)
        return answer

    def negation(self) -> Answer:
        if self.at("!"):
            self.take()
            return _not(self.negation())
        if self.at("("):
            self.take()
            answer = self.disjunction()
            if not self.at(")"):
                raise _NotATest("a '(' in [[ ]] is never closed")
            self.take()
            return answer
        return self.primary()

    def text(self, token: Word | Operator) -> str | NoAnswer:
        if isinstance(token, Operator):
            return token.text
        word = expand_whole(token, self.variables)
        if word.unresolved:
            return NoAnswer(f"a test on {word.unresolved}")
        self.missing += word.missing
        return word.text

    def primary(self) -> Answer:
        first = self.take()
        operator = self.peek()
        operator_text = (
            operator.text if isinstance(operator, Operator) else getattr(operator, "plain", None)
        )
        if operator_text in ("==", "=", "!=", "=~", "<", ">", *_NUMERIC):
            self.take()
            right = self.take()
            left = self.text(first)
            if isinstance(left, NoAnswer):
                return left
            return self.compare(left, operator_text, right)  # type: ignore[arg-type]
        unary = first.plain if isinstance(first, Word) else None
        if (
            unary in ("-z", "-n")
            and operator is not None
            and not self.at("&&")
            and not self.at("||")
        ):
            value = self.text(self.take())
            return value if isinstance(value, NoAnswer) else (value == "") == (unary == "-z")
        if unary in _FILE_TESTS and operator is not None and not self.at("&&"):
            shown = self.text(self.take())
            return NoAnswer(f"a test on the file system ({unary} {clipped(str(shown))})")
        if unary == "-v" and isinstance(operator, Word):
            name = self.text(self.take())
            if isinstance(name, NoAnswer):
                return name
            value = self.variables.get(name)
            if isinstance(value, Unresolved):
                return NoAnswer(f"-v {clipped(name)} on {value.reason}")
            return value is not None
        value = self.text(first)
        return value if isinstance(value, NoAnswer) else value != ""

    def compare(self, left: str, operator: str, right: Word | Operator) -> Answer:
        if operator in ("==", "=", "!="):
            pattern = pattern_of(right.parts, self.variables) if isinstance(right, Word) else None
            if isinstance(pattern, Unresolved):
                return NoAnswer(f"a test on {pattern.reason}")
            matched = (
                pattern.fullmatch(left) is not None if pattern is not None else left == right.text  # type: ignore[union-attr]
            )
            return matched != (operator == "!=")
        value = self.text(right)
        if isinstance(value, NoAnswer):
            return value
        if operator == "=~":
            try:
                return re.search(value, left) is not None
            except re.error:
                return NoAnswer(f"the pattern {clipped(value)}, which this reader does not read")
        if operator in ("<", ">"):
            return (left < value) if operator == "<" else (left > value)
        return binary(left, operator, value)


def case_matches(subject: ExpandedWord, pattern: Word, variables: Variables) -> Answer:
    """Whether ``case`` takes the item with ``pattern`` for ``subject``."""
    compiled = pattern_of(pattern.parts, variables)
    if isinstance(compiled, Unresolved):
        return NoAnswer(f"a case pattern on {compiled.reason}")
    return compiled.fullmatch(subject.text) is not None
