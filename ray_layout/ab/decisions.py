"""The verdicts of an A/B test: at each look, at the budget, and replayed from recorded traces.

Built on the tests of :mod:`ray_layout.ab.stats` (the module docstring there says why they are
what they are), and on the tie-break of :mod:`ray_layout.ab.ties`.  Every decision carries its
statistic, p-value and a readable reason; at the budget the verdict is chosen first
(:func:`choose_final`, a :class:`FinalChoice`) and worded after.  :func:`decision_rows` turns
decisions into rows of the cost store's ``decisions`` table and :func:`replay` re-judges
recorded traces offline, bit for bit.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum

import numpy as np

from ray_layout.ab.looks import look_iterations
from ray_layout.ab.stats import (
    ABConfig,
    ArmStats,
    ArmTrace,
    arm_stats,
    blowup_reason,
    failure_reason,
    steady_steps,
    tied_within_margin,
    worse_by_margin,
)
from ray_layout.ab.ties import TieBreakOn, critical_text, decided_on, tie_break_key, tie_loss
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


def _name(trace: ArmTrace) -> str:
    return trace.layout if trace.arm == trace.layout else f"{trace.layout} [{trace.arm}]"


def _check_arms(traces: Sequence[ArmTrace]) -> None:
    arms = [trace.arm for trace in traces]
    duplicates = sorted({arm for arm in arms if arms.count(arm) > 1})
    if duplicates:
        raise ConfigError(f"arm labels must be unique, repeated: {', '.join(duplicates)}")


def _finite_mean(values: np.ndarray) -> float:
    finite = values[np.isfinite(values)]
    return float(finite.mean()) if finite.size else math.nan


def _failure_decision(trace: ArmTrace, look: int, reason: str, config: ABConfig) -> Decision:
    steps = steady_steps(trace, config)
    return Decision(trace.arm, trace.layout, look, ABAction.STOP, reason, math.nan, math.nan,
                    None, int(steps.size), _finite_mean(steps))  # fmt: skip


def _margin(config: ABConfig) -> str:
    return f"{config.margin * 100:g}%"


def _percent(ratio: float) -> str:
    return f"{abs(ratio - 1.0) * 100:.1f}% {'slower' if ratio >= 1.0 else 'faster'}"


def _failures_stop(
    traces: Sequence[ArmTrace], look: int, config: ABConfig, stopped: Collection[str]
) -> tuple[dict[str, Decision], list[tuple[ArmTrace, np.ndarray]]]:
    """Of the arms not yet stopped: a stop for each that failed, and the others' steady steps."""
    _check_arms(traces)
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
    decided, running = _failures_stop(traces, look, config, stopped)

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
        return [Decision(trace.arm, trace.layout, look, ABAction.CONTINUE,
                         f"nothing to compare with at look {look}: the only arm with {steps} "
                         "steps", math.nan, math.nan, None, steps, float(values.mean()))
                for trace, values in judged]  # fmt: skip
    best, best_values = min(pool, key=lambda item: float(item[1].mean()))
    best_mean, best_median = float(best_values.mean()), float(np.median(best_values))
    decisions = []
    for trace, values in judged:
        mean = float(values.mean())
        if trace is best:
            decisions.append(Decision(
                trace.arm, trace.layout, look, ABAction.CONTINUE,
                f"best at look {look}: mean {mean:.1f} ms over {steps} steady iterations",
                math.nan, math.nan, None, steps, mean,
            ))  # fmt: skip
            continue
        statistic, p_value = worse_by_margin(values, best_values, config)
        blowup = blowup_reason(values, best_median, config)
        versus = f"{_percent(mean / best_mean)} than {_name(best)}"
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
            reason = (f"{versus}, tied within the {_margin(config)} margin and ahead on the "
                      f"tie-break: {_name(best)} stops")  # fmt: skip
        else:
            action = ABAction.CONTINUE
            reason = (f"{versus}, not beyond the {_margin(config)} margin yet "
                      f"(p={p_value:.2g} >= {config.alpha_per_look:.3g})")  # fmt: skip
        decisions.append(Decision(trace.arm, trace.layout, look, action, reason, statistic,
                                  p_value, best.arm, steps, mean))  # fmt: skip
    return decisions


