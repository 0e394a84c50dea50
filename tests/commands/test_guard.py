"""The one guard every command line runs in: interrupts end in one line and 130, output that
cannot be written in one line and 1, and a command that ends in an error ends in that line alone.
(The same, as a user meets it from a shell: tests/commands/test_main.py and tests/test_tune.py.)"""

from __future__ import annotations

import errno
import io
import os
import signal
import sys
import threading
import time
from types import SimpleNamespace

import pytest

from ray_layout.commands import guard
from ray_layout.commands.guard import HeldLines, Output, end_with, guarded, run_entry
from ray_layout.errors import OutputError


def stopped() -> str:
    return "what an interrupt left"


class Failing(io.StringIO):
    """A stdout whose every flush fails as ``/dev/full`` (or a pipe nobody reads) does."""

    def __init__(self, error: OSError) -> None:
        super().__init__()
        self.error = error

    def flush(self) -> None:
        raise self.error


def streams(monkeypatch: pytest.MonkeyPatch, stdout: io.StringIO | None = None) -> io.StringIO:
    """A stdout (``stdout``, or one that works) and a stderr to read back."""
    err = io.StringIO()
    monkeypatch.setattr(sys, "stdout", io.StringIO() if stdout is None else stdout)
    monkeypatch.setattr(sys, "stderr", err)
    return err


def test_notes_wait_and_come_out_in_order_when_the_command_succeeds(monkeypatch):
    err = streams(monkeypatch)
    given = sys.stdout, sys.stderr

    def body() -> int:
        print("note: one", file=sys.stderr)
        print("result")
        print("note: two", file=sys.stderr)
        assert err.getvalue() == ""  # held
        return 0

    assert guarded(body, stopped) == 0
    assert (given[0].getvalue(), err.getvalue()) == ("result\n", "note: one\nnote: two\n")
    assert (sys.stdout, sys.stderr) == given  # given back


def test_a_command_that_ends_in_an_error_ends_in_that_one_line_alone(monkeypatch):
    err = streams(monkeypatch)

    def body() -> int:
        print("warning: costs from FLOPs", file=sys.stderr)
        print("plan: with recompute still no layout fits\nplan: nor with", file=sys.stderr)
        end_with("error: no layout fits in\n--hbm-gb 1e-09")
        return 2

    assert guarded(body, stopped) == 2
    assert err.getvalue() == "error: no layout fits in\\n--hbm-gb 1e-09\n"


def test_notes_of_a_command_that_works_longer_than_the_hold_come_as_they_come(monkeypatch):
    err = streams(monkeypatch)
    monkeypatch.setattr(guard, "HOLD_S", 0.05)

    def body() -> int:
        print("plan: 1 s: searching", file=sys.stderr)
        deadline = time.monotonic() + 5
        while not err.getvalue() and time.monotonic() < deadline:
            time.sleep(0.01)
        print("plan: 2 s: searching", file=sys.stderr)
        end_with("error: a failure after the hold")
        return 1

    assert guarded(body, stopped) == 1
    assert err.getvalue().splitlines() == [
        "plan: 1 s: searching",
        "plan: 2 s: searching",
        "error: a failure after the hold",
    ]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_sigint_and_sigterm_end_the_command_in_one_line_and_130(monkeypatch, signum):
    err = streams(monkeypatch)
    previous = {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM)}
    unwound = []

    def body() -> int:
        print("note: held", file=sys.stderr)
        try:
            os.kill(os.getpid(), signum)
            time.sleep(5)
        finally:  # a second signal while it unwinds is ignored: the clean-up finishes
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            unwound.append(True)
        return 0

    assert guarded(body, stopped) == 130
    assert err.getvalue() == "interrupted: what an interrupt left\n"
    assert unwound == [True]
    assert {number: signal.getsignal(number) for number in previous} == previous


