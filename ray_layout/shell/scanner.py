"""What the readers the lexer hands a construct to (``heredocs``, ``parameters``) need of it: its
place in the text, its token list, and a word or parts read from there.  A protocol, so that they
depend on this and the lexer on them, never both ways."""

from __future__ import annotations

from typing import Protocol

from ray_layout.shell.refusal import ShellError
from ray_layout.shell.tokens import Part, Token, Word


class Scanner(Protocol):
    """The lexer as a reader of one construct sees it (``ray_layout.shell.lexer.Lexer``)."""

    text: str
    pos: int
    line: int
    tokens: list[Token]
    pending_heredocs: list[tuple[str, bool, bool]]  # (delimiter, <<-, quoted)

    def error(self, message: str, line: int | None = None) -> ShellError: ...

    def peek(self, ahead: int = 0) -> str: ...

    def advance(self, count: int = 1) -> str: ...

    def word(self, *, inside_array: bool) -> Word: ...

    def parts(
        self, *, stop: frozenset[str] | str, quoted: bool, depth: int, singles: bool = True
    ) -> list[Part]: ...
