"""How long a run may take, wait and stop, and how often it is tried again: one frozen
:class:`RunPolicy` with the one set of defaults that the commands' flags (its fields are the
``runs`` flags of the profile and tune commands), the tune's settings, a batch's
:class:`~ray_layout.runtime.layout_runs.RunOptions` and each
:class:`~ray_layout.runtime.run_spec.RunSpec` all nest whole, so no copy can keep a default of its
own (``tests/runtime/test_policy.py`` walks every settings class for one)."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

from ray_layout.errors import ConfigError
from ray_layout.options.checks import at_least, finite, positive
from ray_layout.options.flag_fields import check_options, option

RUNS = "runs"  # the help's section of the run policy's flags


def _seconds_flag(default: float, help: str) -> Any:
    return option(default, help=help, group=RUNS, checks=[positive, finite])


@dataclass(frozen=True)
class RunPolicy:
    """Timeouts, heartbeat, retries and placement of every attempt of a run.

    ``heartbeat_s`` counts from launch, so it must cover start-up and the first iteration;
    ``placement_timeout_s`` also covers waiting for other runs to free the cluster;
    ``max_retries`` counts attempts after the first, for the failure classes that are retried
    (``ray_layout.runtime.failures.RETRIED``); ``stop_grace_s`` is how long a stopped rank gets
    between SIGTERM and SIGKILL.
    """

    timeout_s: float = _seconds_flag(3600.0, "one attempt of a run, start-up included")
    heartbeat_s: float = _seconds_flag(
        900.0, "longest wait for an iteration line, counted from launch"
    )
    max_retries: int = option(
        1,
        help="attempts after a node-lost, killed, comm, hang or timeout failure",
        group=RUNS,
        checks=[at_least(0)],
    )
    placement_timeout_s: float = _seconds_flag(3600.0, "longest wait for a run's GPUs")
    stop_grace_s: float = 5.0  # no flag

    def __post_init__(self) -> None:
        retries = self.max_retries
        if isinstance(retries, bool) or not isinstance(retries, int):
            raise ConfigError(f"max_retries must be a whole number >= 0, not {retries!r}")
        for item in fields(self):  # a number before any check compares it
            value = getattr(self, item.name)
            if item.name.endswith("_s") and not _number(value):
                raise ConfigError(f"{item.name} must be a finite number of seconds > 0: {value!r}")
        check_options(self)  # "--timeout-s must be positive, got 0", as the command line says
        if not 0 < self.stop_grace_s < math.inf:
            raise ConfigError(
                f"stop_grace_s must be a finite number of seconds > 0: {self.stop_grace_s!r}"
            )


def _number(value: object) -> bool:
    """An int or a float (a bool is not one)."""
    return isinstance(value, int | float) and not isinstance(value, bool)
