"""Bash's expansions over the words of a script: parameters (``$NAME``, ``${NAME:-word}``,
``${A[@]}``, ``${#A}``), ``$((arithmetic))``, word splitting and quotes, as bash passes words to a
command.  What only a running shell knows (a command substitution, ``$$``) is *unresolved*, with
the reason; a variable nothing set expands to nothing, and is remembered as *missing* for where
its value matters."""

from __future__ import annotations

from dataclasses import dataclass

from ray_layout.errors import clipped
from ray_layout.shell.arithmetic import evaluate_arithmetic
from ray_layout.shell.tokens import Literal, Part, Reference, Substitution, Word


@dataclass(frozen=True)
class Unresolved:
    """A value this reader cannot know, and why (with the line that made it so)."""

    reason: str


@dataclass(frozen=True)
class Text:
    """An expanded string; each character's offset in the script, or -1 where it did not come
    from the script's own text (an ``--env`` value, arithmetic)."""

    text: str
    offsets: tuple[int, ...]
    missing: tuple[str, ...] = ()  # variables it used that nothing set: they expanded to ""
    unresolved: str | None = None  # an array element this reader cannot know: why

    def __add__(self, other: Text) -> Text:
        missing = self.missing + tuple(m for m in other.missing if m not in self.missing)
        return Text(
            self.text + other.text,
            self.offsets + other.offsets,
            missing,
            self.unresolved or other.unresolved,
        )

    @staticmethod
    def of(text: str) -> Text:
        return Text(text, (-1,) * len(text))


Value = Text | tuple[Text, ...] | Unresolved


@dataclass(frozen=True)
class ExpandedWord:
    """One word of a command as bash would pass it; ``unresolved`` says why its text is not
    what the job will see (then ``text`` is the word as written)."""

    text: str
    line: int
    offsets: tuple[int, ...]
    unresolved: str | None = None
    missing: tuple[str, ...] = ()  # unset variables that expanded to nothing inside the word

    @property
    def unknown(self) -> str | None:
        """Why the job may see other text than ``text``, if it may: a value this reader does
        not have, or a variable nothing set (here it expanded to nothing)."""
        return self.unresolved or (not_set(self.missing[0]) if self.missing else None)


def expand(token: Word, variables: dict[str, Value]) -> list[ExpandedWord]:
    """A word as bash passes it: unquoted expansions split on blanks, ``"${A[@]}"`` one word
    per element, an unquoted expansion to nothing no word at all.  A word with a value this
    reader does not have is one word, as written, with the reason."""
    fields = _Fields()
    try:
        fields.add(token.parts, variables, expanded=False)
    except _Unknown as unknown:
        return [_placeholder(token, str(unknown))]
    words = fields.finish()
    if not words and fields.missing:  # `--nnodes $NNODES`: a value the job's environment gives
        return [_placeholder(token, not_set(fields.missing[0]))]
    return [ExpandedWord(f.text, token.line, f.offsets, f.unresolved, f.missing) for f in words]


