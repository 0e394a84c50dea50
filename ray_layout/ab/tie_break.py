"""The tie-break among arms within the margin of each other, and what its loser lacks in words.

More steps cannot tell such arms apart, so the search's own tie-break picks among them (the
module docstring of :mod:`ray_layout.ab.stats` says why): fewer critical stages, then more
memory headroom, then the lower mean.
"""

from __future__ import annotations

import math
from enum import StrEnum

from ray_layout.ab.stats import ArmTrace


class TieBreakOn(StrEnum):
    """The part of :func:`tie_break_key` that decided between two tied arms."""

    CRITICAL = "critical"
    HEADROOM = "headroom"
    TIME = "time"


def _known(headroom: float | None) -> bool:
    return headroom is not None and math.isfinite(headroom)


def tie_break_key(trace: ArmTrace, mean_ms: float) -> tuple[float, float, float]:
    """Lower wins among tied arms: fewer critical stages, then more memory headroom, then the
    lower mean; unknown critical stages and unknown headroom count worst."""
    critical = math.inf if trace.critical_stages is None else float(trace.critical_stages)
    headroom = float(trace.headroom_gib) if _known(trace.headroom_gib) else -math.inf
    return critical, -headroom, mean_ms


def decided_on(loser_key: tuple, winner_key: tuple) -> TieBreakOn:
    """Which part of two :func:`tie_break_key` keys tells them apart."""
    if loser_key[0] != winner_key[0]:
        return TieBreakOn.CRITICAL
    return TieBreakOn.HEADROOM if loser_key[1] != winner_key[1] else TieBreakOn.TIME


def critical_text(trace: ArmTrace) -> str:
    """The arm's critical stages as shown, "unknown" without a prediction."""
    return "unknown" if trace.critical_stages is None else str(trace.critical_stages)


def _gib(trace: ArmTrace) -> str:
    value = trace.headroom_gib
    return "unknown" if value is None or math.isnan(value) else f"{value:.1f} GiB"


def tie_loss(loser: ArmTrace, loser_mean: float, winner: ArmTrace, winner_mean: float) -> str:
    """What the loser of a tie-break lacks against the winner, in words."""
    decided = decided_on(tie_break_key(loser, loser_mean), tie_break_key(winner, winner_mean))
    if decided is TieBreakOn.CRITICAL:
        return f"more critical stages ({critical_text(loser)} vs {critical_text(winner)})"
    if decided is TieBreakOn.HEADROOM:
        return f"less memory headroom ({_gib(loser)} vs {_gib(winner)})"
    return "equal or unknown memory headroom and a higher mean"
