"""The exact search's items and their prefix sums: a stage's cost is a difference of two, and
block recompute's part of its backward depends on where it starts."""

from __future__ import annotations

import numpy as np
import pytest

from search.item_sums import item_sums
from search.space import LayoutSpace
from tests.helpers.planner_fixtures import toy_cost_model


def test_item_sums_are_prefix_sums_of_each_items_cost():
    """Items E, t_1..t_4, the MTP block, L: a stage's cost is a difference of two sums."""
    space = LayoutSpace(4, 1, 2)
    model = toy_cost_model(2, layers=4, forward=(1.0, 10.0, 14.0, 38.0), tail_ms_per_gparam=5.0)
    sums = item_sums(model, space)
    assert sums.items == 7
    assert sums.forward.tolist() == [0, 1, 11, 21, 31, 41, 55, 93]
    assert sums.backward.tolist() == (2 * sums.forward).tolist()
    assert sums.load.tolist() == (3 * sums.forward).tolist()
    assert sums.tail[-1] - sums.tail[-2] == pytest.approx(0.13 * 5.0)  # L's parameters


@pytest.mark.parametrize("layers", [1, 2, 3])
def test_block_recompute_adds_each_stages_first_layers_forward_to_its_backward(layers):
    """Items E, t_1..t_4, the MTP block, L, with t = 10 ms forward: a stage re-runs the forward
    of its first ``layers`` layers, wherever it starts."""
    space = LayoutSpace(4, 1, 2)
    model = toy_cost_model(2, layers=4, forward=(1.0, 10.0, 14.0, 38.0), block_layers=layers)
    sums = item_sums(model, space)
    plain = sums.backward[None, :] - sums.backward[:, None]
    extra = sums.stage_backward() - plain
    for start in range(sums.items + 1):
        for end in range(start + 1, sums.items + 1):
            decoder = len(set(range(start, end)) & {1, 2, 3, 4})
            assert extra[start, end] == pytest.approx(10.0 * min(decoder, layers))
    assert np.all(extra[np.tril_indices(sums.items + 1)] == 0)  # no stage ends before it starts
