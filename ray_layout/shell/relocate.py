"""Text the script runs again (an ``eval``'s string, ``bash -c``'s) put back where its
characters were written: each literal character's offset in the script, and the line, so that a
launch found there is reported, and rewritten, in the script itself."""

from __future__ import annotations

from dataclasses import dataclass, replace

from ray_layout.shell.tokens import ArrayLiteral, Literal, Part, Reference, Token, Word


@dataclass(frozen=True)
class Placement:
    offsets: tuple[int, ...]  # each character's offset in the script, -1 where none
    line: int  # the line the text was run from


def placed(token: Token, placement: Placement) -> Token:
    """``token`` where its text was written in the script."""
    line = placement.line + token.line - 1
    if isinstance(token, Word):
        return replace(token, parts=_placed_parts(token.parts, placement.offsets), line=line)
    if isinstance(token, ArrayLiteral):
        words = tuple(placed(word, placement) for word in token.words)
        return replace(token, words=words, line=line)  # type: ignore[arg-type]
    return replace(token, line=line)


def _placed_parts(parts: tuple[Part, ...], offsets: tuple[int, ...]) -> tuple[Part, ...]:
    placed: list[Part] = []
    for part in parts:
        if isinstance(part, Literal):
            moved = tuple(offsets[o] if 0 <= o < len(offsets) else -1 for o in part.offsets)
            placed.append(replace(part, offsets=moved))
        elif isinstance(part, Reference):
            replacement = part.replacement
            placed.append(
                replace(
                    part,
                    argument=_placed_parts(part.argument, offsets),
                    replacement=None
                    if replacement is None
                    else _placed_parts(replacement, offsets),
                )
            )
        else:
            placed.append(part)
    return tuple(placed)