def _settled_tie(
    trace: ArmTrace, values: np.ndarray, best: ArmTrace, best_values: np.ndarray, look: int,
    steps: int, config: ABConfig,
) -> Decision | None:  # fmt: skip
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
    reason = (f"tied with {_name(winner)} within {_margin(config)} "
              f"({_percent(loser_mean / winner_mean)}, p={p_value:.2g} < "
              f"{config.alpha_per_look:.3g}) with {lacks}: "
              "it cannot win the tie-break")  # fmt: skip
    return Decision(loser.arm, loser.layout, look, ABAction.STOP, reason, statistic, p_value,
                    winner.arm, steps, loser_mean)  # fmt: skip


class WonOn(StrEnum):
    """What made the final winner: its mean alone, or the tie-break among arms tied with it."""

    TIME = "time"  # no other arm within the margin of the fastest
    CRITICAL = "critical"  # every tied arm has more critical stages
    HEADROOM = "headroom"  # every tied arm has as many critical stages, but less headroom
    TIE_BREAK = "tie-break"  # some tied arms lost on critical stages, the others on headroom
    TIME_AMONG_TIED = "time among tied"  # some tied arm differs from it in the mean alone


@dataclass(frozen=True, eq=False)
class FinalArm:
    """A qualified arm at the budget: its steady steps up to the budget, whole batches only."""

    trace: ArmTrace
    stats: ArmStats
    values: np.ndarray


@dataclass(frozen=True)
class FinalLoss:
    """Why a qualified arm lost at the budget, and the test against its reference."""

    arm: FinalArm
    reference: FinalArm  # the winner where tied with it, else the fastest arm
    lost_on: TieBreakOn | None  # tied: the tie-break's deciding part; None: beyond the margin
    statistic: float
    p_value: float


@dataclass(frozen=True)
class FinalChoice:
    """The verdict at the budget, before it is put in words."""

    winner: FinalArm
    won_on: WonOn
    fastest: FinalArm
    tied: int  # arms within the margin of the fastest, the winner included
    runner_up: FinalArm | None  # the fastest of the others (named when it won on time alone)
    losses: tuple[FinalLoss, ...]  # in the order the arms came


def choose_final(running: Sequence[tuple[ArmTrace, np.ndarray]], config: ABConfig
                 ) -> FinalChoice | None:  # fmt: skip
    """The winner and every loser at the budget among healthy arms' steady steps: qualified are
    arms with at least 2 whole batches up to the budget; those within ``(1 + margin)`` of the
    fastest mean are tied and :func:`tie_break_key` picks among them; every other qualified arm
    loses.  None when no arm qualifies."""
    budget = config.look_iterations(len(config.looks) - 1)
    qualified = []
    for trace, values in running:
        summary = arm_stats(values[:budget], config)
        if summary.batches >= 2:
            qualified.append(FinalArm(trace, summary, values[: summary.n]))
    if not qualified:
        return None
    fastest = min(qualified, key=lambda item: item.stats.mean_ms)
    limit = (1.0 + config.margin) * fastest.stats.mean_ms
    tied = [item for item in qualified if item.stats.mean_ms <= limit]

    def key(item: FinalArm) -> tuple[float, float, float]:
        return tie_break_key(item.trace, item.stats.mean_ms)

    win = min(tied, key=key)
    losses = []
    for item in qualified:
        if item is win:
            continue
        lost_on = decided_on(key(item), key(win)) if item.stats.mean_ms <= limit else None
        reference = fastest if lost_on is None else win
        statistic, p_value = worse_by_margin(item.values, reference.values, config)
        losses.append(FinalLoss(item, reference, lost_on, statistic, p_value))
    runner_up = min((loss.arm for loss in losses), key=lambda item: item.stats.mean_ms,
                    default=None)  # fmt: skip
    won_on = _won_on({loss.lost_on for loss in losses if loss.lost_on is not None})
    return FinalChoice(win, won_on, fastest, len(tied), runner_up, tuple(losses))


def _won_on(parts: set[TieBreakOn]) -> WonOn:
    """What made the winner, from what decided against each arm tied with it."""
    if not parts:
        return WonOn.TIME
    if parts == {TieBreakOn.CRITICAL}:
        return WonOn.CRITICAL
    if parts == {TieBreakOn.HEADROOM}:
        return WonOn.HEADROOM
    return WonOn.TIME_AMONG_TIED if TieBreakOn.TIME in parts else WonOn.TIE_BREAK


