"""Waiting on processes a test started, and telling whether one is still alive."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path


def wait_for(condition: Callable[[], bool], timeout_s: float) -> None:
    """Poll ``condition`` every 0.1 s; fail the test after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def alive(pid: int) -> bool:
    """Whether a process exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"
