"""The exact search's first incumbents: balanced seeds the space allows, one-item moves between
any two stages, and a downhill walk that ends where no such move is faster."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from search.evaluate import score
from search.incumbent import allowed, downhill, seed_cuts, transfers
from search.item_sums import item_sums
from search.space import LayoutSpace
from tests.helpers.planner_fixtures import toy_case, toy_cost_model


def test_allowed_cuts_increase_and_keep_the_mtp_block_where_the_space_puts_it():
    """Items E, t_1..t_4, M, L on 3 stages: the MTP block (item 5) on the last stage, or on a
    stage of the last chunk when it may stand alone."""
    space = LayoutSpace(4, 1, 3)
    assert allowed(space, np.array([1, 3]))
    assert not allowed(space, np.array([3, 3]))
    assert not allowed(space, np.array([4, 2]))
    assert not allowed(space, np.array([2, 6]))  # M on the middle stage, L alone
    assert allowed(LayoutSpace(4, 1, 3, allow_standalone_mtp=True), np.array([2, 6]))
    assert allowed(LayoutSpace(4, 0, 3), np.array([2, 5]))
    untied = LayoutSpace(4, 1, 2, 2, allow_standalone_mtp=True, tied_embeddings=False)
    assert allowed(untied, np.array([1, 2, 6]))  # M on stage 2: rank 0's last chunk
    assert not allowed(untied, np.array([1, 6, 7]))  # M on stage 1: the first chunk
    tied = LayoutSpace(4, 1, 2, 2, allow_standalone_mtp=True)  # megatron-core cannot build it
    assert not allowed(tied, np.array([1, 2, 6]))
    assert allowed(tied, np.array([1, 2, 5]))  # M with L on the last rank's last chunk


def test_seeds_are_balanced_layouts_of_the_space():
    space = LayoutSpace(16, 1, 4)
    model = toy_cost_model(4, forward=(0.0, 1.0, 0.0, 0.0))  # every decoder layer alike
    seeds = seed_cuts(space, item_sums(model, space).load)
    assert seeds and all(allowed(space, np.array(cuts)) for cuts in seeds)
    assert (5, 9, 13) in seeds  # 4 decoder layers a stage: Et*4|t*4|t*4|t*4mL
    assert all(len(cuts) == 3 and cuts[0] > 0 and cuts[-1] < 18 for cuts in seeds)


@pytest.mark.parametrize("cuts", [1, 2, 4])
def test_each_transfer_moves_one_item_from_one_stage_to_another(cuts):
    stages = cuts + 1
    start = np.arange(1, stages) * 10
    sizes = np.diff([0, *start, stages * 10])
    moved = set()
    for shift in transfers(cuts):
        change = np.diff([0, *(start + shift), stages * 10]) - sizes
        assert sorted(change.tolist()) == [-1, *([0] * (stages - 2)), 1]
        moved.add((int(np.argmin(change)), int(np.argmax(change))))
    assert len(moved) == stages * (stages - 1)  # every ordered pair of stages, once


@settings(max_examples=25, deadline=None)
@given(
    layers=st.integers(4, 10),
    pp=st.integers(2, 4),
    vpp=st.sampled_from((1, 2)),
    unit=st.tuples(*(st.integers(0, 6) for _ in range(4))),
    p2p=st.sampled_from((0.0, 0.4)),
)
def test_downhill_improves_at_every_step_and_stops_where_no_move_helps(layers, pp, vpp, unit, p2p):
    case = toy_case(layers, 1, pp, vpp, 2 * pp, unit, p2p, 5.0)
    if case is None:
        return
    space, program, cost_model, _, _ = case
    seeds = seed_cuts(space, item_sums(cost_model, space).load)
    if not seeds:
        return
    visited = downhill(space, program, cost_model, seeds[0])
    assert visited[0] == seeds[0]
    path = np.array(visited)
    counts = space.unit_counts(path, cost_model.units, cost_model.moe_pattern)
    steps = score(program, cost_model, counts).noise_free_ms
    assert (np.diff(steps) < 0).all()
    if len(visited) <= 60:  # stopped by the slope, not the round limit
        end = np.array(visited[-1])
        items = len(space.item_counts(cost_model.units, cost_model.moe_pattern))
        moves = [m for m in end + transfers(len(end)) if m[0] > 0 and m[-1] < items]
        moves = [m for m in moves if allowed(space, m)]
        if moves:
            counts = space.unit_counts(np.array(moves), cost_model.units, cost_model.moe_pattern)
            assert score(program, cost_model, counts).noise_free_ms.min() >= steps[-1]
