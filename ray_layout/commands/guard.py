"""How every command line ends: the one guard between a command and its exit status.

All that ``python -m ray_layout`` and ``python -m ray_layout.tune`` do, parsing included, runs
inside :func:`guarded`, so that each way a command line can end is handled once, for all:

- SIGINT (Ctrl-C) and SIGTERM (``kill``, ``ray job stop``) stop it as Ctrl-C does: what it was
  doing unwinds (runs stop; a store write is finished whole or removed), then one line and exit
  130. A second signal while it unwinds is ignored, so that the clean-up itself finishes; one
  that comes while the entry loads (:func:`run_entry`) waits for the guard.
- Output that cannot be written (``> /dev/full``, ``>&-``, a reader that left the pipe) is an
  :class:`OutputError`: one line and exit 1, with stdout then pointed at /dev/null so that the
  interpreter's last flush is silent (Python's recipe for a closed pipe).
- What a command says on stderr (notes, warnings, progress) waits for its first ``HOLD_S``
  seconds: a command that ends in an error within them ends in its one error line alone; one
  that succeeds, or works longer, shows them all, in order.
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any, TextIO

from ray_layout.errors import EXIT_FAILURE, EXIT_INTERRUPTED, OutputError, one_line

HOLD_S = 10.0
_INTERRUPTS = (signal.SIGINT, signal.SIGTERM)


class HeldLines:
    """stderr while a command runs: what is written waits until the hold is released (the
    command succeeded, or ran ``HOLD_S``) or dropped (it ended in one line); a stderr that
    cannot be written (``2>&-``, ``2>/dev/full``) never stops the command."""

    def __init__(self, target: TextIO | None) -> None:
        self.target = target
        self._held: list[str] | None = []  # None once released: writes go straight through
        self._lock = threading.Lock()

    def write(self, text: str) -> int:
        with self._lock:
            if self._held is None:
                self._send(text)
            else:
                self._held.append(text)
        return len(text)

    def flush(self) -> None:
        with self._lock:
            if self._held is None:
                self._send("")

    def release(self) -> None:
        with self._lock:
            held, self._held = self._held, None
            self._send("".join(held or ()))

    def end_with(self, line: str) -> None:
        """Drop what is held and write ``line`` alone, as one line; what comes after (Ray's
        exit) goes straight through."""
        with self._lock:
            self._held = None
            self._send(one_line(line) + "\n")

    def _send(self, text: str) -> None:
        try:
            if self.target is not None:
                self.target.write(text)
                self.target.flush()
        except (OSError, ValueError):
            pass  # nowhere left to say anything

    def __getattr__(self, name: str) -> Any:  # encoding, isatty, fileno: the target's
        return getattr(self.target, name)


class Output:
    """stdout while a command runs: a write that fails is an :class:`OutputError` naming why,
    never an ``OSError`` from deep in rich, a traceback at exit, or a silent exit 0."""

    def __init__(self, target: TextIO) -> None:
        self.target = target
        self.failed = False

    def write(self, text: str) -> int:
        return self._checked(self.target.write, text)

    def writelines(self, lines: list[str]) -> None:
        self._checked(self.target.writelines, lines)

    def flush(self) -> None:
        self._checked(self.target.flush)

    def _checked(self, call: Callable[..., Any], *args: Any) -> Any:
        try:
            return call(*args)
        except (OSError, ValueError) as exc:
            closed = getattr(self.target, "closed", False)
            if isinstance(exc, ValueError) and not closed:
                raise  # a caller's bug, not the output's
            self.failed = True
            raise OutputError(f"cannot write the output: {_why(exc)}") from None

    def __getattr__(self, name: str) -> Any:  # encoding, isatty, fileno: the target's
        return getattr(self.target, name)


def _why(exc: BaseException) -> str:
    if isinstance(exc, BrokenPipeError):
        return "its reader closed the pipe"
    if isinstance(exc, OSError):
        return f"{exc.strerror or type(exc).__name__} (stdout)"
    return "stdout is closed"


def run_entry(module: str) -> int:
    """``python -m`` of a command line: ``module`` loaded (a second and more: rich, numpy,
    pyarrow) with SIGINT and SIGTERM held back, then its ``main``: a signal that came while it
    loaded is taken inside the guard, and ends in one line and 130 as one while it runs does
    (an interrupt inside a library's import was a traceback, or lost)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, _INTERRUPTS)
    return importlib.import_module(module).main()


def end_with(line: str) -> None:
    """The one line a command line ends with (an error, a refusal), alone on stderr: inside
    :func:`guarded` what was held is dropped."""
    stream = sys.stderr
    if isinstance(stream, HeldLines):
        stream.end_with(line)
    else:
        HeldLines(stream).end_with(line)


def guarded(body: Callable[[], int], stopped: Callable[[], str]) -> int:
    """Run ``body`` (a command line, from its words to its exit status) and end as the module
    says; ``stopped`` says, after ``interrupted:``, what an interrupt left. A ``SystemExit``
    (argparse's ``--help`` and usage errors) becomes its status; a caller's bug keeps its
    traceback."""
    if sys.stdout is None:  # started with stdout closed (`>&-`): nothing it prints would show
        end_with("error: cannot write the output: stdout is closed")
        return EXIT_FAILURE
    streams = sys.stdout, sys.stderr
    output, notes = Output(sys.stdout), HeldLines(sys.stderr)
    sys.stdout, sys.stderr = output, notes  # type: ignore[assignment]
    hold = threading.Timer(HOLD_S, notes.release)
    hold.daemon = True
    hold.start()
    try:
        with _interrupts():
            status = _ended(body, stopped, output, notes)
    finally:
        hold.cancel()
        notes.release()  # what a success (or a bug's traceback) comes with
        sys.stdout, sys.stderr = streams
        if output.failed:
            _silence(streams[0])
    return status


def _ended(
    body: Callable[[], int], stopped: Callable[[], str], output: Output, notes: HeldLines
) -> int:
    status = 0
    try:
        try:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, _INTERRUPTS)  # one held back comes here
            status = body()
        except SystemExit as exited:
            status = exited.code if isinstance(exited.code, int) else int(exited.code is not None)
        output.flush()
        return status
    except KeyboardInterrupt:
        notes.end_with(f"interrupted: {stopped()}")
        with suppress(OutputError):  # the interrupt is the one line
            output.flush()
        return EXIT_INTERRUPTED
    except OutputError as exc:  # the last flush; the command's own writes end in its error line
        if not status:
            notes.end_with(f"error: {exc}")
        return status or EXIT_FAILURE


@contextmanager
def _interrupts() -> Iterator[None]:
    """SIGINT and SIGTERM raise ``KeyboardInterrupt`` in the main thread, the first only; SIGINT
    too where it came in ignored (a shell's background job), so that ``kill -INT`` stops it.
    Handlers and the signal mask as they were, after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {number: signal.getsignal(number) for number in _INTERRUPTS}

    def interrupted(signum: int, frame: object) -> None:
        for number in _INTERRUPTS:
            signal.signal(number, signal.SIG_IGN)
        raise KeyboardInterrupt

    for number in _INTERRUPTS:
        signal.signal(number, interrupted)
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, ())  # as it is: _ended lets them through
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        for number, handler in previous.items():
            signal.signal(number, signal.SIG_DFL if handler is None else handler)


def _silence(stdout: TextIO) -> None:
    """Point stdout's descriptor at /dev/null: what it still buffers goes there at exit."""
    try:
        descriptor = stdout.fileno()
    except (OSError, ValueError):
        return  # not a descriptor (a test's capture): nothing flushes it at exit
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, descriptor)
    os.close(devnull)
