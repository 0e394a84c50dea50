"""What bash's lexer hands on (``ray_layout.shell.lexer`` cuts them): words made of parts
(literal text, a ``$NAME``/``${...}`` reference, a substitution), array literals, operators and
here-document bodies.  Each literal character keeps its offset in the script, so that a rewrite
(``--write-script``) can change exactly the characters a value came from.
"""

from __future__ import annotations

from dataclasses import dataclass

# $@ $* $# $? $$ $! $- and $0-$9: the names a $ takes one character of
SPECIAL_PARAMETERS = frozenset("@*#?$!-0123456789")


@dataclass(frozen=True)
class Literal:
    """Text as written; ``quoted`` text is never split into words."""

    text: str
    offsets: tuple[int, ...]  # each character's offset in the script
    quoted: bool


@dataclass(frozen=True)
class Reference:
    """``$NAME``, ``${NAME}``, ``${NAME[@]}``, ``${NAME:-word}``, ``${#NAME}``, ...

    ``operator`` is the expansion's operator (``:-``, ``-``, ``:=``, ``:+``, ...; ``#`` for a
    length; ``#p``, ``##``, ``%p``, ``%%``, ``/``, ``//``, ``/#``, ``/%`` for patterns; ``:`` for a
    slice; ``^``, ``^^``, ``,``, ``,,`` for case; ``!`` for indirection; ``unsupported`` for a
    form this reader does not evaluate), ``argument`` its word.
    """

    name: str
    index: str | None  # "@", "*", a number, or None
    operator: str | None
    argument: tuple[Part, ...]
    quoted: bool
    source: str  # the reference as written, for messages
    replacement: tuple[Part, ...] | None = None  # ``${NAME/pattern/replacement}``'s second word


@dataclass(frozen=True)
class Substitution:
    """``$(command)``, a backquoted command, ``<(command)``, or ``$((arithmetic))``."""

    kind: str  # "command", "process" (``<(...)``, ``>(...)``) or "arithmetic"
    text: str
    quoted: bool
    source: str


Part = Literal | Reference | Substitution


@dataclass(frozen=True)
class Word:
    parts: tuple[Part, ...]
    line: int
    start: int
    end: int

    @property
    def plain(self) -> str | None:
        """The word's text when it has no expansion and no quote at all (a reserved word, a
        name), else None."""
        if all(isinstance(p, Literal) and not p.quoted for p in self.parts):
            return "".join(p.text for p in self.parts)  # type: ignore[union-attr]
        return None

    @property
    def unquoted_prefix(self) -> str:
        """The leading unquoted literal text: where ``NAME=`` of an assignment must be."""
        first = self.parts[0] if self.parts else None
        return first.text if isinstance(first, Literal) and not first.quoted else ""


@dataclass(frozen=True)
class ArrayLiteral:
    """``NAME=( words )`` or ``NAME+=( words )``: the words between the parentheses."""

    name: str
    append: bool
    words: tuple[Word, ...]
    line: int


@dataclass(frozen=True)
class Operator:
    text: str  # one of _OPERATORS, or "\n" for the end of a line
    line: int
    start: int = -1  # its offset in the text (``((`` is two adjacent ``(``)


@dataclass(frozen=True)
class Heredoc:
    """A here-document's body: data for the command, never commands of the script."""

    delimiter: str
    body: str
    line: int
    quoted: bool = False  # a quoted delimiter: the body is not expanded


Token = Word | ArrayLiteral | Operator | Heredoc


def written(part: Part) -> str:
    """A part as the script wrote it."""
    return part.text if isinstance(part, Literal) else part.source


def written_word(token: Word) -> str:
    """The word as written in the script."""
    return "".join(written(part) for part in token.parts)
