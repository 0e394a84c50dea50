"""A rank's logical clock over real compute: CPU time for work, the pipeline's rules for waits.

Wall time is distorted when ranks share cores; a thread's CPU time is not.  So:

- compute advances the rank's clock by the thread CPU time it took (``time.thread_time``, with
  torch on one intra-op thread, so the rank's work is this thread's);
- a p2p message carries its sender's clock;
- a receive ends at max(own clock, sender's clock + transfer time);
- the step ends after the optimizer at the slowest rank's clock.

Time spent waiting or in bookkeeping (logging, stamps) is kept out with :meth:`LogicalClock.hold`;
with a compute lock, the clock runs only while the rank holds it (``compute_lock``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Protocol


class Lock(Protocol):
    def acquire(self) -> None: ...
    def release(self) -> None: ...


class LogicalClock:
    """One rank's clock, in seconds: its own CPU work plus what the pipeline made it wait."""

    def __init__(
        self, cpu_time: Callable[[], float] = time.thread_time, lock: Lock | None = None
    ) -> None:
        self._cpu_time = cpu_time
        self._lock = lock  # held while the clock runs, given up while it is held
        if lock is not None:
            lock.acquire()
        self._base = 0.0
        self._mark = cpu_time()
        self.held = 0  # depth of hold(): while held, the clock stands still

    def now(self) -> float:
        """The clock: CPU time since the last mark counts as compute unless held."""
        if self.held:
            return self._base
        return self._base + self._cpu_time() - self._mark

    def _freeze(self) -> None:
        self._base = self.now()
        self._mark = self._cpu_time()

    @contextmanager
    def hold(self) -> Iterator[None]:
        """Stop the clock for work that is not the rank's compute (communication, logging)."""
        if not self.held:
            self._freeze()
            if self._lock is not None:
                self._lock.release()
        self.held += 1
        try:
            yield
        finally:
            self.held -= 1
            if not self.held:
                if self._lock is not None:
                    self._lock.acquire()
                self._mark = self._cpu_time()

    def reach(self, seconds: float) -> None:
        """Move the clock on to ``seconds`` if it is behind (a receive, the step's end)."""
        if not self.held:
            self._freeze()
        self._base = max(self._base, seconds)

    def time(self) -> float:
        """``time.time``'s name, so megatron-core's ``Timers`` can read this clock."""
        return self.now()


def receive_end(own: float, sent: float, transfer_seconds: float) -> float:
    """When a receive ends: once the rank is there and the message has crossed the link."""
    return max(own, sent + transfer_seconds)