def _won(choice: FinalChoice, config: ABConfig) -> str:
    """Why the winner won, in words."""
    win, among = choice.winner, f"among {choice.tied} tied within {_margin(config)}"
    mean = f"mean {win.stats.mean_ms:.1f} ms"
    versus = f"({_percent(win.stats.mean_ms / choice.fastest.stats.mean_ms)} than the fastest)"
    if choice.won_on is WonOn.TIME:
        reason = f"won on time: {mean}"
        if choice.runner_up is not None:
            ratio = choice.runner_up.stats.mean_ms / win.stats.mean_ms
            reason += f", next {_name(choice.runner_up.trace)} is {_percent(ratio)}"
        return reason
    if choice.won_on is WonOn.CRITICAL:
        return f"won on fewer critical stages {among}: {critical_text(win.trace)}, {mean} {versus}"
    if choice.won_on is WonOn.HEADROOM:
        free = f"{win.trace.headroom_gib:.1f} GiB free"
        return f"won on memory headroom {among}: {free}, {mean} {versus}"
    if choice.won_on is WonOn.TIE_BREAK:
        return f"won the tie-break (fewer critical stages, then memory headroom) {among}: {mean}"
    return f"won on time {among} with equal or unknown memory headroom: {mean}"


def _lost(loss: FinalLoss, config: ABConfig) -> str:
    """Why a qualified arm lost, in words."""
    arm, reference = loss.arm, loss.reference
    ratio = _percent(arm.stats.mean_ms / reference.stats.mean_ms)
    if loss.lost_on is None:
        return (f"{ratio} than {_name(reference.trace)} at the budget, beyond the "
                f"{_margin(config)} margin")  # fmt: skip
    tied_with = f"tied with {_name(reference.trace)} within {_margin(config)}"
    if loss.lost_on is TieBreakOn.TIME:
        return f"{tied_with} and equal or unknown memory headroom, but {ratio}"
    lacks = tie_loss(arm.trace, arm.stats.mean_ms, reference.trace, reference.stats.mean_ms)
    return f"{tied_with} ({ratio}) but {lacks}"


def final_decisions(
    traces: Sequence[ArmTrace], config: ABConfig, stopped: Collection[str] = ()
) -> list[Decision]:
    """The verdict at the budget (look index ``len(config.looks)``), in the order of ``traces``:
    :func:`choose_final` over the not-stopped healthy arms, each using all its steady steps up
    to the budget, then put in words.  A not-stopped arm with a failure gets "stop".  Empty when
    no arm qualifies and none failed."""
    look = len(config.looks)
    decided, running = _failures_stop(traces, look, config, stopped)
    choice = choose_final(running, config)
    if choice is not None:
        win = choice.winner
        decided[win.trace.arm] = Decision(win.trace.arm, win.trace.layout, look, ABAction.WIN,
                                          _won(choice, config), math.nan, math.nan, None,
                                          win.stats.n, win.stats.mean_ms)  # fmt: skip
        for loss in choice.losses:
            trace, stats = loss.arm.trace, loss.arm.stats
            decided[trace.arm] = Decision(trace.arm, trace.layout, look, ABAction.LOSE,
                                          _lost(loss, config), loss.statistic, loss.p_value,
                                          loss.reference.trace.arm, stats.n,
                                          stats.mean_ms)  # fmt: skip
    return [decided[trace.arm] for trace in traces if trace.arm in decided]


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
    _check_arms(traces)
    first_looks = first_looks or {}
    decisions: list[Decision] = []
    stopped: set[str] = set()
    for look in range(len(config.looks)):
        steady = max(look_iterations(config, look, first_looks.get(trace.arm))
                     for trace in traces)  # fmt: skip
        at_look = [_as_of(trace, steady, config) for trace in traces]
        for decision in decide_look(at_look, look, config, stopped, first_looks):
            decisions.append(decision)
            if decision.action is ABAction.STOP:
                stopped.add(decision.arm)
    decisions.extend(final_decisions(traces, config, stopped))
    return decisions


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
        rows.append({
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
        })  # fmt: skip
    ids = [row["decision_id"] for row in rows]
    if len(set(ids)) != len(ids):
        raise ValueError(f"two decisions for the same arm and look in test {test_id}")
    return rows
