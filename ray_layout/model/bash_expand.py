"""Bash's expansions over the words of a script: parameters (``$NAME``, ``${NAME:-word}``,
``${A[@]}``, ``${#A}``), ``$((arithmetic))``, word splitting and quotes, as bash passes words to a
command.  What only a running shell knows (a command substitution, ``$$``) is *unresolved*, with
the reason; a variable nothing set expands to nothing, and is remembered as *missing* for where
its value matters."""

from __future__ import annotations

from dataclasses import dataclass

from ray_layout.model.bash_arithmetic import evaluate_arithmetic
from ray_layout.model.bash_words import Literal, Part, Reference, Substitution, Word


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
        return Text(self.text + other.text, self.offsets + other.offsets, missing,
                    self.unresolved or other.unresolved)  # fmt: skip

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


def expand(token: Word, variables: dict[str, Value]) -> list[ExpandedWord]:
    """A word as bash passes it: unquoted expansions split on blanks, ``"${A[@]}"`` one word
    per element, an unquoted expansion to nothing no word at all.  A word with a value this
    reader does not have is one word, as written, with the reason."""
    fields: list[Text] = []
    current: Text | None = None  # None: no word started yet
    missing: tuple[str, ...] = ()
    for part in token.parts:
        if isinstance(part, Literal):
            current = (current or _EMPTY) + Text(part.text, part.offsets)
            continue
        value = part_value(part, variables)
        if isinstance(value, Unresolved):
            return [_placeholder(token, value.reason)]
        missing += tuple(name for name in _missing(value) if name not in missing)
        quoted = part.quoted
        if isinstance(value, tuple) and quoted and part.index == "@":
            for position, element in enumerate(value):
                if position:
                    fields.append(current or _EMPTY)
                    current = None
                current = (current or _EMPTY) + element
            continue
        text = _join(list(value)) if isinstance(value, tuple) else value
        if quoted:
            current = (current or _EMPTY) + text
            continue
        elements = value if isinstance(value, tuple) else (value,)
        pieces = [piece for element in elements for piece in split(element)]
        if text.text[:1].isspace() and current is not None:
            fields.append(current)
            current = None
        for position, piece in enumerate(pieces):
            if position:
                fields.append(current or _EMPTY)
                current = None
            current = (current or _EMPTY) + piece
        if text.text[-1:].isspace() and current is not None:
            fields.append(current)
            current = None
    if current is not None:
        fields.append(current)
    if not fields and missing:  # `--nnodes $NNODES`: a value the job's environment gives
        return [_placeholder(token, not_set(missing[0]))]
    return [ExpandedWord(f.text, token.line, f.offsets, f.unresolved, f.missing) for f in fields]


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
        return Unresolved(f"{part.source} (a command substitution, which needs a real shell)")
    assert isinstance(part, Reference)
    return reference(part, variables)


def arithmetic(part: Substitution, variables: dict[str, Value]) -> Value:
    def lookup(name: str) -> str | None:
        value = variables.get(name)
        if isinstance(value, Text) and not value.missing:
            return value.text
        if value is None or isinstance(value, Text):
            raise _NotPlain(not_set(name if value is None else value.missing[0]))
        raise _NotPlain(value.reason if isinstance(value, Unresolved) else f"array {name}")

    try:
        expression = expand_whole(_literal_word(part.text), variables)
        if expression.unresolved or expression.missing:
            return Unresolved(expression.unresolved or not_set(expression.missing[0]))
        return Text.of(str(evaluate_arithmetic(expression.text, lookup)))
    except _NotPlain as exc:
        return Unresolved(f"{part.source} uses {exc}")
    except ValueError as exc:
        return Unresolved(f"{part.source}: {exc}")


def reference(part: Reference, variables: dict[str, Value]) -> Value:
    name, operator = part.name, part.operator
    if operator == "unsupported":
        return Unresolved(f"{part.source} (an expansion this reader does not evaluate)")
    if name in ("?", "$", "!", "-"):
        return Unresolved(f"{part.source} (a value only a running shell has)")
    value = variables.get(name)
    if operator == "#":
        if isinstance(value, Unresolved):
            return value
        count = len(value) if isinstance(value, tuple) else len(value.text) if value else 0
        return Text.of(str(count))
    if isinstance(value, tuple) and part.index not in ("@", "*"):
        position = int(part.index) if (part.index or "0").isdigit() else -1
        value = value[position] if 0 <= position < len(value) else None
    is_set = value is not None
    empty = not is_set or (isinstance(value, Text) and not value.text) or value == ()
    if isinstance(value, Unresolved) and operator in (":-", "-", ":=", "=", ":+", "+"):
        return value
    if operator in (":-", "-", ":=", "=") and (empty if operator[0] == ":" else not is_set):
        default = expand_whole(Word(part.argument, 0, 0, 0), variables)
        if default.unresolved:
            return Unresolved(default.unresolved)
        result = Text(default.text, default.offsets)
        if operator in (":=", "="):
            variables[name] = result
        return result
    if operator in (":+", "+"):
        if not (empty if operator == ":+" else not is_set):
            alternative = expand_whole(Word(part.argument, 0, 0, 0), variables)
            if alternative.unresolved:
                return Unresolved(alternative.unresolved)
            return Text(alternative.text, alternative.offsets)
        return _EMPTY
    if value is None:  # as in bash, nothing; remembered, for where the value matters
        return Text("", (), (name,))
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


class _NotPlain(Exception):
    pass


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
    from ray_layout.model.bash_words import tokenize as _tokenize

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
