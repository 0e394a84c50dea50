"""A rank's emulated clock: ops end at their scheduled time, not after their real overhead.

Each op is scheduled to end at its start plus its cost (times the profile's ``time_scale``)
and the rank sleeps only what remains of that once its real Python and gloo work is done, so
the overhead is absorbed instead of landing in the timers ``1/time_scale`` times over.  Times
are wall-clock seconds (``time.time``) because ranks stamp the tensors they exchange with them:
a receiver resumes at the sender's scheduled time, not when gloo got round to delivering.  What
could not be absorbed (an op whose overhead outlasted its cost) is counted for the summary line.
"""

from __future__ import annotations

import time


class Clock:
    """One rank's scheduled time, and how far the real process fell behind it."""

    def __init__(self, time_scale: float) -> None:
        self.time_scale = time_scale
        self.now = time.time()
        self.ops = 0
        self.late_ops = 0
        self.late_seconds = 0.0
        self.worst_late_seconds = 0.0

    def anchor(self) -> None:
        """Start the schedule afresh from real time (after work that is not emulated)."""
        self.now = max(self.now, time.time())

    def seconds(self, ms: float) -> float:
        """Real seconds of ``ms`` emulated milliseconds."""
        return ms * self.time_scale / 1e3

    def advance(self, ms: float) -> None:
        """An op of ``ms`` emulated milliseconds from the scheduled time: sleep until it ends."""
        self.reach(self.now + self.seconds(ms))

    def reach(self, scheduled: float) -> None:
        """Wait until ``scheduled`` (a stamp from a peer, or this rank's own deadline); a rank
        already past it is late by its real overhead, which is counted and never slept back."""
        self.now = max(self.now, scheduled)
        self.ops += 1
        remaining = self.now - time.time()
        if remaining > 0:
            time.sleep(remaining)
            return
        self.late_ops += 1
        self.late_seconds -= remaining
        self.worst_late_seconds = max(self.worst_late_seconds, -remaining)

    def summary(self, rank: int) -> str:
        """One line for the rank's stderr: the residual overhead, in emulated milliseconds."""
        emulated_ms = 1e3 / self.time_scale
        mean = self.late_seconds / self.late_ops if self.late_ops else 0.0
        return (
            f"emulator: rank {rank}: {self.late_ops} of {self.ops} ops ended past their "
            f"deadline, by {mean * emulated_ms:.3f} ms on average and "
            f"{self.worst_late_seconds * emulated_ms:.3f} ms at most (emulated)"
        )
