"""A command line run as a user's shell runs it, to see how it ends: its stdout sent somewhere it
cannot be written, or a signal sent while it runs."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.helpers.paths import ROOT

# How a shell points a command's stdout where nothing can be written; each ends its status line.
UNWRITABLE = {
    "full disk": '"$@" > /dev/full; echo "status $?"',
    "closed stdout": '"$@" >&-; echo "status $?"',
    "closed pipe": '"$@" | head -c1 > /dev/null; echo "status ${PIPESTATUS[0]}"',
}


@dataclass(frozen=True)
class Ended:
    status: int
    stdout: str
    stderr: str


def entry(module: str, *argv: str) -> list[str]:
    """``python -m MODULE ARGV`` with this interpreter."""
    return [sys.executable, "-m", module, *argv]


def with_unwritable_stdout(command: Sequence[str], where: str, cwd: Path = ROOT) -> Ended:
    """``command`` with its stdout sent where ``UNWRITABLE[where]`` says; its exit status from
    the shell's last line."""
    done = subprocess.run(
        ["bash", "-c", UNWRITABLE[where], "bash", *command],
        capture_output=True,
        text=True,
        check=False,
        cwd=cwd,
        timeout=120,
    )
    status = re.fullmatch(r"status (\d+)\n", done.stdout)
    assert status, done.stdout
    return Ended(int(status.group(1)), "", done.stderr)


def interrupted(
    command: Sequence[str], signum: int, cwd: Path = ROOT, after_s: float = 1.0
) -> Ended:
    """``command``, sent ``signum`` ``after_s`` after it began to catch SIGTERM (the command
    line's guard is in place: before, a signal meets Python's start-up, not the command)."""
    process = subprocess.Popen(
        command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 60
        while not _catches_sigterm(process.pid) and time.monotonic() < deadline:
            assert process.poll() is None, process.communicate()
            time.sleep(0.02)
        time.sleep(after_s)
        assert process.poll() is None, "ended before the signal: give it more work"
        process.send_signal(signum)
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    return Ended(process.returncode, out, err)


def _catches_sigterm(pid: int) -> bool:
    status = Path(f"/proc/{pid}/status").read_text()
    caught = re.search(r"^SigCgt:\s*([0-9a-f]+)$", status, re.MULTILINE)
    return caught is not None and bool(int(caught.group(1), 16) >> (signal.SIGTERM - 1) & 1)
