"""A good layout before the exact search starts, so that pruning bites from the first node.

Balanced layouts (equal load or equal item counts per stage), then the best of them walked
downhill, one item moved from any stage to any other at a time, while the simulated step
improves (moving between any two stages, not only neighbours, lets an interleaved layout
lighten one chunk of a rank and load another rank's).
"""

from __future__ import annotations

import itertools

import numpy as np

from search.cost_model import CostModel
from search.evaluate import score
from search.schedule import Program
from search.space import LayoutSpace


def allowed(space: LayoutSpace, cuts: np.ndarray) -> bool:
    """Strictly increasing cuts with the MTP block where the space allows it."""
    if len(set(cuts.tolist())) != len(cuts) or np.any(np.diff(cuts) <= 0):
        return False
    if not space.mtp_num_layers:
        return True
    mtp_stage = int((cuts <= space.num_layers + 1).sum())
    if mtp_stage < space.first_mtp_stage:
        return False
    return space.allow_standalone_mtp or mtp_stage == space.num_stages - 1


def seed_cuts(space: LayoutSpace, load_prefix: np.ndarray) -> list[tuple[int, ...]]:
    """Evenly balanced layouts: each cut near an equal share of the total load (rounded down,
    up and to the nearest item), and equal item counts as the count rule would."""
    stages, n_items = space.num_stages, len(load_prefix) - 1
    targets = load_prefix[-1] * np.arange(1, stages) / stages
    even = np.arange(1, stages) * n_items / stages
    seeds = {tuple(int(c) for c in np.floor(even)), tuple(int(c) for c in np.ceil(even))}
    for side in ("left", "right"):
        for shift in (-1, 0, 1):
            cuts = list(np.searchsorted(load_prefix, targets, side=side) + shift)
            for i in range(len(cuts)):  # one item per stage at least, room left for the rest
                low = cuts[i - 1] + 1 if i else 1
                cuts[i] = int(min(max(cuts[i], low), n_items - (stages - 1 - i)))
            seeds.add(tuple(cuts))
    return [cuts for cuts in sorted(seeds) if allowed(space, np.array(cuts))]


def transfers(cuts: int) -> np.ndarray:
    """(moves, cuts) shifts that move one item from one stage to any other: the boundaries
    between them all move one item the same way (a single boundary when they are neighbours)."""
    stages = cuts + 1
    shifts = []
    for giver, taker in itertools.permutations(range(stages), 2):
        shift = np.zeros(cuts, dtype=np.int64)
        low, high = min(giver, taker), max(giver, taker)
        shift[low:high] = 1 if taker < giver else -1
        shifts.append(shift)
    return np.array(shifts).reshape(-1, cuts)


def downhill(
    space: LayoutSpace, program: Program, cost_model: CostModel, start: tuple[int, ...], rounds=60
) -> list[tuple[int, ...]]:
    """Move one item from any stage to any other while that makes the simulated step faster;
    the layouts visited on the way (the caller simulates them again for its top)."""
    current = np.array(start)
    counts = space.unit_counts(current[None], cost_model.units, cost_model.moe_pattern)
    current_step = score(program, cost_model, counts).noise_free_ms[0]
    visited = [tuple(int(c) for c in current)]
    items = len(space.item_counts(cost_model.units, cost_model.moe_pattern))
    shifts = transfers(len(current))
    for _ in range(rounds):
        moves = current + shifts
        moves = moves[(moves[:, 0] > 0) & (moves[:, -1] < items)]
        moves = np.array([m for m in moves if allowed(space, m)]).reshape(-1, len(current))
        if not len(moves):
            break
        counts = space.unit_counts(moves, cost_model.units, cost_model.moe_pattern)
        steps = score(program, cost_model, counts).noise_free_ms
        best = int(np.argmin(steps))
        if steps[best] >= current_step:
            break
        current, current_step = moves[best], steps[best]
        visited.append(tuple(int(c) for c in current))
    return visited
