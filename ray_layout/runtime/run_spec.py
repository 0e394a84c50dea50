"""A run as the cluster shell takes it (:class:`RunSpec`) and gives it back (:class:`RunResult`).

A run may take several attempts: the first attempt's id is the run id, retry n's is
``<run id>-retry<n>``.  Every rank's output comes back to the driver through Ray
(``RunResult.outputs``); with a ``log_dir`` the driver also writes each attempt's raw logs to
``log_dir/<attempt id>/rank-<r>.log``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ray_layout.errors import ConfigError
from ray_layout.model.spec import ParallelConfig
from ray_layout.runtime.outputs import RankOutput
from ray_layout.runtime.policy import RunPolicy

# Called at every poll with the attempt id and the iteration lines the last rank printed since
# the previous call; a returned text stops the run early (class "early-stop") with it as reason.
Watch = Callable[[str, list[str]], str | None]

# The runs columns a caller may fill in for the store; the shell sets the others it knows.
LABEL_COLUMNS = frozenset({"model", "model_hash", "layout", "backend", "hardware", "source"})
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


@dataclass(frozen=True)
class RunSpec:
    """One profiling run: the same argv on every rank (python executable and script included).

    ``gpus_per_node`` GPUs of each node are used; a world that is not a multiple takes the rest
    on one more node.  ``policy`` times, retries and places every attempt.  ``labels`` fill
    :data:`LABEL_COLUMNS` of each attempt's ``runs`` row.
    """

    run_id: str
    study: str
    command: list[str]
    parallel: ParallelConfig
    gpus_per_node: int
    log_dir: Path | None = None  # where the driver also writes the raw logs; None: nowhere
    env: Mapping[str, str] = field(default_factory=dict)
    policy: RunPolicy = field(default_factory=RunPolicy)
    cpus_per_rank: float = 1.0
    labels: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, value in (("run id", self.run_id), ("study", self.study)):
            if not _ID.fullmatch(value):
                raise ConfigError(f"{name} must be letters, digits, '.', '_' or '-': {value!r}")
        if not self.command or not all(isinstance(arg, str) for arg in self.command):
            raise ConfigError(f"command must be a non-empty list of strings: {self.command!r}")
        if self.gpus_per_node < 1:
            raise ConfigError(f"gpus_per_node must be >= 1, got {self.gpus_per_node!r}")
        if not self.cpus_per_rank > 0:
            raise ConfigError(f"cpus_per_rank must be > 0, got {self.cpus_per_rank!r}")
        if set(self.labels) - LABEL_COLUMNS:
            raise ConfigError(
                f"labels may set {', '.join(sorted(LABEL_COLUMNS))} of the runs table, not "
                f"{', '.join(sorted(set(self.labels) - LABEL_COLUMNS))}"
            )


@dataclass(frozen=True)
class RunResult:
    """How a run ended, after its retries.  Lists are by global rank, of the last attempt; a
    return code is None for a rank still running when the run was stopped, or never launched.
    ``outputs`` holds what each rank printed (None: its actor was lost), empty when no rank was
    launched or the result was read back from the store; ``log_paths`` where the driver wrote
    the raw logs (empty without a ``log_dir``)."""

    run_id: str  # the last attempt's id
    status: str  # a status of ray_layout.runtime.failures
    failure_class: str | None
    returncodes: list[int | None]
    log_paths: list[Path]
    attempts: int
    error: str | None
    outputs: tuple[RankOutput | None, ...] = ()


def attempt_id(run_id: str, attempt: int) -> str:
    """The id (and log folder) of one attempt: the run id first, then ``-retry<n>``."""
    return run_id if attempt == 1 else f"{run_id}-retry{attempt - 1}"


def attempt_number(run_id: str, attempt: str) -> int:
    """The inverse of :func:`attempt_id`: which attempt of ``run_id`` the id ``attempt`` is."""
    return 1 if attempt == run_id else 1 + int(attempt.rpartition("-retry")[2])


def log_paths(spec: RunSpec, attempt: str) -> list[Path]:
    """Every rank's log file of one attempt, by global rank (none without a ``log_dir``)."""
    if spec.log_dir is None:
        return []
    folder = spec.log_dir / attempt
    return [folder / f"rank-{rank}.log" for rank in range(spec.parallel.world_size)]
