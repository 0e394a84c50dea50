"""Progress of a long search, as lines for whoever asked: the core stays pure, the caller
passes the function that prints (or logs, or ignores) them."""

from __future__ import annotations

import time
from collections.abc import Callable

PROGRESS_AFTER_S = 2.0  # a plan that takes longer than this says how it is going, this often


class ProgressClock:
    """Calls ``report(line)`` once the work has run ``PROGRESS_AFTER_S`` and every as much again."""

    def __init__(self, report: Callable[[str], None] | None, every_s: float | None = None):
        self.report = report
        self.every_s = PROGRESS_AFTER_S if every_s is None else every_s
        self.started = time.monotonic()
        self.due = self.started + self.every_s

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.started

    def tick(self, describe: Callable[[], str]) -> None:
        """Report ``describe()`` if a report is due (``describe`` runs only then)."""
        if self.report is None:
            return
        now = time.monotonic()
        if now >= self.due:
            self.report(f"{now - self.started:.0f} s: {describe()}")
            self.due = now + self.every_s
