"""What an A/B test cost in GPU time, and what it would have cost without early stopping; and,
for a replayed test, how far each arm would have run."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ray_layout.ab.decisions import Decision
from ray_layout.ab.looks import look_iterations
from ray_layout.ab.stats import ABConfig, ArmTrace, is_whole_number
from ray_layout.ab.vocabulary import ABAction
from ray_layout.errors import ConfigError


@dataclass(frozen=True)
class ArmCost:
    """What one arm cost in GPU time, and what it was allowed to cost."""

    world_size: int
    overhead_s: float  # start-up before the first iteration
    steps_ms: tuple[float, ...]  # what it ran
    budget_iterations: int

    def __post_init__(self) -> None:
        if not is_whole_number(self.world_size) or self.world_size < 1:
            raise ConfigError(f"world_size must be a positive integer, got {self.world_size!r}")
        if not is_whole_number(self.budget_iterations) or self.budget_iterations < 0:
            raise ConfigError(
                f"budget_iterations must be an integer >= 0, got {self.budget_iterations!r}"
            )


def gpu_seconds(arms: Sequence[ArmCost]) -> tuple[float, float]:
    """(spent, full): GPU-seconds the arms used, and what running every arm to its budget would
    have cost (its mean finite step times the budget).  Non-finite steps (a hang's inf) are left
    out of both; an arm without a finite step counts what it spent for full too."""
    spent = full = 0.0
    for arm in arms:
        steps = np.asarray(arm.steps_ms, dtype=float)
        finite = steps[np.isfinite(steps)]
        used = arm.world_size * (arm.overhead_s + float(finite.sum()) / 1000.0)
        spent += used
        if finite.size:
            per_step_s = float(finite.mean()) / 1000.0
            full += arm.world_size * (arm.overhead_s + per_step_s * arm.budget_iterations)
        else:
            full += used
    return spent, full


def replayed_iterations(
    traces: Sequence[ArmTrace],
    decisions: Sequence[Decision],
    config: ABConfig,
    first_looks: Mapping[str, int] | None = None,
) -> dict[str, int]:
    """Iterations (warm-up included) each arm would have run side by side, as
    :func:`~ray_layout.ab.replay.replay` judged it: a stopped arm up to the look that stopped
    it; a lone survivor until its first look and the last other arm's stop (the live test's
    "settled"); several survivors their whole budget.  Never more than a trace holds."""
    first_looks = first_looks or {}
    stops = {d.arm: d for d in decisions if d.action is ABAction.STOP}
    ran = {}
    for trace in traces:
        if trace.arm in stops:
            ran[trace.arm] = config.warmup_iterations + stops[trace.arm].n_steady
    survivors = [trace for trace in traces if trace.arm not in stops]
    for trace in survivors:
        if len(survivors) == 1:
            first = config.warmup_iterations + look_iterations(
                config, 0, first_looks.get(trace.arm)
            )
            ran[trace.arm] = max([first, *ran.values()])
        else:
            ran[trace.arm] = config.max_iterations
    return {trace.arm: min(ran[trace.arm], len(trace.steps_ms)) for trace in traces}
