"""One rank computes at a time on a node: CPU times that do not depend on who shares the cores.

A thread's CPU time is not its wall time, but it still grows when other processes share its
core (caches, the scheduler's switches): three ranks of one run on two cores, or two runs side
by side, measured the same layout 30-50% apart.  The logical clock makes wall time irrelevant,
so the ranks of every run on a node can take turns: a rank holds this lock while its clock runs
(compute) and gives it up while its clock is held (communication, logging).  The results do not
change, only the wall time grows.

Every blocking call a peer waits on should be held off the clock (``clock_hooks``); should one be
missed, a rank that waits longer than ``patience_s`` for the lock computes without it and counts
a bypass, so a missed call costs time, never a hang.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
import time
from pathlib import Path

LOCK_ENV = "RAY_LAYOUT_CORE_LOCK"  # the lock file; every rank on a node must name the same
_POLL_S = 0.0005
START_PATIENCE_S = 120.0  # every rank of a node importing torch in turn: a few seconds each


def default_lock_path() -> Path:
    """One file per node (the node's temporary folder), whichever runs share it."""
    return Path(os.environ.get(LOCK_ENV) or Path(tempfile.gettempdir()) / "ray_layout-compute.lock")


class ComputeLock:
    """An exclusive ``flock`` on a file, taken with a bounded wait."""

    def __init__(self, path: Path, patience_s: float = 5.0) -> None:
        self.path, self.patience_s = path, patience_s
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        self.held = False
        self.bypasses = 0

    def acquire(self, patience_s: float | None = None) -> None:
        """Take the lock, or after ``patience_s`` (default the lock's) go on without it (a
        bypass)."""
        deadline = time.monotonic() + (self.patience_s if patience_s is None else patience_s)
        while True:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if time.monotonic() > deadline:
                    self.bypasses += 1
                    return
                time.sleep(_POLL_S)
            else:
                self.held = True
                return

    def release(self) -> None:
        if self.held:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            self.held = False
