"""A cursor over the lexer's tokens, with the one-line errors bash's parser would give: what
the grammar (``ray_layout.shell.parse``) reads the script with."""

from __future__ import annotations

from ray_layout.shell.refusal import ShellError
from ray_layout.shell.tokens import Operator, Token, Word


def shown(token: Token) -> str:
    if isinstance(token, Operator):
        return "end of line" if token.text == "\n" else f"'{token.text}'"
    if isinstance(token, Word):
        return f"'{token.plain if token.plain is not None else 'word'}'"
    return "array"


def line_of(token: Token) -> int:
    return token.line


class Cursor:
    def __init__(self, tokens: list[Token], source: str) -> None:
        self.tokens, self.source, self.position = tokens, source, 0

    def error(self, message: str, line: int | None = None) -> ShellError:
        if line is None:
            here = self.peek() or (self.tokens[-1] if self.tokens else None)
            line = line_of(here) if here is not None else 1
        return ShellError(f"{self.source}:{line}: {message}")

    def peek(self, ahead: int = 0) -> Token | None:
        index = self.position + ahead
        return self.tokens[index] if index < len(self.tokens) else None

    def take(self) -> Token:
        token = self.tokens[self.position]
        self.position += 1
        return token

    def at_operator(self, *texts: str) -> bool:
        token = self.peek()
        return isinstance(token, Operator) and token.text in texts

    def at_word(self, *words: str) -> bool:
        token = self.peek()
        return isinstance(token, Word) and token.plain in words

    def expect_word(self, word: str, opened: str, line: int) -> None:
        if self.peek() is None:
            raise self.error(f"'{opened}' is never closed by '{word}'", line)
        if not self.at_word(word):
            found = shown(self.peek())  # type: ignore[arg-type]
            raise self.error(f"'{opened}' (line {line}) needs '{word}', found {found}")
        self.take()

    def skip_newlines(self) -> None:
        while self.at_operator("\n"):
            self.take()
