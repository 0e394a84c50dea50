"""The values a script's variables hold while the reader runs it: text with each character's
place in the script, arrays, what the reader cannot know (*unresolved*, with why), and *holes*
(a value it lacks inside text it otherwise knows).  Word splitting and joining live here, as
the operations every value goes through."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Protocol

MAX_VALUE_CHARS = 1_000_000  # a launch line's value is kilobytes: doubling ends here
MAX_ELEMENTS = 100_000


class Failed(Exception):
    """An expansion bash fails on: ``${X:?message}`` of an unset X stops the script
    (``stops``), an arithmetic error discards the rest of its line."""

    def __init__(self, message: str, *, stops: bool) -> None:
        super().__init__(message)
        self.message, self.stops = message, stops


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


class Variables(Protocol):
    """What expansions read and assign: the interpreter's scopes (positional parameters by
    their names ``1``, ``#``, ``@``), or a plain dict.  ``substitute``, where present, runs a
    command substitution made of builtins."""

    def get(self, name: str, /) -> Value | None: ...

    def __setitem__(self, name: str, value: Value, /) -> None: ...


@dataclass(frozen=True)
class ExpandedWord:
    """One word of a command as bash would pass it; ``unresolved`` says why its text is not
    what the job will see (then ``text`` is the word as written)."""

    text: str
    line: int
    offsets: tuple[int, ...]
    unresolved: str | None = None
    missing: tuple[str, ...] = ()  # unset variables that expanded to nothing inside the word
    vanishes: bool = False  # an unset variable alone: bash passes no word (kept, for a value)

    @property
    def unknown(self) -> str | None:
        """Why the job may see other text than ``text``, if it may: a value this reader does
        not have, or a variable nothing set (here it expanded to nothing)."""
        if self.unresolved or not self.missing:
            return self.unresolved
        return missing_reason(self.missing)


# A hole: a value the reader lacks inside text it otherwise knows (``"torchrun $(date) ..."``),
# held as one opaque piece of a word, marked by characters no script holds, so that the text
# around it can still be split, eval'ed and read; any word it lands in is unresolved.
_HOLE = re.compile("\x01([0-9]+)\x02")


_HOLES: list[tuple[str, str]] = []  # (as written, why unknown); emptied by reset_holes


def hole(written: str, reason: str) -> Text:
    _HOLES.append((written, reason))
    marker = f"\x01{len(_HOLES) - 1}\x02"
    return Text(marker, (-1,) * len(marker), (), reason)


def hole_reason(text: str) -> str | None:
    found = _HOLE.search(text)
    return _HOLES[int(found[1])][1] if found and int(found[1]) < len(_HOLES) else None


def readable(text: str) -> str:
    """The text with each hole as it was written (``$(date)``)."""
    return _HOLE.sub(lambda m: _HOLES[int(m[1])][0] if int(m[1]) < len(_HOLES) else "?", text)


def named_holes(text: Text, name: str, line: int) -> Text:
    """``text`` assigned to ``name``: each hole's reason names the variable, for the user to
    give it (``--env NAME=VALUE``); every other character keeps its place in the script."""
    pieces, offsets, done = [], [], 0
    for found in _HOLE.finditer(text.text):
        written, reason = _HOLES[int(found[1])]
        if "give --env" not in reason:
            reason = f"${name} (line {line}) holds {reason}; give --env {name}=VALUE"
        marker = hole(written, reason).text
        pieces += [text.text[done : found.start()], marker]
        offsets += [*text.offsets[done : found.start()], *(-1,) * len(marker)]
        done = found.end()
    pieces.append(text.text[done:])
    offsets += text.offsets[done:]
    changed = "".join(pieces)
    return Text(changed, tuple(offsets), text.missing, hole_reason(changed))


def reset_holes() -> None:
    _HOLES.clear()


EMPTY = Text("", ())


def missing_reason(missing: tuple[str, ...]) -> str:
    """Why a value built from unset variables is not the job's for sure: the first, and the
    others it depends on."""
    also = ", ".join(f"${name}" for name in missing[1:])
    return not_set(missing[0]) + (f", and on {also}" if also else "")


def not_set(name: str) -> str:
    """Why a value that uses ``name`` is not known here, and how the user gives it."""
    if name.isdigit() or name in ("@", "*", "#"):
        return f"${name}, the script's own arguments (give them after --)"
    return f"${name}, which the script does not set (give --env {name}=VALUE)"


def same(one: Value | None, other: Value | None) -> bool:
    """Whether two outcomes leave a variable with the same text (where it was written aside)."""
    if isinstance(one, Text) and isinstance(other, Text):
        return one.text == other.text and bool(one.missing) == bool(other.missing)
    if isinstance(one, tuple) and isinstance(other, tuple):
        return len(one) == len(other) and all(map(same, one, other))
    return one == other


def unknown(value: Value | None) -> bool:
    """Whether the reader lacks the value, or a piece of it."""
    return isinstance(value, Unresolved) or (
        isinstance(value, Text) and value.unresolved is not None
    )


def missing_of(value: Value) -> tuple[str, ...]:
    if isinstance(value, Text):
        return value.missing
    if isinstance(value, tuple):
        return tuple(name for text in value for name in text.missing)
    return ()


def split(text: Text, ifs: str = " \t\n") -> list[Text]:
    """Bash's word splitting on ``ifs``: runs of its blanks separate words; each of its other
    characters ends a word (``a,,b`` under ``IFS=,`` is three); a value this reader does not
    know stays one word."""
    if text.unresolved and "\x01" not in text.text:
        return [text]
    blanks = {c for c in ifs if c in " \t\n"}
    others = set(ifs) - blanks
    pieces: list[Text] = []
    start: int | None = None
    value = text.text
    position = 0
    while position <= len(value):
        char = value[position] if position < len(value) else None
        if char is None or char in blanks or char in others:
            if start is not None or (char in others):
                begin = position if start is None else start
                piece = value[begin:position]
                reason = hole_reason(piece) if text.unresolved else None
                pieces.append(Text(piece, text.offsets[begin:position], text.missing, reason))
                start = None
            if char in blanks:
                while position + 1 < len(value) and value[position + 1] in blanks:
                    position += 1
                if position + 1 < len(value) and value[position + 1] in others:
                    position += 1
        elif start is None:
            start = position
        position += 1
    return pieces


def join(items: list[Text], separator: str = " ") -> Text:
    joined = EMPTY
    for position, item in enumerate(items):
        joined = joined + (Text.of(separator) if position else Text("", ())) + item
    return joined


@dataclass(frozen=True)
class Gap(Text):
    """An index of an array that holds nothing (``A[5]=x`` on two elements, ``unset 'A[1]'``):
    bash's arrays are sparse; here the gap keeps the indices after it."""


GAP = Gap("", ())


def present(items: tuple[Text, ...]) -> tuple[Text, ...]:
    """An array's elements as ``"${A[@]}"`` gives them: its gaps left out."""
    return tuple(item for item in items if not isinstance(item, Gap))


def elements(value: Value) -> tuple[Text, ...]:
    if isinstance(value, tuple):
        return present(value)
    if isinstance(value, Text):
        return (value,) if value.text else ()
    return ()


def note_unset(variables: Variables, name: str) -> None:
    """Tell the interpreter (``set -u`` stops there) that a plain reference found ``name``
    unset."""
    note = getattr(variables, "unset", None)
    if note is not None and not name.isdigit() and name not in ("@", "*", "#"):
        note(name)


def ifs_of(variables: Variables) -> str:
    value = variables.get("IFS")
    return value.text if isinstance(value, Text) else " \t\n"
