"""The tree bash's grammar builds from a script: simple commands, pipelines, ``&&``/``||``
lists, groups, subshells, ``if``, loops, ``case``, functions, ``(( ))`` and ``[[ ]]``.
``ray_layout.shell.parse`` builds it; ``ray_layout.shell.interpreter`` runs it."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ray_layout.shell.tokens import ArrayLiteral, Heredoc, Literal, Operator, Token, Word


@dataclass(frozen=True)
class Simple:
    """A simple command: ``NAME=value`` prefixes, then its words (redirections left out)."""

    assignments: tuple[Word | ArrayLiteral, ...]
    words: tuple[Word | ArrayLiteral, ...]  # an array only as a declaration's argument
    line: int
    heredoc: Heredoc | None = None  # its standard input, where a here-document gives it
    herestring: Word | None = None  # its standard input, where ``<<< word`` gives it


@dataclass(frozen=True)
class Pipeline:
    commands: tuple[Node, ...]
    negate: bool
    line: int


@dataclass(frozen=True)
class AndOr:
    first: Node
    rest: tuple[tuple[str, Node], ...]  # ("&&" or "||", pipeline)


@dataclass(frozen=True)
class Commands:
    """A list of commands; ``background`` marks those ended by ``&`` (run in a subshell)."""

    items: tuple[tuple[Node, bool], ...]


@dataclass(frozen=True)
class Group:
    body: Commands


@dataclass(frozen=True)
class Subshell:
    body: Commands
    line: int


@dataclass(frozen=True)
class If:
    clauses: tuple[tuple[Commands, Commands], ...]  # (condition, body)
    otherwise: Commands | None
    line: int


@dataclass(frozen=True)
class For:
    name: str
    words: tuple[Word, ...] | None  # None: ``for x; do`` walks "$@"
    body: Commands
    line: int


@dataclass(frozen=True)
class ArithmeticFor:
    start: str
    condition: str
    step: str
    body: Commands
    line: int


@dataclass(frozen=True)
class While:
    condition: Commands
    body: Commands
    until: bool
    line: int


@dataclass(frozen=True)
class Case:
    word: Word
    items: tuple[tuple[tuple[Word, ...], Commands], ...]
    line: int


@dataclass(frozen=True)
class FunctionDefinition:
    name: str
    body: Node
    line: int


@dataclass(frozen=True)
class Arithmetic:
    """``(( expression ))``."""

    text: str
    line: int


@dataclass(frozen=True)
class Conditional:
    """``[[ ... ]]``: its tokens, operators included (``&&`` inside is the test's own)."""

    tokens: tuple[Word | Operator, ...]
    line: int


Node = (
    Simple
    | Pipeline
    | AndOr
    | Commands
    | Group
    | Subshell
    | If
    | For
    | ArithmeticFor
    | While
    | Case
    | FunctionDefinition
    | Arithmetic
    | Conditional
)


DECLARATIONS = frozenset({"export", "declare", "typeset", "local", "readonly"})


_ASSIGNMENT = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(\[[^\]]*\])?(\+?)=")


def assignment_target(token: Token) -> tuple[str, str | None, bool] | None:
    """(name, index text or None, ``+=``) of an assignment word or array literal, else None."""
    if isinstance(token, ArrayLiteral):
        return token.name, None, token.append
    if not isinstance(token, Word) or not token.parts:
        return None
    written = _leading_source(token)
    match = _ASSIGNMENT.match(written)
    if match is None:
        return None
    index = match[2][1:-1] if match[2] else None
    return match[1], index, bool(match[3])


def assignment_value(token: Word) -> Word:
    """The word after ``NAME=`` (or ``NAME[i]+=``) of an assignment word."""
    length = _ASSIGNMENT.match(_leading_source(token)).end()  # type: ignore[union-attr]
    rest, seen = [], 0
    for part in token.parts:
        written = part.text if isinstance(part, Literal) else part.source
        if seen >= length:
            rest.append(part)
        elif seen + len(written) > length:
            assert isinstance(part, Literal)
            cut = length - seen
            rest.append(Literal(part.text[cut:], part.offsets[cut:], part.quoted))
        seen += len(written)
    return Word(tuple(rest), token.line, token.start, token.end)


def _leading_source(token: Word) -> str:
    """The word as written up to its first quoted part: where ``NAME[index]=`` must be."""
    written = []
    for part in token.parts:
        if isinstance(part, Literal) and part.quoted:
            break
        written.append(part.text if isinstance(part, Literal) else part.source)
    return "".join(written)
