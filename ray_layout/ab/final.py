"""The verdict at the budget: choose the winner first (:func:`choose_final`, a
:class:`FinalChoice`), then put it in words (:func:`final_decisions`)."""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from enum import StrEnum

import numpy as np

from ray_layout.ab.decisions import (
    Decision,
    arm_name,
    failures_stop,
    margin_text,
    percent_text,
)
from ray_layout.ab.stats import ABConfig, ArmStats, ArmTrace, arm_stats, worse_by_margin
from ray_layout.ab.tie_break import TieBreakOn, critical_text, decided_on, tie_break_key, tie_loss
from ray_layout.ab.vocabulary import ABAction


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


def choose_final(
    running: Sequence[tuple[ArmTrace, np.ndarray]], config: ABConfig
) -> FinalChoice | None:
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
    runner_up = min(
        (loss.arm for loss in losses), key=lambda item: item.stats.mean_ms, default=None
    )
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
    win, among = choice.winner, f"among {choice.tied} tied within {margin_text(config)}"
    mean = f"mean {win.stats.mean_ms:.1f} ms"
    versus = f"({percent_text(win.stats.mean_ms / choice.fastest.stats.mean_ms)} than the fastest)"
    if choice.won_on is WonOn.TIME:
        reason = f"won on time: {mean}"
        if choice.runner_up is not None:
            ratio = choice.runner_up.stats.mean_ms / win.stats.mean_ms
            reason += f", next {arm_name(choice.runner_up.trace)} is {percent_text(ratio)}"
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
    ratio = percent_text(arm.stats.mean_ms / reference.stats.mean_ms)
    if loss.lost_on is None:
        return (
            f"{ratio} than {arm_name(reference.trace)} at the budget, beyond the "
            f"{margin_text(config)} margin"
        )
    tied_with = f"tied with {arm_name(reference.trace)} within {margin_text(config)}"
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
    decided, running = failures_stop(traces, look, config, stopped)
    choice = choose_final(running, config)
    if choice is not None:
        win = choice.winner
        decided[win.trace.arm] = Decision(
            win.trace.arm,
            win.trace.layout,
            look,
            ABAction.WIN,
            _won(choice, config),
            math.nan,
            math.nan,
            None,
            win.stats.n,
            win.stats.mean_ms,
        )
        for loss in choice.losses:
            trace, stats = loss.arm.trace, loss.arm.stats
            decided[trace.arm] = Decision(
                trace.arm,
                trace.layout,
                look,
                ABAction.LOSE,
                _lost(loss, config),
                loss.statistic,
                loss.p_value,
                loss.reference.trace.arm,
                stats.n,
                stats.mean_ms,
            )
    return [decided[trace.arm] for trace in traces if trace.arm in decided]
