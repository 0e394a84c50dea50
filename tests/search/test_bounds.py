"""Lower bounds of the exact search: item prefix sums, water-filling, megatron-core's warm-up,
and the 1F1B and interleaved bounds, which never exceed the simulated step of any layout."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from search.bounds import (
    InterleavedBound,
    Node,
    OneFOneBBound,
    bound_for,
    forwards_before_first_backward,
    one_f_one_b_paths,
    settled_levels,
    suffix_minmax,
    water_levels,
)
from search.item_sums import item_sums
from search.pipeline_ops import BACKWARD, ScheduleShape
from search.schedule import compile_schedule
from search.space import LayoutSpace
from tests.helpers.megatron_oracle import MEGATRON_CPU_WARNINGS
from tests.helpers.megatron_schedule_oracle import megatron_order
from tests.helpers.planner_fixtures import plain_steps, toy_case, toy_cost_model

pytestmark = [pytest.mark.filterwarnings(w) for w in MEGATRON_CPU_WARNINGS]


@settings(max_examples=200, deadline=None)
@given(
    values=st.lists(st.floats(0, 100), min_size=1, max_size=6),
    work=st.floats(0, 500),
    rates=st.lists(st.floats(0.1, 4), min_size=6, max_size=6),
    open_mask=st.lists(st.booleans(), min_size=6, max_size=6),
)
def test_water_levels_absorb_the_work_and_never_sink_below_the_highest(
    values, work, rates, open_mask
):
    """Raising each open rank to the level takes exactly the work (rank r rises rates[r] per
    unit), unless the highest rank already stands above where the water would be."""
    n = len(values)
    row, rate, open_ranks = np.array([values]), np.array(rates[:n]), np.array(open_mask[:n])
    level = water_levels(row, open_ranks, np.array([work]), rate)[0]
    assert level >= max(values)
    if not open_ranks.any():
        assert level == max(values)
        return
    absorbed = (np.maximum(level - row[0], 0.0) / rate)[open_ranks].sum()
    if level > max(values) + 1e-9:
        assert absorbed == pytest.approx(work, rel=1e-9, abs=1e-6)
    else:
        assert absorbed >= work - 1e-6


def test_water_levels_of_equal_rates_share_the_work_evenly():
    values = np.array([[0.0, 0.0, 10.0], [0.0, 4.0, 0.0]])
    open_ranks = np.array([True, True, False])
    assert water_levels(values, open_ranks, np.array([6.0, 6.0])).tolist() == [10.0, 5.0]


@pytest.mark.parametrize(
    ("pp", "vpp", "microbatches", "group"),
    [(2, 1, 1, 2), (4, 1, 3, 4), (4, 1, 8, 4), (4, 2, 8, 4), (4, 2, 12, 6), (3, 3, 6, 3)],
)
def test_forwards_before_the_first_backward_are_megatron_cores(pp, vpp, microbatches, group):
    shape = ScheduleShape(pp, vpp, microbatches, group)
    counts = forwards_before_first_backward(compile_schedule(shape))
    for rank in range(pp):
        order = megatron_order(shape, rank)
        assert counts[rank] == next(i for i, op in enumerate(order) if op.kind == BACKWARD)


def test_the_schedule_picks_its_bound():
    cost_model = toy_cost_model(4, 2, 8)
    for vpp, kind in ((1, OneFOneBBound), (2, InterleavedBound)):
        space, program = LayoutSpace(16, 1, 4, vpp), compile_schedule(ScheduleShape(4, vpp, 8))
        assert isinstance(bound_for(space, program, cost_model, item_sums(cost_model, space)), kind)


@settings(max_examples=30, deadline=None)
@given(
    layers=st.integers(3, 12),
    pp=st.integers(2, 5),
    microbatches=st.integers(1, 12),
    unit=st.tuples(*(st.integers(0, 5) for _ in range(4))),
    p2p=st.sampled_from((0.0, 0.3, 2.0)),
    tail=st.sampled_from((0.0, 5.0, 40.0)),
    block=st.integers(0, 3),
)
def test_one_f_one_b_bounds_never_exceed_the_simulated_step(
    layers, pp, microbatches, unit, p2p, tail, block
):
    """Also under block recompute, whose stage backward depends on where the stage starts."""
    space = LayoutSpace(layers, 1, pp)
    program = compile_schedule(ScheduleShape(pp, 1, microbatches))
    cost_model = toy_cost_model(
        pp, 1, microbatches, layers=layers, forward=unit, p2p=p2p, tail_ms_per_gparam=tail,
        block_layers=block,
    )  # fmt: skip
    cuts, steps = plain_steps(space, program, cost_model)
    sums = item_sums(cost_model, space)
    paths = one_f_one_b_paths(program, sums, cost_model.p2p_ms)
    bounds = np.zeros(len(cuts))
    for row, layout in enumerate(cuts):
        edges = [0, *layout.tolist(), sums.items]
        settled = float(sums.tail[1])
        for rank in range(pp):
            ends = np.array([edges[rank + 1]])
            own = paths.own(rank, edges[rank], ends, settled)[0]
            bounds[row] = max(bounds[row], own)
            settled = float(paths.settled_after(rank, edges[rank], ends, settled)[0])
    assert (bounds <= steps + 1e-6).all()
    levels = settled_levels(paths, float(sums.tail[1]))
    root = suffix_minmax(paths, levels, space.num_layers + 1, False)[0, 0, 0]
    assert root <= steps.min() + 1e-6


@settings(max_examples=40, deadline=None)
@given(
    layers=st.integers(3, 8),
    pp=st.integers(2, 4),
    vpp=st.sampled_from((2, 3)),
    groups=st.integers(1, 3),
    mtp=st.integers(0, 1),
    unit=st.tuples(*(st.integers(0, 4) for _ in range(4))),
    p2p=st.sampled_from((0.0, 0.5, 3.0)),
    tail=st.sampled_from((0.0, 5.0, 40.0)),
    p2p_overlap=st.booleans(),
    block=st.integers(0, 2),
)
# E|t|tt|tL: micro-batch 0's hops to a rank were counted twice, and the p2p calls a rank makes
# before its last chunk's first forward were counted on top of micro-batch 0's way there
@example(
    layers=4,
    pp=2,
    vpp=2,
    groups=2,
    mtp=0,
    unit=(0, 0, 4, 0),
    p2p=0.5,
    tail=5.0,
    p2p_overlap=False,
    block=0,
)
@example(
    layers=4,
    pp=3,
    vpp=2,
    groups=1,
    mtp=1,
    unit=(0, 1, 0, 0),
    p2p=3.0,
    tail=40.0,
    p2p_overlap=False,
    block=0,
)
def test_interleaved_bounds_never_exceed_the_simulated_step(
    layers, pp, vpp, groups, mtp, unit, p2p, tail, p2p_overlap, block
):
    """Along every layout's path through the tree, each node's bound is at most its step (also
    with the layout's own step as the threshold: a tie is never pruned), with blocking and with
    overlapped p2p."""
    case = toy_case(layers, mtp, pp, vpp, groups * pp, unit, p2p, tail, p2p_overlap, block)
    if case is None:
        return
    space, program, cost_model, cuts, steps = case
    sums = item_sums(cost_model, space)
    bound = bound_for(space, program, cost_model, sums)
    for layout, step in zip(cuts.tolist(), steps.tolist(), strict=True):
        node = Node(0, 0, (), bound.root())
        for end in layout:
            ends = np.array([end])
            for threshold in (np.inf, step):
                children = bound.children(node, ends, threshold)
                assert children.lower[0] <= step + 1e-6, (space.layout_string(layout), node.stage)
            state = bound.child(node, children, 0, end)
            node = Node(node.stage + 1, end, (*node.cuts, end), state)
