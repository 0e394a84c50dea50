"""What a flag's value must satisfy, as small reusable checks.

A check takes a value (never ``None``: an unset flag is not checked) and returns the problem in
words ("must be >= 1, got 0") or ``None``; :func:`ray_layout.options.flag_fields.check_options` puts
the flag's name in front and raises ``ConfigError``, so every message names the flag it is about.
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from ray_layout.errors import quoted
from ray_layout.options.ray_head import ray_head_problem

Check = Callable[[Any], str | None]

# Bounds no real run reaches: they stop overflowing or run-away work before it starts (the
# model's own bounds, the parallel sizes' among them, live in ray_layout.model.spec).
MAX_MICROBATCHES = 16_384
MAX_SCHEDULE_SLOTS = 16_384  # PP x VPP x micro-batches: forward passes one step simulates
MAX_SAMPLES = 100_000  # Monte Carlo samples of a step
MAX_SAMPLED_PASSES = 2**20  # samples x PP x VPP x micro-batches: about 1 GiB of Monte Carlo
MAX_LAYER_PLACEMENTS = 16_384  # decoder layers x PP x VPP a search places (1,024 x 64 took 14 GiB)
MAX_LISTED = 10_000  # layouts one `layouts` call prints
MAX_ITERATIONS = 1_000_000
MAX_TASKS = 1_024  # Ray tasks, or nodes of an embedded cluster, a command starts
MAX_PROFILE_RUNS = 64


def at_least(low: int, why: str = "") -> Check:
    """``value >= low``; ``why`` says the reason where the bound is not obvious."""
    bound = f">= {low}: {why}" if why else f">= {low}"
    return lambda value: None if value >= low else f"must be {bound}, got {value}"


def between(low: int, high: int) -> Check:
    def check(value: int) -> str | None:
        if value < low:
            return f"must be >= {low}, got {value}"
        return None if value <= high else f"must be <= {high:,}, got {value}"

    return check


def positive(value: float) -> str | None:
    return None if value > 0 else f"must be positive, got {value}"  # NaN fails too


def finite(value: float) -> str | None:
    return None if math.isfinite(value) else f"must be a finite number, got {value}"


def plain_name(value: str) -> str | None:
    """A name that becomes a folder in the store: no path separators, no dot-dot."""
    if _PLAIN_NAME.fullmatch(value):
        return None
    return f"must be a plain name (letters, digits, '.', '_', '-'; at most 128), got {value!r}"


_PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def reachable(value: str) -> str | None:
    """A Ray address (``host:port`` or ``ray://host:port``) where a Ray head answers, found in
    seconds (:func:`ray_head_problem`'s handshake): ``ray.init`` itself waits a minute and more
    on an address nobody listens at, and hangs on one where something else (a web server) does."""
    if value in ("auto", "local"):
        return None  # Ray finds (or starts) the cluster itself
    host, _, port = value.removeprefix("ray://").rpartition(":")
    number = int(port) if port.isascii() and port.isdigit() and len(port) <= 5 else 0
    if not (host and 0 < number < 65_536):
        return f"must be HOST:PORT (or ray://HOST:PORT, auto), got {value!r}"
    problem = ray_head_problem(value)
    return None if problem is None else f"{value}: {problem}; start it or fix the address"


def _os_errors_in_words(check: Check) -> Check:
    """A path check whose path the system refuses to look at (a name too long, say) says so."""

    @functools.wraps(check)
    def checked(value: str | Path) -> str | None:
        try:
            return check(value)
        except OSError as exc:
            return f"{value}: unusable path ({exc.strerror or exc})"

    return checked


@_os_errors_in_words
def existing_file(value: str | Path) -> str | None:
    """There is something at the path; what it is (a FIFO, a folder) the file reader says."""
    return None if Path(value).exists() else f"{value}: no such file"


def costs_file(value: str) -> str | None:
    """``--costs``: a COSTS.json, or the word ``flops``."""
    return None if value == "flops" else existing_file(value)


@_os_errors_in_words
def folder_or_new(value: str | Path) -> str | None:
    """A folder the command fills, made on first use: it, or the nearest folder above it that
    exists, is a folder this user may write in."""
    if not str(value).strip():
        return f"must name a folder, got {str(value)!r}"
    path = Path(value)
    if path.exists() and not path.is_dir():
        return f"{value}: is a file, not a folder"
    existing = next(folder for folder in (path, *path.parents) if folder.exists())
    if not existing.is_dir():
        return f"{value}: cannot be made, {existing} is a file"
    return None if _writable(existing) else f"{value}: {existing} is not writable"


def _writable(folder: Path) -> bool:
    return os.access(folder, os.W_OK | os.X_OK)


def new_file(suffixes: Iterable[str] = ()) -> Check:
    """A file the command writes: its folder exists, it is no folder itself, its suffix fits."""
    allowed = tuple(suffixes)

    def check(value: str | Path) -> str | None:
        path = Path(value)
        if path.is_dir():
            return f"{value}: is a folder, not a file"
        if path.exists() and not path.is_file():  # a device or FIFO: never replaced by a file
            return f"{value}: is not a regular file; name a file to write"
        if not path.parent.is_dir():
            return f"{value}: no such folder {str(path.parent)!r}"
        if not _writable(path.parent):
            return f"{value}: folder {str(path.parent)!r} is not writable"
        if allowed and path.suffix.lower() not in allowed:
            return f"{value}: must end in {', '.join(allowed)}"
        return None

    return _os_errors_in_words(check)


def each(check: Check) -> Check:
    """Apply ``check`` to every item of a tuple value."""
    return lambda values: next(filter(None, map(check, values)), None)


def comma_integers(example: str) -> Callable[[str], tuple[int, ...]]:
    """Parse ``"1,2,4"``; the ``ValueError`` says what was expected, for the flag's message."""

    def parse(text: str) -> tuple[int, ...]:
        try:
            return tuple(integer(part) for part in text.split(","))
        except ValueError:
            raise ValueError(f"must be integers such as {example}, got {quoted(text)}") from None

    return parse


# The one reading of a number written as text: a flag's value, a Megatron flag's in a config or
# a launch script.  Python's int() and float() read more than anyone means by a number: ``1_0``
# as 10, `` 7 `` and ``+7`` as 7, other scripts' digits (``٣`` as 3), ``nan`` and ``inf``, and
# ``1e400`` as inf.
MAX_NUMBER_TEXT = 100  # characters: more is no setting's value (int() refuses past 4,300 digits)
_INTEGER = re.compile(r"-?[0-9]+")
_DECIMAL = re.compile(r"-?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")


def integer(text: str) -> int:
    """An integer in ASCII digits, a leading minus allowed; the ``ValueError`` says so."""
    if len(text) > MAX_NUMBER_TEXT or not _INTEGER.fullmatch(text):
        raise ValueError(f"must be an integer in digits (0-9), got {quoted(text)}")
    return int(text)


def decimal(text: str) -> float:
    """A finite number in decimal notation (``2``, ``-0.5``, ``1e-3``); the ``ValueError`` says
    what was expected."""
    if len(text) > MAX_NUMBER_TEXT or not _DECIMAL.fullmatch(text):
        raise ValueError(f"must be a decimal number (such as 2, 0.5, 1e-3), got {quoted(text)}")
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"must be a number a float holds (up to 1.8e308), got {quoted(text)}")
    return value


def _flag_reader(read: Callable[[str], Any]) -> Callable[[str], Any]:
    """``read`` as argparse's ``type``: its message becomes the usage error's (argparse says only
    "invalid value" for a ValueError)."""

    @functools.wraps(read)
    def flag_value(text: str) -> Any:
        try:
            return read(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return flag_value


_FLAG_TYPES: dict[Any, Callable[[str], Any]] = {
    int: _flag_reader(integer),
    float: _flag_reader(decimal),
}


def flag_type(kind: Any) -> Any:
    """argparse's ``type`` for a flag whose value is a ``kind``: the readers above for numbers,
    ``kind`` itself otherwise."""
    return _FLAG_TYPES.get(kind, kind)
