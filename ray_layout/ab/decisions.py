"""The verdicts of an A/B test at each look, and the decision every verdict is.

Built on the tests of :mod:`ray_layout.ab.stats` (the module docstring there says why they are
what they are), and on the tie-break of :mod:`ray_layout.ab.tie_break`.  Every decision carries its
statistic, p-value and a readable reason.  The verdict at the budget is
:mod:`ray_layout.ab.final`; :mod:`ray_layout.ab.replay` re-judges recorded traces offline, bit for
bit; :func:`decision_rows` turns decisions into rows of the cost store's ``decisions`` table.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ray_layout.ab.looks import look_iterations
from ray_layout.ab.stats import (
    ABConfig,
    ArmTrace,
    blowup_reason,
    failure_reason,
    steady_steps,
    tied_within_margin,
    worse_by_margin,
)
from ray_layout.ab.tie_break import tie_break_key, tie_loss
from ray_layout.ab.vocabulary import ABAction
from ray_layout.errors import ConfigError


@dataclass(frozen=True)
class Decision:
    """One verdict on one arm at one look, with the evidence to replay and audit it."""

    arm: str
    layout: str
    look: int  # 0-based look index; len(config.looks) for the final decision
    action: ABAction
    reason: str  # one readable line
    statistic: float  # Welch t of (arm - (1 + margin) x reference); nan when no test was made
    p_value: float  # nan when no test
    reference: str | None  # the arm it was compared with; None for the best / failures
    n_steady: int
    mean_ms: float  # the arm's mean over the steady iterations the decision used (nan if none)


def arm_name(trace: ArmTrace) -> str:
    return trace.layout if trace.arm == trace.layout else f"{trace.layout} [{trace.arm}]"


def check_arms(traces: Sequence[ArmTrace]) -> None:
    arms = [trace.arm for trace in traces]
    duplicates = sorted({arm for arm in arms if arms.count(arm) > 1})
    if duplicates:
        raise ConfigError(f"arm labels must be unique, repeated: {', '.join(duplicates)}")


def _finite_mean(values: np.ndarray) -> float:
    finite = values[np.isfinite(values)]
    return float(finite.mean()) if finite.size else math.nan


def _failure_decision(trace: ArmTrace, look: int, reason: str, config: ABConfig) -> Decision:
    steps = steady_steps(trace, config)
    return Decision(
        trace.arm,
        trace.layout,
        look,
        ABAction.STOP,
        reason,
        math.nan,
        math.nan,
        None,
        int(steps.size),
        _finite_mean(steps),
    )


def margin_text(config: ABConfig) -> str:
    return f"{config.margin * 100:g}%"


def percent_text(ratio: float) -> str:
    return f"{abs(ratio - 1.0) * 100:.1f}% {'slower' if ratio >= 1.0 else 'faster'}"


def failures_stop(
    traces: Sequence[ArmTrace], look: int, config: ABConfig, stopped: Collection[str]
) -> tuple[dict[str, Decision], list[tuple[ArmTrace, np.ndarray]]]:
    """Of the arms not yet stopped: a stop for each that failed, and the others' steady steps."""
    check_arms(traces)
    decided: dict[str, Decision] = {}
    running: list[tuple[ArmTrace, np.ndarray]] = []
    for trace in traces:
        if trace.arm in stopped:
            continue
        reason = failure_reason(trace, config)
        if reason is None:
            running.append((trace, steady_steps(trace, config)))
        else:
            decided[trace.arm] = _failure_decision(trace, look, reason, config)
    return decided, running


def decide_look(
    traces: Sequence[ArmTrace],
    look: int,
    config: ABConfig,
    stopped: Collection[str] = (),
    first_looks: Mapping[str, int] | None = None,
) -> list[Decision]:
    """Decisions at interim look ``look``, in the order of ``traces``.

    Judged: every arm not in ``stopped`` with at least its look's steady steps (``first_looks``
    moves an arm's first look, :mod:`ray_layout.ab.looks`), truncated to exactly that many
    (so neither how far an arm ran past the look nor wall-clock timing changes the outcome), and
    every not-stopped arm with a failure, which stops.  Each arm is compared with the arm of the
    lowest mean over the same number of steps: the best continues; another stops on a blow-up
    or when it is worse than the best by more than the margin at level ``alpha_per_look``.  An
    arm shown tied with the best within the margin at that level (two one-sided tests) settles
    the pair: the one that loses the tie-break stops, the arm or the best.  Else it continues.
    """
    first_looks = first_looks or {}
    decided, running = failures_stop(traces, look, config, stopped)

    def needed(trace: ArmTrace) -> int:
        return look_iterations(config, look, first_looks.get(trace.arm))

    for steps in sorted({needed(trace) for trace, _ in running}):
        pool = [(trace, values[:steps]) for trace, values in running if values.size >= steps]
        judged = [(trace, values) for trace, values in pool if needed(trace) == steps]
        for decision in _judge(pool, judged, look, steps, config):
            known = decided.get(decision.arm)
            if known is None or known.action is not ABAction.STOP:
                decided[decision.arm] = decision
    return [decided[trace.arm] for trace in traces if trace.arm in decided]


