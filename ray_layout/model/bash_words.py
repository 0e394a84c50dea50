"""The words of a bash script, as bash's lexer cuts them: quotes, escapes, comments, line
continuations, operators, heredocs, array literals and the expansions inside words.

Nothing is expanded here: a word is a list of parts (literal text, a ``$NAME``/``${...}``
reference, a ``$(...)`` or ``$((...))`` substitution), each literal character keeping its offset
in the script so that a rewrite (``--write-script``) can change exactly the characters a value
came from.  ``ray_layout.model.bash_script`` runs the words.
"""

from __future__ import annotations

from dataclasses import dataclass

from ray_layout.errors import ConfigError

MAX_SCRIPT_CHARS = 4_000_000  # a launch script is kilobytes; a 4 MB one is not a script
MAX_NESTING = 64  # ${...} inside ${...}, $(...) inside $(...)

_OPERATORS = ("&&", "||", ";;", "<<-", "<<<", "<<", ">>", ">&", "&>", "<&", "|&", ";", "&", "|",
              "(", ")", "<", ">")  # fmt: skip
_METACHARACTERS = frozenset(" \t\n;&|()<>")
_SPECIAL_PARAMETERS = frozenset("@*#?$!-0123456789")


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
    length, ``unsupported`` for a form this reader does not evaluate), ``argument`` its word.
    """

    name: str
    index: str | None  # "@", "*", a number, or None
    operator: str | None
    argument: tuple[Part, ...]
    quoted: bool
    source: str  # the reference as written, for messages


@dataclass(frozen=True)
class Substitution:
    """``$(command)``, a backquoted command, or ``$((arithmetic))``."""

    kind: str  # "command" or "arithmetic"
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


@dataclass(frozen=True)
class Heredoc:
    """A here-document's body: data for the command, never commands of the script."""

    delimiter: str
    body: str
    line: int


Token = Word | ArrayLiteral | Operator | Heredoc


