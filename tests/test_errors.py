"""What can go wrong, by type: each kind's exit status, and which kinds a caller catches with
which ``except``."""

from __future__ import annotations

import argparse
import signal
import unicodedata

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ray_layout import errors
from ray_layout.commands.common import Command, execute
from ray_layout.commands.flags import Settings
from ray_layout.errors import (
    EXIT_BAD_INPUT,
    EXIT_FAILURE,
    EXIT_INTERRUPTED,
    ConfigError,
    InputError,
    LayoutError,
    MeasurementError,
    OutputError,
    RayLayoutError,
    RunFailure,
    clipped,
    exception_line,
    one_line,
    quoted,
)

KINDS = [InputError, ConfigError, LayoutError, MeasurementError, RunFailure, OutputError]


def test_the_exit_statuses_are_the_shells() -> None:
    """1 for failure, 2 for bad input (as argparse exits on a usage error), 128 + SIGINT when
    interrupted, as a shell reports a process Ctrl-C stopped."""
    assert (EXIT_FAILURE, EXIT_BAD_INPUT) == (1, 2)
    assert EXIT_INTERRUPTED == 128 + signal.SIGINT


@pytest.mark.parametrize(
    ("kind", "status"),
    [
        (RayLayoutError, EXIT_FAILURE),
        (InputError, EXIT_BAD_INPUT),
        (ConfigError, EXIT_BAD_INPUT),
        (LayoutError, EXIT_BAD_INPUT),
        (MeasurementError, EXIT_BAD_INPUT),
        (RunFailure, EXIT_FAILURE),
        (OutputError, EXIT_FAILURE),
    ],
)
def test_each_kind_exits_with_its_status(kind: type[RayLayoutError], status: int) -> None:
    assert kind("x").exit_code == status


@pytest.mark.parametrize("kind", KINDS)
def test_the_command_line_reports_each_kind_in_one_line_and_exits_with_its_status(
    kind: type[RayLayoutError], capsys: pytest.CaptureFixture[str]
) -> None:
    def fail(settings: Settings, console: object) -> None:
        raise kind("the store at /data\nholds no finished runs")

    command = Command("fail", "fails", Settings, fail)
    assert execute(command, argparse.Namespace()) == kind.exit_code
    captured = capsys.readouterr()
    assert captured.err == "error: the store at /data\\nholds no finished runs\n"
    assert captured.out == ""


def test_a_callers_bug_is_none_of_them() -> None:
    """It keeps its traceback: the command line does not turn it into an exit status."""

    def fail(settings: Settings, console: object) -> None:
        raise TypeError("a bug")

    with pytest.raises(TypeError, match="a bug"):
        execute(Command("fail", "fails", Settings, fail), argparse.Namespace())


def test_bad_input_is_a_value_error_and_nothing_else_is() -> None:
    """Code that validates with ``except ValueError`` still catches a bad config or layout; a
    measurement that cannot answer, or failed runs, are not the value's fault."""
    for kind in (InputError, ConfigError, LayoutError):
        assert issubclass(kind, ValueError)
    for kind in (MeasurementError, RunFailure, OutputError, RayLayoutError):
        assert not issubclass(kind, ValueError)


def test_the_kinds_do_not_catch_one_another() -> None:
    with pytest.raises(ConfigError):
        try:
            raise ConfigError("bad")
        except (LayoutError, MeasurementError, RunFailure, OutputError):
            pytest.fail("caught by another kind")
    assert not issubclass(LayoutError, ConfigError) and not issubclass(ConfigError, LayoutError)


def test_every_error_class_of_the_module_is_a_kind_here() -> None:
    """A new kind must get an exit status and a test row above."""
    defined = {
        value
        for value in vars(errors).values()
        if isinstance(value, type) and issubclass(value, Exception)
    }
    assert defined == {RayLayoutError, *KINDS}
    assert {kind.exit_code for kind in defined} == {EXIT_FAILURE, EXIT_BAD_INPUT}


@pytest.mark.parametrize(
    "value",
    ["x" * 10**6, [["y" * 1000] * 1000] * 1000, {str(i): i for i in range(10**5)}, 10**4000],
    ids=["string", "nested-list", "dict", "int"],
)
def test_a_value_is_quoted_in_at_most_80_characters(value: object) -> None:
    """An alias bomb's list, a 1 MB line: a message shows their start, never all of them."""
    assert len(quoted(value)) <= 80
    assert quoted(10**4000) == "a 13288-bit number"


def test_a_short_value_is_its_repr_and_text_is_clipped() -> None:
    assert (quoted("it's"), quoted([1, 2]), quoted(None), quoted(1e-300)) == (
        '"it\'s"',
        "[1, 2]",
        "None",
        "1e-300",
    )
    assert clipped("abc") == "abc" and clipped("a" * 100) == "a" * 79 + "…"


def test_an_exception_is_one_line_of_what_it_says_or_its_type() -> None:
    """A traceback Ray carries folds onto one line, cut short; a bare Exception names its type."""
    assert (
        exception_line(RuntimeError("Traceback:\n  File 'x'\n\tbad ")) == "Traceback: File 'x' bad"
    )
    assert exception_line(ValueError("x" * 1000)) == "x" * 300
    assert exception_line(Exception()) == "Exception"


LINE_BREAKS = "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029"  # where str.splitlines cuts


@given(st.text(alphabet=st.characters(codec="utf-8") | st.sampled_from(LINE_BREAKS + "\x1b\t")))
def test_one_line_shows_any_text_on_one_line_and_acts_on_none_of_it(text: str) -> None:
    """A value's newline, a terminal's escape sequence (ESC), a Unicode line separator: each
    is shown as its escape, so that an error is one line however it is cut, and the rest of
    the text is kept as it is."""
    shown = one_line(text)
    assert len(f"error: {shown}".splitlines()) == 1
    assert all(unicodedata.category(c) not in ("Cc", "Zl", "Zp") for c in shown)
    escaped = (repr(c)[1:-1] if unicodedata.category(c) in ("Cc", "Zl", "Zp") else c for c in text)
    assert shown == "".join(escaped)


def test_one_line_escapes_as_python_writes_escapes() -> None:
    assert one_line("a\nb\x1b[31m\u2028\t") == "a\\nb\\x1b[31m\\u2028\\t"
