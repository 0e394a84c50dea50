"""Numbers as a log prints them, read by one strict reader.

Every number of every record :mod:`ray_layout.measure.logs` reads (timer values and ranks,
iteration counts, step times, rates, losses, memory sizes, the world's sizes) goes through
:func:`read_number` or :func:`read_count`: the whole token is a number, or it is none.  A
pattern that takes a number's start and lets any text follow read ``1,392.00`` as 1.0 and
``12x4.5`` as 12; here a token with any tail is no number, and the line holding it is dropped
and counted by the reader of its record.

A number is what Python's formats print (``{:.2f}``, ``{:.6E}``, ``repr``, ``nan``, ``inf``),
with or without thousands separators (``{:,}``, ``{:_}``: groups of three digits after a first
of one to three that does not start with 0), and is read as the value it prints: ``1,392.00``
is 1392.0.  Any other grouping (``1,39``, ``0,123``, ``1,392_000``) is no number.  ASCII only:
``float`` would take ``١٢`` or ``1_0`` as numbers, which no log prints.
"""

from __future__ import annotations

import re

# Python prints every finite float with {:.2f} in at most 312 characters (309 digits), and
# grouping adds a separator every three: a token longer than this is no number a log printed.
MAX_NUMBER_CHARS = 512
MAX_COUNT_DIGITS = 18  # far above any rank, iteration or size, and inside int64

_GROUPED = r"[1-9][0-9]{0,2}(?:,[0-9]{3})+|[1-9][0-9]{0,2}(?:_[0-9]{3})+"
_WHOLE = rf"(?:[0-9]+|{_GROUPED})"
_COUNT = re.compile(rf"[-+]?{_WHOLE}")
_NUMBER = re.compile(
    rf"[-+]?(?:(?:{_WHOLE}(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?|(?i:nan|inf))"
)
# Where a line holds a value that starts like a number: the token from there to the next blank,
# which the reader then takes whole or not at all.
NUMBER_START = r"[-+]?(?:[0-9.]|(?i:nan|inf))"


def read_number(token: str) -> float | None:
    """The value ``token`` prints, or None when the whole token is no number."""
    if len(token) > MAX_NUMBER_CHARS or _NUMBER.fullmatch(token) is None:
        return None
    return float(_ungrouped(token))


def read_count(token: str) -> int | None:
    """The integer ``token`` prints (a sign and separators allowed, at most MAX_COUNT_DIGITS
    digits), or None when the whole token is no such integer."""
    if len(token) > MAX_NUMBER_CHARS or _COUNT.fullmatch(token) is None:
        return None
    digits = _ungrouped(token)
    if len(digits.lstrip("+-")) > MAX_COUNT_DIGITS:
        return None
    return int(digits)


def _ungrouped(token: str) -> str:
    return token.replace(",", "").replace("_", "")