def _judge(
    pool: list[tuple[ArmTrace, np.ndarray]],
    judged: list[tuple[ArmTrace, np.ndarray]],
    look: int,
    steps: int,
    config: ABConfig,
) -> list[Decision]:
    """The decisions on ``judged``, each against the best of ``pool`` (all over ``steps``
    steady steps), and the best's stop should it lose a tie-break."""
    if len(pool) < 2:
        return [
            Decision(
                trace.arm,
                trace.layout,
                look,
                ABAction.CONTINUE,
                f"nothing to compare with at look {look}: the only arm with {steps} steps",
                math.nan,
                math.nan,
                None,
                steps,
                float(values.mean()),
            )
            for trace, values in judged
        ]
    best, best_values = min(pool, key=lambda item: float(item[1].mean()))
    best_mean, best_median = float(best_values.mean()), float(np.median(best_values))
    decisions = []
    for trace, values in judged:
        mean = float(values.mean())
        if trace is best:
            decisions.append(
                Decision(
                    trace.arm,
                    trace.layout,
                    look,
                    ABAction.CONTINUE,
                    f"best at look {look}: mean {mean:.1f} ms over {steps} steady iterations",
                    math.nan,
                    math.nan,
                    None,
                    steps,
                    mean,
                )
            )
            continue
        statistic, p_value = worse_by_margin(values, best_values, config)
        blowup = blowup_reason(values, best_median, config)
        versus = f"{percent_text(mean / best_mean)} than {arm_name(best)}"
        if blowup is not None:
            action, reason = ABAction.STOP, blowup
        elif p_value < config.alpha_per_look:
            action = ABAction.STOP
            reason = f"{versus} (p={p_value:.2g} < {config.alpha_per_look:.3g})"
        elif (
            tie := _settled_tie(trace, values, best, best_values, look, steps, config)
        ) is not None:
            decisions.append(tie)  # the stop of this arm, or of the best
            if tie.arm == trace.arm:
                continue
            action, statistic, p_value = ABAction.CONTINUE, tie.statistic, tie.p_value
            reason = (
                f"{versus}, tied within the {margin_text(config)} margin and ahead on the "
                f"tie-break: {arm_name(best)} stops"
            )
        else:
            action = ABAction.CONTINUE
            reason = (
                f"{versus}, not beyond the {margin_text(config)} margin yet "
                f"(p={p_value:.2g} >= {config.alpha_per_look:.3g})"
            )
        decisions.append(
            Decision(
                trace.arm,
                trace.layout,
                look,
                action,
                reason,
                statistic,
                p_value,
                best.arm,
                steps,
                mean,
            )
        )
    return decisions


def _settled_tie(
    trace: ArmTrace,
    values: np.ndarray,
    best: ArmTrace,
    best_values: np.ndarray,
    look: int,
    steps: int,
    config: ABConfig,
) -> Decision | None:
    """When the arm is tied with the best within the margin, with confidence: the stop of
    whichever of the two loses the tie-break (more steps cannot change the verdict)."""
    statistic, p_value = tied_within_margin(values, best_values, config)
    if not p_value < config.alpha_per_look:
        return None
    mean, best_mean = float(values.mean()), float(best_values.mean())
    if tie_break_key(trace, mean) < tie_break_key(best, best_mean):
        loser, loser_mean, winner, winner_mean = best, best_mean, trace, mean
    else:
        loser, loser_mean, winner, winner_mean = trace, mean, best, best_mean
    lacks = tie_loss(loser, loser_mean, winner, winner_mean)
    reason = (
        f"tied with {arm_name(winner)} within {margin_text(config)} "
        f"({percent_text(loser_mean / winner_mean)}, p={p_value:.2g} < "
        f"{config.alpha_per_look:.3g}) with {lacks}: "
        "it cannot win the tie-break"
    )
    return Decision(
        loser.arm,
        loser.layout,
        look,
        ABAction.STOP,
        reason,
        statistic,
        p_value,
        winner.arm,
        steps,
        loser_mean,
    )


def winner(decisions: Sequence[Decision]) -> Decision | None:
    """The winning decision, if the test reached one."""
    return next((d for d in reversed(decisions) if d.action is ABAction.WIN), None)


def decision_rows(
    decisions: Sequence[Decision],
    study: str,
    run_ids: Mapping[str, str],
    test_id: str,
    now: float,
) -> list[dict]:
    """Rows of the cost store's ``decisions`` table; ``decision_id`` is deterministic, so writing
    the same test twice is recognisable."""
    rows = []
    for d in decisions:
        rows.append(
            {
                "study": study,
                "decision_id": f"{test_id}.{d.arm}.look{d.look}",
                "run_id": run_ids.get(d.arm),
                "layout": d.layout,
                "look": int(d.look),
                "statistic": float(d.statistic),
                "p_value": float(d.p_value),
                "action": d.action.value,
                "reason": d.reason,
                "created_at": float(now),
            }
        )
    ids = [row["decision_id"] for row in rows]
    if len(set(ids)) != len(ids):
        raise ValueError(f"two decisions for the same arm and look in test {test_id}")
    return rows