class _Fields:
    """The words one word of the script becomes, built as bash builds them: ``current`` is None
    until something (a character, a quoted empty string) starts a word.  An unset variable that
    expands to nothing stays named on the word it was in (``--nnodes=$NN``), for where its
    value matters."""

    def __init__(self) -> None:
        self.done: list[Text] = []
        self.current: Text | None = None
        self.missing: tuple[str, ...] = ()  # every unset variable the word used
        self.pending: tuple[str, ...] = ()  # those that expanded to nothing between words
        self.characters = False  # the expansion so far gave characters (blanks too)
        self.null = False  # a quoted part of it gave nothing: bash's had_quoted_null

    def add(self, parts: tuple[Part, ...], variables: dict[str, Value], *, expanded: bool) -> None:
        """``parts`` in order; ``expanded``: they are a default's word (``${U:-a 'b c'}``),
        whose unquoted text is split as any expansion's result is, and its quoted text not."""
        for part in parts:
            if isinstance(part, Literal):
                text = Text(part.text, part.offsets)
                if expanded and not part.quoted:
                    self.split_in(text, split(text))
                else:
                    self.join(text)
                    self.null |= not text.text
            elif isinstance(part, Reference) and not part.quoted and takes_word(part, variables):
                if part.operator in (":=", "="):  # assigned, then split whole as bash does
                    self.value(part, reference(part, variables))
                else:
                    self.word_of(part, variables)
            else:
                self.value(part, part_value(part, variables))

    def word_of(self, part: Reference, variables: dict[str, Value]) -> None:
        """A default's or alternative's word, expanded on its own as bash does.  One that gives
        no characters but a quoted null (``${V:+""}``, ``${U:-"$E"}``) keeps that null, which
        starts a word, only if no quoted part before it in the word gave nothing: bash drops it
        after one (``""$V${V:+""}`` is one word where ``V=' '``; ``x$V${V:+""}`` two).  One
        that gives characters and a quoted null (``${V:+""x}``) counts as such a part."""
        null, characters, before = self.null, self.characters, self.current
        self.null = self.characters = False
        self.add(part.argument, variables, expanded=True)
        if self.characters:
            self.null |= null
        else:
            if null and self.current is not before:  # drop the null, keep what was missing
                missing = self.current.missing if self.current is not None else ()
                if before is None:
                    self.current, self.pending = None, missing
                else:
                    self.current = before + Text("", (), missing)
            self.null = null
        self.characters |= characters

    def value(self, part: Part, value: Value) -> None:
        if isinstance(value, Unresolved):
            raise _Unknown(value.reason)
        self.missing += tuple(n for n in _missing(value) if n not in self.missing)
        each_element = isinstance(part, Reference) and part.quoted and part.index == "@"
        if isinstance(value, tuple) and each_element:
            for position, element in enumerate(value):
                if position:
                    self.end()
                    self.characters = True  # bash separates the elements by a blank
                self.join(element)
            self.null |= len(value) == 1 and not value[0].text
            return
        text = _join(list(value)) if isinstance(value, tuple) else value
        if part.quoted:
            self.join(text)
            self.null |= not text.text
            return
        elements = value if isinstance(value, tuple) else (value,)
        self.split_in(text, [piece for element in elements for piece in split(element)])

    def split_in(self, text: Text, pieces: list[Text]) -> None:
        """An unquoted result: blanks end words, its pieces join the words around them."""
        self.characters |= bool(text.text)
        if text.text[:1].isspace():
            self.end()
        for position, piece in enumerate(pieces):
            if position:
                self.end()
            self.join(piece)
        if text.text[-1:].isspace():
            self.end()
        if not pieces and text.missing:
            if self.current is None:
                self.pending += text.missing
            else:
                self.current += Text("", (), text.missing)

    def join(self, text: Text) -> None:
        self.characters |= bool(text.text)
        start = self.current if self.current is not None else Text("", (), self.pending)
        self.current, self.pending = start + text, ()

    def end(self) -> None:
        if self.current is not None:
            self.done.append(self.current)
            self.current = None

    def finish(self) -> list[Text]:
        self.end()
        if self.pending and self.done:
            self.done[-1] += Text("", (), self.pending)
        return self.done


class _Unknown(Exception):
    """A part of the word whose value this reader does not have (the reason)."""


def expand_whole(token: Word, variables: dict[str, Value]) -> ExpandedWord:
    """A word where bash does not split (an assignment's value, a ``NAME=`` prefix)."""
    text = Text("", ())
    for part in token.parts:
        value = part if isinstance(part, Literal) else part_value(part, variables)
        if isinstance(value, Unresolved):
            return ExpandedWord(self_text(token), token.line, (), value.reason)
        if isinstance(value, Literal):
            text += Text(value.text, value.offsets)
        elif isinstance(value, tuple):
            text += _join(list(value))
        else:
            text += value
    return ExpandedWord(text.text, token.line, text.offsets, None, text.missing)


def part_value(part: Part, variables: dict[str, Value]) -> Value:
    if isinstance(part, Substitution):
        if part.kind == "arithmetic":
            return arithmetic(part, variables)
        return Unresolved(
            f"{clipped(part.source)} (a {part.kind} substitution, which needs a real shell)"
        )
    assert isinstance(part, Reference)
    return reference(part, variables)


def arithmetic(part: Substitution, variables: dict[str, Value]) -> Value:
    def lookup(name: str) -> str | None:
        value = variables.get(name)
        if isinstance(value, Text) and not value.missing:
            return value.text
        if value is None or isinstance(value, Text):
            raise _Unknown(not_set(name if value is None else value.missing[0]))
        raise _Unknown(value.reason if isinstance(value, Unresolved) else f"array {name}")

    try:
        expression = expand_whole(_literal_word(part.text), variables)
        if expression.unresolved or expression.missing:
            return Unresolved(expression.unresolved or not_set(expression.missing[0]))
        return Text.of(str(evaluate_arithmetic(expression.text, lookup)))
    except _Unknown as exc:
        return Unresolved(f"{clipped(part.source)} uses {exc}")
    except ValueError as exc:
        return Unresolved(f"{clipped(part.source)}: {exc}")


