"""The verdicts of an A/B test: at each look, at the budget, and replayed from recorded traces.

Built on the tests of :mod:`ray_layout.ab.stats` (the module docstring there says why they are
what they are).  Every decision carries its statistic, p-value and a readable reason;
:func:`decision_rows` turns decisions into rows of the cost store's ``decisions`` table and
:func:`replay` re-judges recorded traces offline, bit for bit.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from ray_layout.ab.schedule import look_iterations
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


def _gib(trace: ArmTrace) -> str:
    value = trace.headroom_gib
    return "unknown" if value is None or math.isnan(value) else f"{value:.1f} GiB"


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
    moves an arm's first look, :mod:`ray_layout.ab.schedule`), truncated to exactly that many
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


def _known(headroom: float | None) -> bool:
    return headroom is not None and math.isfinite(headroom)


def tie_break_key(trace: ArmTrace, mean_ms: float) -> tuple[float, float, float]:
    """Lower wins among tied arms: fewer critical stages, then more memory headroom, then the
    lower mean; unknown critical stages and unknown headroom count worst."""
    critical = math.inf if trace.critical_stages is None else float(trace.critical_stages)
    headroom = float(trace.headroom_gib) if _known(trace.headroom_gib) else -math.inf
    return critical, -headroom, mean_ms


def _decided_on(loser_key: tuple, winner_key: tuple) -> str:
    """Which part of the tie-break decided: "critical", "headroom" or "time"."""
    if loser_key[0] != winner_key[0]:
        return "critical"
    return "headroom" if loser_key[1] != winner_key[1] else "time"


def _critical(trace: ArmTrace) -> str:
    return "unknown" if trace.critical_stages is None else str(trace.critical_stages)


def _tie_loss(loser: ArmTrace, loser_mean: float, winner: ArmTrace, winner_mean: float) -> str:
    """What the loser of a tie-break lacks against the winner, in words."""
    decided = _decided_on(tie_break_key(loser, loser_mean), tie_break_key(winner, winner_mean))
    if decided == "critical":
        return f"more critical stages ({_critical(loser)} vs {_critical(winner)})"
    if decided == "headroom":
        return f"less memory headroom ({_gib(loser)} vs {_gib(winner)})"
    return "equal or unknown memory headroom and a higher mean"


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
    lacks = _tie_loss(loser, loser_mean, winner, winner_mean)
    reason = (f"tied with {_name(winner)} within {_margin(config)} "
              f"({_percent(loser_mean / winner_mean)}, p={p_value:.2g} < "
              f"{config.alpha_per_look:.3g}) with {lacks}: "
              "it cannot win the tie-break")  # fmt: skip
    return Decision(loser.arm, loser.layout, look, ABAction.STOP, reason, statistic, p_value,
                    winner.arm, steps, loser_mean)  # fmt: skip


def final_decisions(
    traces: Sequence[ArmTrace], config: ABConfig, stopped: Collection[str] = ()
) -> list[Decision]:
    """The verdict at the budget (look index ``len(config.looks)``), in the order of ``traces``.

    Qualified: not-stopped healthy arms with at least 2 whole batches, each using all its steady
    steps up to the budget.  Arms within ``(1 + margin)`` of the fastest mean are tied, and the
    tie-break picks among them (:func:`tie_break_key`: fewer critical stages, more memory
    headroom, the lower mean); every other qualified arm loses.  A not-stopped arm with a failure
    gets "stop".  Empty when no arm qualifies and none failed.
    """
    look = len(config.looks)
    budget = config.look_iterations(look - 1)
    decided, running = _failures_stop(traces, look, config, stopped)
    qualified: list[tuple[ArmTrace, ArmStats, np.ndarray]] = []
    for trace, values in running:
        summary = arm_stats(values[:budget], config)
        if summary.batches >= 2:
            qualified.append((trace, summary, values[: summary.n]))
    if not qualified:
        return [decided[trace.arm] for trace in traces if trace.arm in decided]

    fastest = min(qualified, key=lambda item: item[1].mean_ms)
    limit = (1.0 + config.margin) * fastest[1].mean_ms
    tied = [item for item in qualified if item[1].mean_ms <= limit]
    win = min(tied, key=lambda item: tie_break_key(item[0], item[1].mean_ms))
    win_trace, win_stats, win_values = win
    others = [item for item in tied if item is not win]
    win_key = tie_break_key(win_trace, win_stats.mean_ms)
    decided_on = {_decided_on(tie_break_key(item[0], item[1].mean_ms), win_key)
                  for item in others}  # fmt: skip
    if not others:
        runner_up = min((item for item in qualified if item is not win),
                        key=lambda item: item[1].mean_ms, default=None)  # fmt: skip
        reason = f"won on time: mean {win_stats.mean_ms:.1f} ms"
        if runner_up is not None:
            ratio = runner_up[1].mean_ms / win_stats.mean_ms
            reason += f", next {_name(runner_up[0])} is {_percent(ratio)}"
    elif decided_on == {"critical"}:
        versus = _percent(win_stats.mean_ms / fastest[1].mean_ms)
        reason = (f"won on fewer critical stages among {len(tied)} tied within "
                  f"{_margin(config)}: {_critical(win_trace)}, mean {win_stats.mean_ms:.1f} ms "
                  f"({versus} than the fastest)")  # fmt: skip
    elif decided_on == {"headroom"}:
        versus = _percent(win_stats.mean_ms / fastest[1].mean_ms)
        reason = (f"won on memory headroom among {len(tied)} tied within {_margin(config)}: "
                  f"{win_trace.headroom_gib:.1f} GiB free, mean {win_stats.mean_ms:.1f} ms "
                  f"({versus} than the fastest)")  # fmt: skip
    elif "time" not in decided_on:
        reason = (f"won the tie-break (fewer critical stages, then memory headroom) among "
                  f"{len(tied)} tied within {_margin(config)}: "
                  f"mean {win_stats.mean_ms:.1f} ms")  # fmt: skip
    else:
        reason = (f"won on time among {len(tied)} tied within {_margin(config)} with equal or "
                  f"unknown memory headroom: mean {win_stats.mean_ms:.1f} ms")  # fmt: skip
    decided[win_trace.arm] = Decision(win_trace.arm, win_trace.layout, look, ABAction.WIN,
                                      reason, math.nan, math.nan, None, win_stats.n,
                                      win_stats.mean_ms)  # fmt: skip

    for item in qualified:
        trace, summary, values = item
        if item is win:
            continue
        if any(item is other for other in others):
            reference, ref_values = win_trace, win_values
            ratio = summary.mean_ms / win_stats.mean_ms
            tied_with = f"tied with {_name(win_trace)} within {_margin(config)}"
            key = tie_break_key(trace, summary.mean_ms)
            if _decided_on(key, win_key) == "time":
                reason = f"{tied_with} and equal or unknown memory headroom, but {_percent(ratio)}"
            else:
                lacks = _tie_loss(trace, summary.mean_ms, win_trace, win_stats.mean_ms)
                reason = f"{tied_with} ({_percent(ratio)}) but {lacks}"
        else:
            reference, ref_values = fastest[0], fastest[2]
            ratio = summary.mean_ms / fastest[1].mean_ms
            reason = (f"{_percent(ratio)} than {_name(reference)} at the budget, beyond the "
                      f"{_margin(config)} margin")  # fmt: skip
        statistic, p_value = worse_by_margin(values, ref_values, config)
        decided[trace.arm] = Decision(trace.arm, trace.layout, look, ABAction.LOSE, reason,
                                      statistic, p_value, reference.arm, summary.n,
                                      summary.mean_ms)  # fmt: skip
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
