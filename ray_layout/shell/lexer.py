"""The words of a bash script, as bash's lexer cuts them: quotes, escapes, comments, line
continuations, operators, heredocs, array literals and the expansions inside words.

Nothing is expanded here: the tokens (``ray_layout.shell.tokens``) keep each part as
written.  ``ray_layout.shell.parse`` builds the commands from them.
"""

from __future__ import annotations

import re
from functools import lru_cache

from ray_layout.errors import quoted
from ray_layout.shell import heredocs, parameters
from ray_layout.shell.escapes import as_argv, backslash_escape
from ray_layout.shell.refusal import ShellError
from ray_layout.shell.tokens import (
    SPECIAL_PARAMETERS,
    ArrayLiteral,
    Literal,
    Operator,
    Part,
    Reference,
    Substitution,
    Token,
    Word,
)

MAX_SCRIPT_CHARS = 4_000_000  # a launch script is kilobytes; a 4 MB one is not a script
MAX_NESTING = 64  # ${...} inside ${...}, $(...) inside $(...)

# Operators, each before any that is its prefix (the longest one matches).
_OPERATORS = (
    *("&>>", "&&", "||", ";;", "<<-", "<<<", "<<", ">>", ">&", ">|", "<>", "&>", "<&", "|&"),
    *(";", "&", "|", "(", ")", "<", ">"),
)
_METACHARACTERS = frozenset(" \t\n;&|()<>")


