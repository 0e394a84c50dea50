"""Recorded A/B traces re-judged offline, look by look and at the budget, as the live test
judged them: what the benchmark replays and the A/B's cost accounting reads."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from ray_layout.ab.decisions import Decision, check_arms, decide_look
from ray_layout.ab.final import final_decisions
from ray_layout.ab.looks import look_iterations
from ray_layout.ab.stats import ABConfig, ArmTrace
from ray_layout.ab.vocabulary import ABAction


def _as_of(trace: ArmTrace, steady: int, config: ABConfig) -> ArmTrace:
    """The trace as it stood when it completed ``steady`` steady iterations.  A run that got
    that far had not failed yet: its failure (if any) came later and is hidden."""
    keep = config.warmup_iterations + steady
    if len(trace.steps_ms) < keep:
        return trace
    return replace(trace, steps_ms=tuple(trace.steps_ms[:keep]), failure=None)


def replay(
    traces: Sequence[ArmTrace], config: ABConfig, first_looks: Mapping[str, int] | None = None
) -> list[Decision]:
    """Re-judge recorded traces as if all arms had run side by side at the same iteration
    pace: every look in order, each seeing the traces as they stood when the last of its arms
    reached it (an arm stopped at look k is not seen later), then the final decisions."""
    check_arms(traces)
    first_looks = first_looks or {}
    decisions: list[Decision] = []
    stopped: set[str] = set()
    for look in range(len(config.looks)):
        steady = max(look_iterations(config, look, first_looks.get(trace.arm)) for trace in traces)
        at_look = [_as_of(trace, steady, config) for trace in traces]
        for decision in decide_look(at_look, look, config, stopped, first_looks):
            decisions.append(decision)
            if decision.action is ABAction.STOP:
                stopped.add(decision.arm)
    decisions.extend(final_decisions(traces, config, stopped))
    return decisions
