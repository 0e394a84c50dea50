"""Bash's brace expansion, the first of its expansions: ``a{b,c}d`` is ``abd acd``,
``{1..3}`` is ``1 2 3`` (``{01..10}`` padded, ``{1..9..2}`` stepped, ``{a..e}`` letters).  It
works on the word as written: quoted braces are characters, and a ``$NAME`` inside an
alternative (``{$A,b}``) goes along unexpanded.  A word that would grow past the bound is
refused."""

from __future__ import annotations

import itertools
import re

from ray_layout.shell.refusal import ShellError
from ray_layout.shell.tokens import Literal, Part, Reference, Word

MAX_WORDS = 100_000
Item = tuple[str, int, bool] | Part  # a character (text, offset, quoted), or a whole expansion
_SEQUENCE = re.compile(r"(-?\w+)\.\.(-?\w+)(?:\.\.(-?\d+))?")


def brace_words(word: Word) -> list[Word] | None:
    """The words ``word`` stands for after brace expansion (itself where it has none); None
    where bash would read the result anew differently (``{$V,w}post``: ``$Vpost``)."""
    if not any(isinstance(p, Literal) and not p.quoted and "{" in p.text for p in word.parts):
        return [word]
    alternatives = _expand(_items(word), word_start=True)
    if len(alternatives) == 1:
        return [word]
    if any(_joins_a_name(items) for items in alternatives):
        return None
    return [Word(_parts(items), word.line, word.start, word.end) for items in alternatives]


def _joins_a_name(items: list[Item]) -> bool:
    """A ``$NAME`` now followed by a name's character: bash would read a longer name."""
    for before, after in itertools.pairwise(items):
        bare = isinstance(before, Reference) and not before.source.startswith("${")
        if bare and isinstance(after, tuple) and (after[0].isalnum() or after[0] == "_"):
            return True
    return False


def _items(word: Word) -> list[Item]:
    items: list[Item] = []
    for part in word.parts:
        if isinstance(part, Literal):
            items += [(c, o, part.quoted) for c, o in zip(part.text, part.offsets, strict=False)]
        else:
            items.append(part)
    return items


def _is(item: Item, char: str) -> bool:
    return isinstance(item, tuple) and not item[2] and item[0] == char


def _expand(items: list[Item], word_start: bool = False) -> list[list[Item]]:
    for start, item in enumerate(items):
        if not _is(item, "{"):
            continue
        if word_start and start == 0 and len(items) > 1 and _is(items[1], "}"):
            continue  # "{}" opening a word stays itself, as in bash (find -exec {})
        close, commas = _close(items, start)
        if close is None:
            continue
        inner = items[start + 1 : close]
        if commas:
            bounds = [start, *commas, close]
            choices = [items[a + 1 : b] for a, b in itertools.pairwise(bounds)]
        else:
            choices = _sequence(inner)
            if choices is None:
                continue
        prefix, suffixes = items[:start], _expand(items[close + 1 :])
        out = [prefix + a + s for choice in choices for a in _expand(choice) for s in suffixes]
        if len(out) > MAX_WORDS:
            raise ShellError(f"a brace expansion of more than {MAX_WORDS:,} words")
        return out
    return [items]


def _close(items: list[Item], start: int) -> tuple[int | None, list[int]]:
    """The ``}`` matching the ``{`` at ``start``, and the commas between them at its depth.  A
    ``}`` that would close nothing to expand (no comma, no sequence) is a character, and the
    search goes on, as bash's does (``{1},}`` is ``1}``)."""
    depth, commas = 0, []
    for index in range(start, len(items)):
        if _is(items[index], "{"):
            depth += 1
        elif _is(items[index], "}") and not (depth == 1 and index == start + 1):  # "{}": no close
            depth -= 1
            if depth == 0:
                if commas or _sequence(items[start + 1 : index]) is not None:
                    return index, commas
                depth = 1
        elif depth == 1 and _is(items[index], ","):
            commas.append(index)
    return None, []


def _sequence(inner: list[Item]) -> list[list[Item]] | None:
    """``{x..y[..step]}`` of plain characters: numbers (padded as the wider end is) or single
    letters; None where it is no sequence (then the braces are characters)."""
    if not all(isinstance(i, tuple) and not i[2] for i in inner):
        return None
    match = _SEQUENCE.fullmatch("".join(i[0] for i in inner))  # type: ignore[index]
    if match is None:
        return None
    first, last, step_text = match[1], match[2], match[3]
    step = abs(int(step_text)) if step_text else 1
    step = step or 1
    if re.fullmatch(r"-?\d+", first) and re.fullmatch(r"-?\d+", last):
        low, high = int(first), int(last)
        if abs(high - low) // step >= MAX_WORDS:
            raise ShellError(f"a brace expansion of more than {MAX_WORDS:,} words")
        numbers = range(low, high + 1, step) if low <= high else range(low, high - 1, -step)
        padded = first.lstrip("-").startswith("0") or last.lstrip("-").startswith("0")
        width = max(len(first), len(last)) if padded else 0
        texts = [str(n).zfill(width) if width else str(n) for n in numbers]
    elif len(first) == 1 and len(last) == 1 and first.isalpha() and last.isalpha():
        low, high = ord(first), ord(last)
        codes = range(low, high + 1, step) if low <= high else range(low, high - 1, -step)
        texts = [chr(c) for c in codes]
    else:
        return None
    return [[(c, -1, False) for c in text] for text in texts]


def _parts(items: list[Item]) -> tuple[Part, ...]:
    parts: list[Part] = []
    text: list[str] = []
    offsets: list[int] = []
    quoted = False

    def flush() -> None:
        if text:
            parts.append(Literal("".join(text), tuple(offsets), quoted))
            text.clear()
            offsets.clear()

    for item in items:
        if not isinstance(item, tuple):
            flush()
            parts.append(item)
            continue
        if item[2] != quoted:
            flush()
            quoted = item[2]
        text.append(item[0])
        offsets.append(item[1])
    flush()
    return tuple(parts)