def reference(part: Reference, variables: dict[str, Value]) -> Value:
    name, operator = part.name, part.operator
    if operator == "unsupported":
        return Unresolved(f"{clipped(part.source)} (an expansion this reader does not evaluate)")
    if name in _SHELL_ONLY:
        return Unresolved(f"{clipped(part.source)} (a value only a running shell has)")
    if operator == "#":
        whole = variables.get(name)
        if isinstance(whole, Unresolved):
            return whole
        count = len(whole) if isinstance(whole, tuple) else len(whole.text) if whole else 0
        return Text.of(str(count))
    if takes_word(part, variables):
        word = expand_whole(Word(part.argument, 0, 0, 0), variables)
        if word.unresolved:
            return Unresolved(word.unresolved)
        result = Text(word.text, word.offsets, word.missing)
        if operator in (":=", "="):
            variables[name] = result
        return result
    value = _value_of(part, variables)
    if isinstance(value, Unresolved):
        return value
    if operator in (":+", "+"):
        return _EMPTY
    if value is None:  # as in bash, nothing; remembered, for where the value matters
        return Text("", (), (name,))
    return value


_SHELL_ONLY = ("?", "$", "!", "-")
_WORD_OPERATORS = (":-", "-", ":=", "=", ":+", "+")


def takes_word(part: Reference, variables: dict[str, Value]) -> bool:
    """Whether ``${NAME:-word}`` (or ``-``, ``:=``, ``=``, ``:+``, ``+``) expands to its word:
    a default for a variable unset (or empty, with ``:``), an alternative for one set."""
    if part.operator not in _WORD_OPERATORS or part.name in _SHELL_ONLY:
        return False
    value = _value_of(part, variables)
    if isinstance(value, Unresolved):
        return False
    absent = value is None
    if part.operator.startswith(":"):
        absent = absent or value == () or (isinstance(value, Text) and not value.text)
    return absent != part.operator.endswith("+")


def _value_of(part: Reference, variables: dict[str, Value]) -> Value | None:
    """What the reference names (an array's element for ``${A[1]}``); None: nothing set it."""
    value = variables.get(part.name)
    if isinstance(value, tuple) and part.index not in ("@", "*"):
        position = int(part.index) if (part.index or "0").isdigit() else -1
        return value[position] if 0 <= position < len(value) else None
    return value


_EMPTY = Text("", ())


def not_set(name: str) -> str:
    """Why a value that uses ``name`` is not known here, and how the user gives it."""
    if name.isdigit() or name in ("@", "*", "#"):
        return f"${name}, the script's own argument (give --env {name}=VALUE)"
    return f"${name}, which the script does not set (give --env {name}=VALUE)"


def same(one: Value | None, other: Value | None) -> bool:
    """Whether two outcomes leave a variable with the same text (where it was written aside)."""
    if isinstance(one, Text) and isinstance(other, Text):
        return one.text == other.text and bool(one.missing) == bool(other.missing)
    if isinstance(one, tuple) and isinstance(other, tuple):
        return len(one) == len(other) and all(map(same, one, other))
    return one == other


def _missing(value: Value) -> tuple[str, ...]:
    if isinstance(value, Text):
        return value.missing
    if isinstance(value, tuple):
        return tuple(name for text in value for name in text.missing)
    return ()


def _placeholder(token: Word, reason: str) -> ExpandedWord:
    """A word whose value this reader does not have: the word as written, and why; only its
    first character's offset is kept (for its line), so no rewrite ever touches it."""
    text = self_text(token)
    return ExpandedWord(text, token.line, (token.start,) + (-1,) * (len(text) - 1), reason)


def self_text(token: Word) -> str:
    """The word as written in the script."""
    return "".join(_source_of(part) for part in token.parts)


def _source_of(part: Part) -> str:
    if isinstance(part, Literal):
        return part.text
    return part.source


def _literal_word(text: str) -> Word:
    """An arithmetic body as one word, so that its ``$NAME`` references expand."""
    from ray_layout.shell.lexer import tokenize as _tokenize

    words = [t for t in _tokenize(f'"{text}"', "arithmetic") if isinstance(t, Word)]
    return words[0] if words else Word((), 0, 0, 0)


def split(text: Text) -> list[Text]:
    """Bash's word splitting on blanks (the default IFS); a value this reader does not know stays
    one word."""
    if text.unresolved:
        return [text]
    pieces, start = [], None
    for position, char in enumerate(text.text + " "):
        if char in " \t\n":
            if start is not None:
                piece = Text(text.text[start:position], text.offsets[start:position], text.missing)
                pieces.append(piece)
                start = None
        elif start is None:
            start = position
    return pieces


def _join(items: list[Text]) -> Text:
    joined = _EMPTY
    for position, item in enumerate(items):
        joined = joined + (Text.of(" ") if position else Text("", ())) + item
    return joined


def elements(value: Value) -> tuple[Text, ...]:
    if isinstance(value, tuple):
        return value
    if isinstance(value, Text):
        return (value,) if value.text else ()
    return ()
