"""Every number a file hands over (a model config, a Hugging Face ``config.json``, COSTS.json, a
hardware profile), read one way.

A JSON or YAML number may be an int of any size (a 400-digit ``rope_theta``), ``inf`` or ``nan``,
and ``float()`` of a huge int, like ``math.isfinite`` of one, raises ``OverflowError``.  So a
number is compared with its bounds first (Python compares ints and floats exactly, whatever their
size) and converted after; every problem is one ConfigError naming the file, the key and the
value, clipped by :func:`quoted`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ray_layout.errors import ConfigError, quoted


@dataclass(frozen=True)
class Bound:
    """The range of one number: outside it a value is a typo or a broken fit, and a plan made
    with it would be nonsense with a flag to paste beside it.  ``zero``: 0 (none) is allowed
    below ``low``; ``above``: ``low`` itself is not (a number > 0).  ``why`` and ``high_why``
    say where a bound comes from."""

    low: float
    high: float
    unit: str = ""
    zero: bool = False
    above: bool = False
    why: str = ""
    high_why: str = ""

    def check(self, value: Any, name: str, source: str) -> float:
        """``value`` as a float in the range, or a ConfigError saying which bound it passed."""
        return number(value, name, source, self)


def number(value: Any, name: str, source: str, bound: Bound) -> float:
    """``value`` (a JSON/YAML number of any size) as a finite float within ``bound``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{source}: {name} must be a finite number, got {quoted(value)}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{source}: {name} must be a finite number, got {quoted(value)}")
    if value == 0 and bound.zero:
        return 0.0
    if value < bound.low or (bound.above and value == bound.low):
        least = f"> {bound.low:g}" if bound.above else f"at least {bound.low:g}"
        least = f"0 or {least}" if bound.zero else least
        raise ConfigError(
            f"{source}: {name} must be {least}{bound.unit}{bound.why}, got {quoted(value)}"
        )
    if value > bound.high:
        raise ConfigError(
            f"{source}: {name} must be at most {bound.high:g}{bound.unit}{bound.high_why}, got "
            f"{quoted(value)}"
        )
    return float(value)  # within finite bounds: never overflows


def integer(
    value: Any,
    name: str,
    source: str,
    *,
    low: int,
    high: int,
    whole_floats: bool = False,
    why: str = "",
) -> int:
    """``value`` as an int in ``[low, high]`` (``why``: where ``high`` comes from); a float with no
    fraction (``16.0``, ``1e3``) is one where ``whole_floats``.  A string is no integer, whatever
    it holds: ``"1_6"`` and ``"016"`` are text (the YAML reader keeps them so), not 16 or 14."""
    if whole_floats and isinstance(value, float) and value.is_integer():  # never inf or nan
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{source}: {name} must be an integer, got {quoted(value)}")
    if value < low:
        raise ConfigError(f"{source}: {name} must be >= {low:,}, got {quoted(value)}")
    if value > high:
        raise ConfigError(f"{source}: {name} must be <= {high:,}{why}, got {quoted(value)}")
    return value
