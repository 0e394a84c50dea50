"""How long a run may take, wait and stop, and how often it is tried again: one frozen
:class:`RunPolicy` with the one set of defaults that the commands' flags, the tune's settings, a
batch's :class:`~ray_layout.runtime.layout_runs.RunOptions` and each
:class:`~ray_layout.runtime.run_spec.RunSpec` all nest whole, so no copy can keep a default of its
own (``tests/runtime/test_policy.py`` walks every settings class for one)."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from ray_layout.errors import ConfigError


@dataclass(frozen=True)
class RunPolicy:
    """Timeouts, heartbeat, retries and placement of every attempt of a run.

    ``heartbeat_s`` counts from launch, so it must cover start-up and the first iteration;
    ``placement_timeout_s`` also covers waiting for other runs to free the cluster;
    ``max_retries`` counts attempts after the first, for the failure classes that are retried
    (``ray_layout.runtime.failures.RETRIED``); ``stop_grace_s`` is how long a stopped rank gets
    between SIGTERM and SIGKILL.
    """

    timeout_s: float = 3600.0  # one attempt, start-up included
    heartbeat_s: float = 900.0  # longest wait for an iteration line on any rank
    max_retries: int = 1
    placement_timeout_s: float = 3600.0  # longest wait for the run's GPUs
    stop_grace_s: float = 5.0

    def __post_init__(self) -> None:
        retries = self.max_retries
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ConfigError(f"max_retries must be a whole number >= 0, not {retries!r}")
        for item in fields(self):
            value = getattr(self, item.name)
            if item.name.endswith("_s") and not _seconds(value):
                raise ConfigError(f"{item.name} must be a finite number of seconds > 0: {value!r}")


def _seconds(value: object) -> bool:
    """A finite positive number (a bool is not one)."""
    number = isinstance(value, int | float) and not isinstance(value, bool)
    return number and math.isfinite(value) and value > 0