class _Lexer:
    def __init__(self, text: str, source: str) -> None:
        self.text, self.source = text, source
        self.pos, self.line = 0, 1
        self.pending_heredocs: list[tuple[str, bool]] = []  # (delimiter, strip tabs)
        self.tokens: list[Token] = []

    def error(self, message: str, line: int | None = None) -> ConfigError:
        return ConfigError(f"{self.source}:{line or self.line}: {message}")

    def peek(self, ahead: int = 0) -> str:
        index = self.pos + ahead
        return self.text[index] if index < len(self.text) else ""

    def advance(self, count: int = 1) -> str:
        taken = self.text[self.pos : self.pos + count]
        self.line += taken.count("\n")
        self.pos += count
        return taken

    def run(self) -> list[Token]:
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
                self.tokens.append(Operator("\n", self.line))
                self.advance()
                self.read_heredoc_bodies()
            elif (operator := self.operator()) is not None:
                self.tokens.append(Operator(operator, self.line))
                self.advance(len(operator))
                if operator in ("<<", "<<-"):
                    self.heredoc_delimiter(strip_tabs=operator == "<<-")
            else:
                self.tokens.append(self.word_or_array())
        self.read_heredoc_bodies()
        if self.pending_heredocs:
            raise self.error(f"here-document {self.pending_heredocs[0][0]!r} is never ended")
        return self.tokens

    def operator(self) -> str | None:
        return next((op for op in _OPERATORS if self.text.startswith(op, self.pos)), None)

    def heredoc_delimiter(self, *, strip_tabs: bool) -> None:
        while self.peek() in (" ", "\t"):
            self.advance()
        if self.peek() in ("", "\n"):
            raise self.error("a here-document needs a delimiter word after <<")
        word = self.word(inside_array=False)
        delimiter = "".join(p.text for p in word.parts if isinstance(p, Literal))
        if not delimiter:
            raise self.error("a here-document's delimiter must be a plain word")
        self.pending_heredocs.append((delimiter, strip_tabs))

    def read_heredoc_bodies(self) -> None:
        """The body of each here-document opened on the line just ended: the lines up to its
        delimiter alone on a line (tabs stripped for ``<<-``)."""
        while self.pending_heredocs:
            delimiter, strip_tabs = self.pending_heredocs.pop(0)
            start_line, body = self.line, []
            while True:
                if self.pos >= len(self.text):
                    raise self.error(f"here-document {delimiter!r} is never ended", start_line)
                end = self.text.find("\n", self.pos)
                end = len(self.text) if end < 0 else end
                line = self.text[self.pos : end]
                self.advance(end - self.pos + (end < len(self.text)))
                if (line.lstrip("\t") if strip_tabs else line) == delimiter:
                    break
                body.append(line)
            self.tokens.append(Heredoc(delimiter, "\n".join(body), start_line))

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
        parts = self.parts(stop=_METACHARACTERS, quoted=False, depth=0)
        if not parts:
            raise self.error(f"unexpected {self.peek()!r}")
        return Word(tuple(parts), line, start, self.pos)

    def parts(self, *, stop: frozenset[str] | str, quoted: bool, depth: int) -> list[Part]:
        """Parts up to (not including) a character in ``stop`` outside quotes."""
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

        while (char := self.peek()) != "" and char not in stop:
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
            elif char == "'" and not quoted:
                flush(quoted)
                parts.append(self.single_quoted())
            elif char == "$" and self.peek(1) == "'" and not quoted:
                flush(quoted)
                self.advance()
                parts.append(self.single_quoted())
            elif char == '"' and not quoted:
                flush(quoted)
                self.advance()
                inner = self.parts(stop='"', quoted=True, depth=depth + 1)
                parts += inner or [Literal("", (), True)]  # "" is a word of its own
                if self.peek() != '"':
                    raise self.error("a quotation is never closed")
                self.advance()
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

    def backquoted(self, quoted: bool) -> Substitution:
        start, line = self.pos, self.line
        self.advance()
        while self.peek() not in ("`", ""):
            self.advance(2 if self.peek() == "\\" else 1)
        if self.peek() != "`":
            raise self.error("a backquoted command is never closed", line)
        self.advance()
        source = self.text[start : self.pos]
        return Substitution("command", source[1:-1], quoted, source)

    def expansion(self, quoted: bool, depth: int) -> Part | None:
        """The expansion at a ``$``, or None where the ``$`` is a plain character."""
        start, following = self.pos, self.peek(1)
        if following == "(":
            arithmetic = self.peek(2) == "("
            self.advance(3 if arithmetic else 2)
            body_start = self.pos
            self.skip_balanced(")" * (1 + arithmetic))
            body = self.text[body_start : self.pos - 1 - arithmetic]
            kind = "arithmetic" if arithmetic else "command"
            return Substitution(kind, body, quoted, self.text[start : self.pos])
        if following == "{":
            return self.braced(quoted, depth)
        if following in _SPECIAL_PARAMETERS:
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

    def skip_balanced(self, closing: str) -> None:
        """Past the ``closing`` that ends a ``$(`` or ``$((``, over nested parentheses and
        quotes."""
        depth, line = 0, self.line
        while True:
            char = self.peek()
            if char == "":
                raise self.error("a '$(' is never closed", line)
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
            elif self.text.startswith(closing, self.pos):
                self.advance(len(closing))
                return
            else:
                self.advance()

    def braced(self, quoted: bool, depth: int) -> Reference:
        start, line = self.pos, self.line
        self.advance(2)
        length = self.peek() == "#" and self.peek(1) not in ("}", "")
        indirect = self.peek() == "!"
        self.advance(length or indirect)
        name_start = self.pos
        if self.peek() in _SPECIAL_PARAMETERS:
            self.advance()
        else:
            while self.peek().isascii() and (self.peek().isalnum() or self.peek() == "_"):
                self.advance()
        name = self.text[name_start : self.pos]
        index = None
        if self.peek() == "[":
            close = self.text.find("]", self.pos)
            if close < 0:
                raise self.error("a '${NAME[' is never closed", line)
            index = self.text[self.pos + 1 : close]
            self.advance(close - self.pos + 1)
        operator = next((op for op in (":-", ":=", ":+", ":?", "-", "=", "+", "?")
                         if self.text.startswith(op, self.pos)), None)  # fmt: skip
        argument: list[Part] = []
        if operator is not None:
            self.advance(len(operator))
            argument = self.parts(stop="}", quoted=quoted, depth=depth + 1)
        elif self.peek() != "}":
            operator = "unsupported"
            self.skip_to_brace(line)
        if self.peek() != "}":
            raise self.error("a '${' is never closed", line)
        self.advance()
        if length:
            operator = "#"
        if indirect or not name:
            operator = "unsupported"
        return Reference(
            name, index, operator, tuple(argument), quoted, self.text[start : self.pos]
        )

    def skip_to_brace(self, line: int) -> None:
        depth = 0
        while (char := self.peek()) != "" and (char != "}" or depth):
            depth += (char == "{") - (char == "}")
            self.advance()
        if char == "":
            raise self.error("a '${' is never closed", line)


def tokenize(text: str, source: str) -> list[Token]:
    """The script's tokens; a :class:`ConfigError` naming the line where a quote, a
    substitution or a here-document is never closed."""
    if len(text) > MAX_SCRIPT_CHARS:
        raise ConfigError(f"{source}: {len(text):,} characters, more than a launch script's "
                          f"{MAX_SCRIPT_CHARS:,}")  # fmt: skip
    try:
        return _Lexer(text, source).run()
    except RecursionError:
        raise ConfigError(f"{source}: expansions nested too deeply") from None
