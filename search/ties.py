"""Equal predictions are one answer: collapse them once, keep one representative and a count.

Ties are a property of the problem, not an accident: when the stage holding the output layer is
the bottleneck, every arrangement of the other stages that keeps them below it predicts the same
step to the nanosecond.  Layouts whose noise-free steps agree to ``TIE_DECIMALS`` decimals of a
millisecond form a class; its representative is chosen by the stated tie-break: fewer critical
ranks (within 2% of the bottleneck's load), then more memory headroom (a lower peak), then the
simpler layout string (shorter, then alphabetical).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from ray_layout.model.sizing import GIB

TIE_DECIMALS = 6  # ms: predictions equal to the nanosecond are the same prediction
NEAR_BOTTLENECK = 0.02  # a rank within 2% of the slowest counts as critical


def prediction_key(step_ms: np.ndarray) -> np.ndarray:
    return np.round(np.asarray(step_ms, dtype=float), TIE_DECIMALS)


def critical_ranks(rank_load_ms: np.ndarray) -> np.ndarray:
    """(n,) ranks whose load is within ``NEAR_BOTTLENECK`` of the row's largest."""
    peak = rank_load_ms.max(axis=1, keepdims=True)
    return (rank_load_ms >= (1 - NEAR_BOTTLENECK) * peak).sum(axis=1)


@dataclass(frozen=True)
class TieClass:
    """Layouts with one prediction: the representative's cut points, its tie-break key, and
    how many layouts share the prediction."""

    step_ms: float
    cuts: tuple[int, ...]
    key: tuple  # (critical ranks, peak GiB, string length, string)
    count: int


def tie_break_key(critical: int, peak_gib: float, layout: str) -> tuple:
    return (int(critical), round(float(peak_gib), 6), len(layout), layout)


def iter_tie_classes(
    step_ms: np.ndarray,
    critical: np.ndarray,
    peak_bytes: np.ndarray,
    cuts: np.ndarray,
    label: Callable[[np.ndarray], str],
) -> Iterator[TieClass]:
    """The distinct predictions in ascending order, each with its representative by the
    tie-break; ``label(cuts)`` gives a layout string, asked only of rows still tied on critical
    ranks and peak memory."""
    keys = prediction_key(step_ms)
    peak_gib = np.round(np.asarray(peak_bytes, dtype=float) / GIB, 6)
    order = np.lexsort((peak_gib, critical, keys))
    sorted_keys = keys[order]
    starts = np.flatnonzero(np.r_[True, sorted_keys[1:] != sorted_keys[:-1]])
    ends = np.r_[starts[1:], len(order)]
    for start, end in zip(starts, ends, strict=True):
        first = order[start]
        rows = order[start:end]
        tied = rows[(critical[rows] == critical[first]) & (peak_gib[rows] == peak_gib[first])]
        keyed = [tie_break_key(critical[row], peak_gib[row], label(cuts[row])) for row in tied]
        best = min(range(len(tied)), key=keyed.__getitem__)
        representative = tuple(int(c) for c in cuts[tied[best]])
        yield TieClass(float(sorted_keys[start]), representative, keyed[best], int(end - start))


def tie_classes(*arrays, limit: int | None = None) -> list[TieClass]:
    """The first ``limit`` classes of :func:`iter_tie_classes`."""
    return list(itertools.islice(iter_tie_classes(*arrays), limit))


def merge_classes(found: dict[float, TieClass], more: list[TieClass]) -> None:
    """Add ``more`` into ``found`` (by prediction): counts add up, the better key represents."""
    for tie in more:
        known = found.get(tie.step_ms)
        if known is None:
            found[tie.step_ms] = tie
            continue
        best = tie if tie.key < known.key else known
        found[tie.step_ms] = TieClass(best.step_ms, best.cuts, best.key, known.count + tie.count)