class Lexer:
    def __init__(self, text: str, source: str, depth: int = 0) -> None:
        self.text, self.source, self.depth = text, source, depth  # depth: inside $( ... )
        self.pos, self.line = 0, 1
        self.pending_heredocs: list[tuple[str, bool, bool]] = []  # (delimiter, <<-, quoted)
        self.tokens: list[Token] = []

    def error(self, message: str, line: int | None = None) -> ShellError:
        return ShellError(f"{self.source}:{line or self.line}: {message}")

    def peek(self, ahead: int = 0) -> str:
        index = self.pos + ahead
        return self.text[index] if index < len(self.text) else ""

    def advance(self, count: int = 1) -> str:
        taken = self.text[self.pos : self.pos + count]
        self.line += taken.count("\n")
        self.pos += count
        return taken

    def run(self, substitution_line: int | None = None) -> list[Token]:
        """The tokens up to the end of the text or, inside a ``$(`` opened on
        ``substitution_line``, up to (and past) the ``)`` that closes it."""
        parentheses = 0
        while self.pos < len(self.text):
            char = self.peek()
            if char in " \t":
                self.advance()
            elif char == "\\" and self.peek(1) == "\n":
                self.advance(2)  # a line continuation between words
            elif char == "#":
                while self.peek() not in ("", "\n"):
                    self.advance()
            elif char == "\n":
                line, start = self.line, self.pos
                self.advance()
                heredocs.read_bodies(self)  # their tokens come before the line's end
                self.tokens.append(Operator("\n", line, start))
            elif self.at_process_substitution():
                self.tokens.append(self.word_or_array())
            elif (operator := self.operator()) is not None:
                if substitution_line is not None and operator == ")" and not parentheses:
                    self.advance()
                    self.end_heredocs()
                    return self.tokens
                parentheses += (operator == "(") - (operator == ")")
                self.tokens.append(Operator(operator, self.line, self.pos))
                self.advance(len(operator))
                if operator in ("<<", "<<-"):
                    heredocs.delimiter(self, strip_tabs=operator == "<<-")
            else:
                self.word_or_descriptor()
        if substitution_line is not None:
            raise self.error("a '$(' is never closed", substitution_line)
        heredocs.read_bodies(self)
        self.end_heredocs()
        return self.tokens

    def end_heredocs(self) -> None:
        if self.pending_heredocs:
            raise self.error(f"here-document {quoted(self.pending_heredocs[0][0])} is never ended")

    def word_or_descriptor(self) -> None:
        """A word, or the file descriptor of a redirection written right before it (``2>``):
        bash's IO number, which is no word of the command (``1000 > log`` is a word)."""
        token = self.word_or_array()
        descriptor = isinstance(token, Word) and (token.plain or "").isdigit()
        if not (descriptor and token.plain.isascii() and self.peek() in ("<", ">")):  # type: ignore[union-attr]
            self.tokens.append(token)

    def at_process_substitution(self) -> bool:
        """``<(command)`` or ``>(command)``: a word (a file name only a running shell has)."""
        return self.peek() in ("<", ">") and self.peek(1) == "("

    def operator(self) -> str | None:
        return next((op for op in _OPERATORS if self.text.startswith(op, self.pos)), None)

    def word_or_array(self) -> Word | ArrayLiteral:
        start_line = self.line
        word = self.word(inside_array=False)
        prefix = word.unquoted_prefix
        if len(word.parts) == 1 and prefix.endswith("=") and self.peek() == "(":
            name, append = prefix[:-1].removesuffix("+"), prefix.endswith("+=")
            if name.isidentifier() and name.isascii():
                self.advance()
                return ArrayLiteral(name, append, self.array_words(start_line), start_line)
        return word

    def array_words(self, start_line: int) -> tuple[Word, ...]:
        words: list[Word] = []
        while True:
            char = self.peek()
            if char == "":
                raise self.error("an array's '(' is never closed", start_line)
            if char in " \t\n":
                self.advance()
            elif char == "\\" and self.peek(1) == "\n":
                self.advance(2)
            elif char == "#":
                while self.peek() not in ("", "\n"):
                    self.advance()
            elif char == ")":
                self.advance()
                return tuple(words)
            else:
                words.append(self.word(inside_array=True))

    def word(self, *, inside_array: bool) -> Word:
        start, line = self.pos, self.line
        parts = self.parts(stop=_METACHARACTERS, quoted=False, depth=self.depth)
        if not parts:
            raise self.error(f"unexpected {self.peek()!r}")
        return Word(tuple(parts), line, start, self.pos)

    def parts(
        self, *, stop: frozenset[str] | str, quoted: bool, depth: int, singles: bool = True
    ) -> list[Part]:
        """Parts up to (not including) a character in ``stop`` outside quotes; ``singles``:
        whether a single quote quotes (in ``"${X:-'a b'}"`` it is a character)."""
        if depth > MAX_NESTING:
            raise self.error("expansions nested too deeply")
        parts: list[Part] = []
        text: list[str] = []
        offsets: list[int] = []

        def flush(is_quoted: bool) -> None:
            if text:
                parts.append(Literal("".join(text), tuple(offsets), is_quoted))
                text.clear()
                offsets.clear()

        plain = _plain_run(stop, quoted)
        while (char := self.peek()) != "" and (
            char not in stop or (not quoted and self.at_process_substitution())
        ):
            run = plain.match(self.text, self.pos)
            if run is not None:  # characters that are only themselves, taken at once
                taken = run.group()
                text.append(taken)
                offsets.extend(range(self.pos, self.pos + len(taken)))
                self.advance(len(taken))
                continue
            if char == "\\":
                following = self.peek(1)
                if following == "\n":
                    self.advance(2)
                    continue
                if quoted and following not in '$`"\\':
                    text.append(char)
                    offsets.append(self.pos)
                    self.advance()
                    continue
                flush(quoted)
                if following:
                    parts.append(Literal(following, (self.pos + 1,), True))
                self.advance(2)
            elif char == "'" and not quoted and singles:
                flush(quoted)
                parts.append(self.single_quoted())
            elif char == "$" and self.peek(1) == '"' and not quoted:
                self.advance()  # $"...": a string for translation, read as "..."
            elif char == "$" and self.peek(1) == "'" and not quoted:
                flush(quoted)
                parts.append(self.ansi_c_quoted())
            elif char == '"' and not quoted:
                flush(quoted)
                line = self.line
                self.advance()
                inner = self.parts(stop='"', quoted=True, depth=depth + 1)
                parts += inner or [Literal("", (), True)]  # "" is a word of its own
                if self.peek() != '"':
                    raise self.error("a quotation is never closed", line)
                self.advance()
            elif not quoted and self.at_process_substitution():
                flush(quoted)
                parts.append(self.process_substitution(depth))
            elif char == "$" and (expansion := self.expansion(quoted, depth)) is not None:
                flush(quoted)
                parts.append(expansion)
            elif char == "`":
                flush(quoted)
                parts.append(self.backquoted(quoted))
            else:
                text.append(char)
                offsets.append(self.pos)
                self.advance()
        flush(quoted)
        return parts

    def single_quoted(self) -> Literal:
        line = self.line
        self.advance()
        end = self.text.find("'", self.pos)
        if end < 0:
            raise self.error("a quotation is never closed", line)
        offsets = tuple(range(self.pos, end))
        literal = Literal(self.text[self.pos : end], offsets, True)
        self.advance(end - self.pos + 1)
        return literal

    def ansi_c_quoted(self) -> Literal:
        """``$'...'``: quoted text whose backslash escapes bash decodes (``\\t``, ``\\'``,
        ``\\x41``...), once its end is found (a backslash hides the character after it); a
        decoded character has no offset of its own (-1), and a NUL ends the text, as in bash."""
        line = self.line
        self.advance(2)
        start = self.pos
        while (char := self.peek()) != "'":
            if char == "":
                raise self.error("a quotation is never closed", line)
            self.advance(2 if char == "\\" else 1)
        inside = self.text[start : self.pos]
        self.advance()
        text: list[str] = []
        offsets: list[int] = []
        escaped: list[str] = []  # a run of escapes, whose bytes may form one character

        def end_escapes() -> None:
            run = as_argv("".join(escaped))
            text.append(run)
            offsets.extend([-1] * len(run))
            escaped.clear()

        position = 0
        while position < len(inside):
            if inside[position] == "\\":
                decoded, position = backslash_escape(inside, position, ansi_c=True)
                escaped.append(decoded)
            else:
                end_escapes()
                text.append(inside[position])
                offsets.append(start + position)
                position += 1
        end_escapes()
        kept = "".join(text).partition("\0")[0]
        return Literal(kept, tuple(offsets[: len(kept)]), True)

    def process_substitution(self, depth: int) -> Substitution:
        """``<(command)`` or ``>(command)``: a file name only a running shell has."""
        start, line = self.pos, self.line
        self.advance(2)
        self.skip_command(line, depth)
        source = self.text[start : self.pos]
        return Substitution("process", source[2:-1], False, source)

    def skip_command(self, line: int, depth: int) -> None:
        """Past the ``)`` that closes a ``$(`` (or ``<(``) opened on ``line``: the command inside
        is read as bash reads it (quotes, comments, here-documents, parentheses of its own), its
        tokens left out."""
        inner = Lexer(self.text, self.source, depth + 1)
        inner.pos, inner.line = self.pos, self.line
        inner.run(substitution_line=line)
        self.pos, self.line = inner.pos, inner.line

    def backquoted(self, quoted: bool) -> Substitution:
        start, line = self.pos, self.line
        self.advance()
        while self.peek() not in ("`", ""):
            self.advance(2 if self.peek() == "\\" else 1)
        if self.peek() != "`":
            raise self.error("a backquoted command is never closed", line)
        self.advance()
        source = self.text[start : self.pos]
        body = re.sub(r"\\([$`\\])", r"\1", source[1:-1])  # \` \$ \\ stand for themselves
        return Substitution("command", body, quoted, source)

    def expansion(self, quoted: bool, depth: int) -> Part | None:
        """The expansion at a ``$``, or None where the ``$`` is a plain character."""
        start, following = self.pos, self.peek(1)
        if following == "[":  # $[ expression ]: bash's old arithmetic
            close = self.text.find("]", self.pos)
            if close < 0:
                raise self.error("a '$[' is never closed")
            self.advance(close + 1 - self.pos)
            return Substitution(
                "arithmetic", self.text[start + 2 : close], quoted, self.text[start : self.pos]
            )
        if following == "(":
            arithmetic = self.peek(2) == "("
            self.advance(3 if arithmetic else 2)
            body_start = self.pos
            if arithmetic:
                self.skip_arithmetic()
            else:
                self.skip_command(self.line, depth)
            body = self.text[body_start : self.pos - 1 - arithmetic]
            kind = "arithmetic" if arithmetic else "command"
            return Substitution(kind, body, quoted, self.text[start : self.pos])
        if following == "{":
            return parameters.braced(self, quoted, depth)
        if following in SPECIAL_PARAMETERS:
            self.advance(2)
            return Reference(following, None, None, (), quoted, self.text[start : self.pos])
        if following.isascii() and (following.isalpha() or following == "_"):
            self.advance()
            name_start = self.pos
            while self.peek().isascii() and (self.peek().isalnum() or self.peek() == "_"):
                self.advance()
            name = self.text[name_start : self.pos]
            return Reference(name, None, None, (), quoted, self.text[start : self.pos])
        return None

    def skip_arithmetic(self) -> None:
        """Past the ``))`` that ends a ``$((``, over nested parentheses and quotes."""
        depth, line = 0, self.line
        while True:
            char = self.peek()
            if char == "":
                raise self.error("a '$((' is never closed", line)
            if char == "\\":
                self.advance(2)
            elif char in "'\"":
                end = self.text.find(char, self.pos + 1)
                if end < 0:
                    raise self.error("a quotation is never closed", line)
                self.advance(end - self.pos + 1)
            elif char == "(":
                depth += 1
                self.advance()
            elif char == ")" and depth:
                depth -= 1
                self.advance()
            elif self.text.startswith("))", self.pos):
                self.advance(2)
                return
            else:
                self.advance()


@lru_cache(maxsize=64)
def _plain_run(stop: frozenset[str] | str, quoted: bool) -> re.Pattern[str]:
    """A run of characters that stand for themselves where ``parts`` reads: no quote, escape,
    expansion, redirection (a ``<(`` starts a word of its own) or character of ``stop``."""
    special = set(stop) | set("\\$`") | (set() if quoted else set("'\"<>"))
    return re.compile("[^" + re.escape("".join(sorted(special))) + "]+")


def tokenize(text: str, source: str) -> list[Token]:
    """The script's tokens; a :class:`ShellError` naming the line where a quote, a
    substitution or a here-document is never closed."""
    if len(text) > MAX_SCRIPT_CHARS:
        raise ShellError(
            f"{source}: {len(text):,} characters, more than a launch script's {MAX_SCRIPT_CHARS:,}"
        )
    try:
        return Lexer(text, source).run()
    except RecursionError:
        raise ShellError(f"{source}: expansions nested too deeply") from None
