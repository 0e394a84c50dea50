"""Critical paths as cuts: exact for their own layout, a bound for every other, and the least
any completion of a partial layout can make them, by a dynamic programme over stage ends."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from search.evaluate import stage_times, tail_ms
from search.item_sums import item_sums
from search.paths import (
    CutBounds,
    PathCut,
    allowed_ends,
    combine,
    critical_path,
    least_completions,
    stage_costs,
)
from tests.helpers.planner_fixtures import toy_case


@settings(max_examples=25, deadline=None)
@given(
    layers=st.integers(4, 10),
    pp=st.integers(2, 4),
    vpp=st.sampled_from((1, 2)),
    unit=st.tuples(*(st.integers(0, 6) for _ in range(4))),
    p2p=st.sampled_from((0.0, 0.4)),
    tail=st.sampled_from((0.0, 5.0)),
    seed=st.integers(0, 2**16),
    p2p_overlap=st.booleans(),
)
def test_a_critical_path_is_exact_for_its_layout_and_a_bound_for_every_other(
    layers, pp, vpp, unit, p2p, tail, seed, p2p_overlap
):
    """Blocking and overlapped p2p alike: a wait on the path is its post's transfer or the
    rank's previous op."""
    case = toy_case(layers, 1, pp, vpp, 2 * pp, unit, p2p, tail, p2p_overlap)
    if case is None:
        return
    space, program, cost_model, cuts, steps = case
    counts = space.unit_counts(cuts, cost_model.units, cost_model.moe_pattern)
    forward, backward = stage_times(cost_model, counts)
    tails = tail_ms(cost_model, counts, pp)
    row = np.random.default_rng(seed).integers(len(cuts))
    cut = critical_path(program, forward[row], backward[row], cost_model.p2p_ms, tails[row])
    rank_of_stage = np.arange(space.num_stages) % pp
    lengths = (
        forward @ cut.forward
        + backward @ cut.backward
        + cut.constant_ms
        + tails[:, rank_of_stage] @ cut.tail / (cut.tail.sum() or 1)
    )
    assert lengths[row] == pytest.approx(steps[row])
    assert (lengths <= steps + 1e-6).all()
    sums = item_sums(cost_model, space)
    least = least_completions(cut, sums, space.num_layers + 1, False, (vpp - 1) * pp)
    assert least[0, 0] + cut.constant_ms <= steps.min() + 1e-6


@settings(max_examples=25, deadline=None)
@given(
    layers=st.integers(3, 8),
    pp=st.integers(2, 3),
    vpp=st.sampled_from((1, 2)),
    unit=st.tuples(*(st.integers(0, 6) for _ in range(4))),
    p2p=st.sampled_from((0.0, 0.4)),
    seed=st.integers(0, 2**16),
)
def test_least_completions_are_the_shortest_path_over_every_layout(
    layers, pp, vpp, unit, p2p, seed
):
    """The programme's least length from the root, and from each child of the first stage,
    equals the shortest the cut is over every layout of the space, summed stage by stage."""
    case = toy_case(layers, 1, pp, vpp, 2 * pp, unit, p2p, 5.0)
    if case is None:
        return
    space, program, cost_model, cuts, _ = case
    counts = space.unit_counts(cuts, cost_model.units, cost_model.moe_pattern)
    forward, backward = stage_times(cost_model, counts)
    tails = tail_ms(cost_model, counts, pp)
    row = np.random.default_rng(seed).integers(len(cuts))
    cut = critical_path(program, forward[row], backward[row], cost_model.p2p_ms, tails[row])
    sums = item_sums(cost_model, space)
    costs = [stage_costs(cut, stage, sums) for stage in range(space.num_stages)]
    edges = np.concatenate(
        [np.zeros((len(cuts), 1), int), cuts, np.full((len(cuts), 1), sums.items)], axis=1
    )
    lengths = sum(costs[s][edges[:, s], edges[:, s + 1]] for s in range(space.num_stages))
    mtp_item, last_chunk = space.num_layers + 1, (vpp - 1) * pp
    least = least_completions(cut, sums, mtp_item, False, last_chunk)
    assert least[0, 0] == pytest.approx(lengths.min())
    bounds = CutBounds([cut], sums, mtp_item, False, last_chunk)
    ends = np.unique(cuts[:, 0])
    bound, travelled = bounds.children(bounds.start, 0, 0, ends)
    for end, below, through in zip(ends, bound, travelled[0], strict=True):
        assert below == pytest.approx(lengths[cuts[:, 0] == end].min() + cut.constant_ms)
        assert through == pytest.approx(costs[0][0, end])


def test_a_stage_may_end_only_where_a_layout_can_go_on():
    """Items E, t_1..t_4, M, L on 4 stages: one item a stage at least, the MTP block on the last
    stage unless it may stand alone in the last chunk."""

    def ends(stage, standalone=False, last_chunk=0):
        return np.flatnonzero(allowed_ends(4, 7, stage, 5, standalone, last_chunk)).tolist()

    assert ends(0) == [1, 2, 3, 4]
    assert ends(2) == [1, 2, 3, 4, 5]
    assert ends(3) == [7]
    assert ends(2, standalone=True) == [1, 2, 3, 4, 5, 6]
    assert ends(2, standalone=True, last_chunk=3) == [1, 2, 3, 4, 5]
    no_mtp = allowed_ends(4, 6, 1, None, False, 0)
    assert np.flatnonzero(no_mtp).tolist() == [1, 2, 3, 4]


def test_a_combination_of_cuts_is_their_normalised_weighted_sum():
    first = PathCut(np.array([2.0, 0.0]), np.array([1.0, 1.0]), np.array([0.0, 1.0]), 4.0)
    second = PathCut(np.array([0.0, 4.0]), np.array([3.0, 1.0]), np.array([1.0, 0.0]), 0.0)
    mixed = combine([first, second], np.array([1.0, 3.0]))
    assert mixed.forward.tolist() == [0.5, 3.0]
    assert mixed.backward.tolist() == [2.5, 1.0]
    assert mixed.tail.tolist() == [0.75, 0.25]
    assert mixed.constant_ms == 1.0