def test_sigint_stops_a_command_started_with_it_ignored(monkeypatch):
    """A shell's background job starts with SIGINT ignored; ``kill -INT`` still stops it."""
    streams(monkeypatch)
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        status = guarded(lambda: os.kill(os.getpid(), signal.SIGINT) or time.sleep(5) or 0, stopped)
        assert status == 130 and signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (OSError(errno.ENOSPC, "No space left on device"), "No space left on device (stdout)"),
        (BrokenPipeError(errno.EPIPE, "Broken pipe"), "its reader closed the pipe"),
    ],
)
def test_output_that_cannot_be_written_is_one_line_and_exit_1(monkeypatch, error, reason):
    err = streams(monkeypatch, Failing(error))

    def body() -> int:
        print("a result nobody will read")
        print("note: held", file=sys.stderr)
        return 0

    assert guarded(body, stopped) == 1
    assert err.getvalue() == f"error: cannot write the output: {reason}\n"


def test_a_command_that_already_failed_keeps_its_own_line_when_its_output_fails(monkeypatch):
    err = streams(monkeypatch, Failing(OSError(errno.ENOSPC, "No space left")))

    def body() -> int:
        print("half a table")
        end_with("error: bad input")
        return 2

    assert guarded(body, stopped) == 2
    assert err.getvalue() == "error: bad input\n"


def test_a_closed_stdout_is_refused_before_anything_runs(monkeypatch):
    err = io.StringIO()
    monkeypatch.setattr(sys, "stdout", None)
    monkeypatch.setattr(sys, "stderr", err)
    assert guarded(lambda: pytest.fail("ran"), stopped) == 1
    assert err.getvalue() == "error: cannot write the output: stdout is closed\n"


def test_a_write_to_a_closed_stdout_is_an_output_error_and_any_other_value_error_a_bug():
    closed = io.StringIO()
    closed.close()
    with pytest.raises(OutputError, match="cannot write the output: stdout is closed"):
        Output(closed).write("x")

    class Buggy(io.StringIO):
        def write(self, text: str) -> int:
            raise ValueError("a caller's bug")

    with pytest.raises(ValueError, match="a caller's bug"):
        Output(Buggy()).write("x")


@pytest.mark.parametrize(("code", "status"), [(0, 0), (2, 2), (None, 0), ("usage", 1)])
def test_argparses_exits_become_the_status(monkeypatch, code, status):
    streams(monkeypatch)

    def body() -> int:
        raise SystemExit(code)

    assert guarded(body, stopped) == status


def test_a_callers_bug_keeps_its_traceback_and_its_notes(monkeypatch):
    err = streams(monkeypatch)
    given = sys.stdout, sys.stderr

    def body() -> int:
        print("note: before the bug", file=sys.stderr)
        raise TypeError("a bug")

    with pytest.raises(TypeError, match="a bug"):
        guarded(body, stopped)
    assert err.getvalue() == "note: before the bug\n"
    assert (sys.stdout, sys.stderr) == given


def test_a_stderr_that_cannot_be_written_never_stops_the_command():
    assert HeldLines(None).write("note\n") == 5
    failing = HeldLines(Failing(OSError(errno.ENOSPC, "No space left")))
    failing.release()
    failing.write("note\n")
    failing.end_with("error: x")


def test_a_signal_while_the_entry_loads_is_taken_inside_the_guard(monkeypatch):
    """The commands take a second and more to load; a signal then was a traceback from inside
    some library's import, or lost. It waits, and the guard takes it: one line, 130."""
    err = streams(monkeypatch)
    ran = []

    def main() -> int:
        return guarded(lambda: ran.append(True) or 0, stopped)

    def load(module: str) -> SimpleNamespace:
        # to this thread, the one thread of a process that starts (pytest has others)
        signal.pthread_kill(threading.main_thread().ident, signal.SIGTERM)  # held back
        time.sleep(0.05)
        return SimpleNamespace(main=main)

    monkeypatch.setattr(guard.importlib, "import_module", load)
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, ())
    try:
        assert run_entry("ray_layout.commands.main") == 130
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    assert err.getvalue() == "interrupted: what an interrupt left\n" and not ran
