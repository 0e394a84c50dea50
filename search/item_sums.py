"""The exact search's view of a model: its items E, t_1..t_N, the MTP block and L in order, with
prefix sums of each item's costs, so that a stage holding items a..b-1 costs a difference."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ray_layout.model.sizing import DECODER_UNITS
from search.cost_model import CostModel
from search.space import LayoutSpace


@dataclass(frozen=True)
class ItemSums:
    """Prefix sums over the items E, t_1..t_N, the MTP block, L: stage costs are differences,
    but for what block recompute adds to a stage's backward, which depends on where the stage
    starts (``block[a, b]`` for items a..b-1; zero without it)."""

    forward: np.ndarray  # (items + 1,)
    backward: np.ndarray
    load: np.ndarray  # forward + backward
    tail: np.ndarray  # step tail ms of the parameters
    block: np.ndarray | None = None  # (items + 1, items + 1)

    @property
    def items(self) -> int:
        return len(self.load) - 1

    def stage_backward(self) -> np.ndarray:
        """[a, b]: the backward of a stage holding items a..b-1 (negative where b < a)."""
        plain = self.backward[None, :] - self.backward[:, None]
        return plain if self.block is None else plain + self.block


def item_sums(cost_model: CostModel, space: LayoutSpace) -> ItemSums:
    per_item = space.item_counts(cost_model.units, cost_model.moe_pattern)
    forward, backward = per_item @ cost_model.forward_ms, per_item @ cost_model.backward_ms
    tail = per_item @ cost_model.tail_params * cost_model.tail_ms_per_gparam

    def prefix(values: np.ndarray) -> np.ndarray:
        return np.concatenate([[0.0], np.cumsum(values)])

    block = None
    if cost_model.block_recompute_ms is not None:
        block = _first_layers_of_ranges(
            per_item @ cost_model.block_recompute_ms,
            per_item[:, [u in DECODER_UNITS for u in cost_model.units]].sum(axis=1) > 0,
            cost_model.block_layers,
        )
    return ItemSums(
        prefix(forward), prefix(backward), prefix(forward + backward), prefix(tail), block
    )


def _first_layers_of_ranges(per_item: np.ndarray, decoder: np.ndarray, layers: int) -> np.ndarray:
    """[a, b]: ``per_item`` summed over the first ``layers`` decoder items of items a..b-1 (the
    decoder items are consecutive)."""
    where = np.flatnonzero(decoder)
    first, end = (where[0], where[-1] + 1) if len(where) else (0, 0)
    prefix = np.concatenate([[0.0], np.cumsum(per_item)])
    a, b = np.meshgrid(np.arange(len(prefix)), np.arange(len(prefix)), indexing="ij")
    start, stop = np.clip(a, first, end), np.clip(b, first, end)
    return np.where(stop > start, prefix[np.minimum(start + layers, stop)] - prefix[start], 0.0)
