"""Why a run ended: its status, and for a failure the class that says whether to retry it.

Failure classes (:data:`RETRIED` are retried up to the run's ``max_retries``):

- ``oom``: a rank printed "CUDA out of memory" or "OutOfMemoryError"; status infeasible.
- ``invalid-config``: a :class:`ConfigError` before launch, a rank exited with 2 or printed an
  argparse ``prog: error:`` line; status error.
- ``infeasible-placement``: the placement group was not placed within ``placement_timeout_s``
  (the cluster is too small, or stayed too busy); status infeasible.
- ``node-lost``: a rank's actor died (its node or worker process went away).
- ``killed``: a rank died of a signal nobody here sent (host OOM killer, preemption).
- ``comm``: a rank printed a NCCL/gloo timeout or a lost connection (a peer died or hung).
- ``hang``: no Megatron iteration line on any rank for ``heartbeat_s`` (counted from launch).
- ``timeout``: the run took longer than ``timeout_s``.
- ``crash``: a rank exited non-zero for any other reason (a bug: not retried).
- ``early-stop``: the caller's watch (an A/B test) stopped the run; status stopped.
- ``cancelled``: the driver was interrupted (Ctrl-C, SIGTERM); status cancelled.

They are :class:`FailureClass`, a string enum: the store's ``runs`` table holds the very strings,
and a class read back from it compares equal to its member.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from ray_layout.errors import one_line as escaped_line


class FailureClass(StrEnum):
    """Why a run failed (the module docstring says when each is given); the values are the
    strings the store's ``failure_class`` column holds."""

    OOM = "oom"
    INVALID_CONFIG = "invalid-config"
    INFEASIBLE_PLACEMENT = "infeasible-placement"
    NODE_LOST = "node-lost"
    KILLED = "killed"
    COMM = "comm"
    HANG = "hang"
    TIMEOUT = "timeout"
    CRASH = "crash"
    EARLY_STOP = "early-stop"
    CANCELLED = "cancelled"
    NAN = "nan"  # the A/B's own, never a run's: a NaN loss or step time stops the arm


FINISHED, FAILED, INFEASIBLE, ERROR = "finished", "failed", "infeasible", "error"
STOPPED, CANCELLED = "stopped", "cancelled"
RETRIED = frozenset(
    {
        FailureClass.NODE_LOST,
        FailureClass.KILLED,
        FailureClass.COMM,
        FailureClass.HANG,
        FailureClass.TIMEOUT,
    }
)
_STATUS_OF = {
    FailureClass.OOM: INFEASIBLE,
    FailureClass.INFEASIBLE_PLACEMENT: INFEASIBLE,
    FailureClass.INVALID_CONFIG: ERROR,
    FailureClass.EARLY_STOP: STOPPED,
    FailureClass.CANCELLED: CANCELLED,
}
CANCELLED_ERROR = "cancelled: the driver was interrupted"
MAX_LINE = 500  # characters kept of one line in errors and tails

_MARKS = (
    (
        FailureClass.OOM,
        re.compile(r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory"),
    ),
    (FailureClass.INVALID_CONFIG, re.compile(r"^\S+: error: |\bConfigError\b")),
    (
        FailureClass.COMM,
        re.compile(
            r"Watchdog caught collective operation timeout|Connection closed by peer"
            r"|Connection reset by peer|NCCL error|NCCL communicator was aborted"
            r"|ncclRemoteError|ncclSystemError|DistNetworkError|DistBackendError"
            r"|gloo.*Timed out|Timed out waiting.*for (send|recv)"
        ),
    ),
)


def run_status(failure_class: FailureClass | None) -> str:
    """The status a run ends in: finished without a failure, else what its class implies."""
    return FINISHED if failure_class is None else _STATUS_OF.get(failure_class, FAILED)


def failure_mark(line: str) -> FailureClass | None:
    """The failure class one output line proves, if any."""
    return next((name for name, pattern in _MARKS if pattern.search(line)), None)


@dataclass(frozen=True)
class RankStatus:
    """One rank process as its actor sees it."""

    pid: int
    returncode: int | None  # None while it runs
    exit_after_s: float | None  # seconds from launch to exit
    idle_s: float  # seconds since launch or its last iteration line
    marks: Mapping[FailureClass, str]  # failure class -> first line that showed it
    tail: tuple[str, ...]  # its last lines


def classify_exit(statuses: Sequence[RankStatus]) -> tuple[FailureClass, str]:
    """Failure class and one-line error of a run in which some rank exited non-zero.

    What a rank printed wins over how it exited: an OOM or a configuration error anywhere is the
    cause, whatever its peers did next.  Then a rank killed by a signal without a communication
    error of its own (its peers' lost connections follow from it), then any communication error,
    else the first rank that failed crashed.
    """
    for name in (FailureClass.OOM, FailureClass.INVALID_CONFIG):
        for rank, status in enumerate(statuses):
            if name in status.marks:
                return name, one_line(f"rank {rank}: {status.marks[name]}")
    failed = [(r, s) for r, s in enumerate(statuses) if s.returncode not in (None, 0)]
    for rank, status in failed:
        if status.returncode == 2:
            return FailureClass.INVALID_CONFIG, one_line(f"rank {rank} exited 2: {_last(status)}")
    comm = FailureClass.COMM
    for rank, status in failed:
        if status.returncode < 0 and comm not in status.marks:
            name = signal.Signals(-status.returncode).name
            return FailureClass.KILLED, one_line(f"rank {rank} killed by {name}: {_last(status)}")
    for rank, status in failed:
        if comm in status.marks:
            return comm, one_line(f"rank {rank}: {status.marks[comm]}")
    rank, status = min(failed, key=lambda item: (item[1].exit_after_s or 0.0, item[0]))
    return FailureClass.CRASH, one_line(f"rank {rank} exited {status.returncode}: {_last(status)}")


def one_line(text: str) -> str:
    """A rank's ``text`` on one line, at most :data:`MAX_LINE` characters, its whitespace
    collapsed and any control character it printed escaped (:func:`errors.one_line`)."""
    return escaped_line(" ".join(text.split()))[:MAX_LINE]


def _last(status: RankStatus) -> str:
    return status.tail[-1] if status.tail else "(no output)"
