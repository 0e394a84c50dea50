"""What can go wrong, as types: the command line turns each kind into its own exit status.

- ``InputError`` (exit 2): what the user gave cannot describe a real run: a config, a layout, a
  flag, a file. ``ConfigError`` and ``LayoutError`` are its two everyday kinds.
- ``MeasurementError`` (exit 2): the logs or the store the user pointed at do not hold what the
  step needs (no finished runs, units no run identifies); nothing measured is lost.
- ``RunFailure`` (exit 1): runs on the cluster failed, so a phase of the tune cannot go on.
- ``OutputError`` (exit 1): the command's output cannot be written (a full disk, a closed stdout,
  a reader that left the pipe); what it stored is whole.

A caller's bug is none of these: it stays a ``ValueError``/``TypeError`` and shows its traceback.
Every message that shows a value the user gave shows it through :func:`quoted`.
"""

from __future__ import annotations

import re
import reprlib

EXIT_FAILURE = 1
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130


class RayLayoutError(Exception):
    """Every error ray_layout reports to its user in one line."""

    exit_code = EXIT_FAILURE


class InputError(RayLayoutError, ValueError):
    """Input that cannot describe a real Megatron run."""

    exit_code = EXIT_BAD_INPUT


class ConfigError(InputError):
    """A model or parallel configuration, a settings value or an input file that is unusable."""


class LayoutError(InputError):
    """A layout string or layout that Megatron would reject (or that we cannot use)."""


class MeasurementError(RayLayoutError):
    """Logs or stored measurements that cannot answer what was asked of them."""

    exit_code = EXIT_BAD_INPUT


class RunFailure(RayLayoutError):
    """Runs on the cluster failed and the step that needed them cannot go on."""


class OutputError(RayLayoutError):
    """What the command prints cannot be written: ``> /dev/full``, a closed stdout, a pipe whose
    reader left."""


QUOTE_LIMIT = 80  # characters of a value a message shows
_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxdict, _REPR.maxlist, _REPR.maxtuple, _REPR.maxset = 2, 4, 6, 6, 6
_REPR.maxstring = _REPR.maxother = QUOTE_LIMIT


def quoted(value: object, limit: int = QUOTE_LIMIT) -> str:
    """``value`` as a message shows it: its repr cut to ``limit`` characters, built without ever
    making the whole repr, so that a 4 MB string or a list an alias bomb made never makes (or
    takes minutes to make) a huge message; an integer too long to read by its size."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"a {value.bit_length()}-bit number"
    return clipped(_REPR.repr(value), limit)


def clipped(text: str, limit: int = QUOTE_LIMIT) -> str:
    """Text (a name, a parser's message) as a message shows it: at most ``limit`` characters."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def exception_line(exc: BaseException, limit: int = 300) -> str:
    """What an exception from Ray or a subprocess says, fit for a one-line error: its whitespace
    (a traceback's newlines) folded to single spaces, cut to ``limit``; its type's name when it
    says nothing (Ray raises a bare ``Exception``)."""
    return " ".join(str(exc).split())[:limit] or type(exc).__name__


_BREAKS_OR_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def one_line(message: str) -> str:
    """``message`` as one line, whatever the user's text in it holds: every control character
    (a newline, a terminal's escape sequence) and every character that splits lines (U+2028)
    shown as its escape, ``\\n`` or ``\\x1b``, never acted on."""
    return _BREAKS_OR_CONTROLS.sub(lambda found: repr(found.group())[1:-1], message)
