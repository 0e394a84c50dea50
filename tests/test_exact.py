"""The exact search returns what the plain simulator finds by enumeration, with bounds that hold."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from search.bounds import (
    Node,
    bound_for,
    item_sums,
    one_f_one_b_paths,
    settled_levels,
    suffix_minmax,
)
from search.evaluate import score, stage_times, tail_ms
from search.exact import exact_search
from search.paths import critical_path, least_completions
from search.schedule import compile_schedule
from search.space import LayoutSpace
from search.ties import prediction_key
from tests.planner_fixtures import optimal_set, plain_steps, toy_case, toy_cost_model


def distinct(steps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return np.unique(prediction_key(steps), return_counts=True)


@pytest.mark.parametrize(
    ("layers", "pp", "vpp", "microbatches", "standalone"),
    [(16, 4, 1, 8, False), (16, 4, 1, 32, True), (16, 4, 2, 8, False), (12, 3, 2, 6, True),
     (10, 4, 1, 4, False)],
)  # fmt: skip
def test_exact_top_equals_enumeration(layers, pp, vpp, microbatches, standalone):
    space = LayoutSpace(layers, 1, pp, vpp, allow_standalone_mtp=standalone)
    program = compile_schedule(pp, vpp, microbatches)
    model = toy_cost_model(pp, vpp, microbatches, layers=layers)
    cuts, steps = plain_steps(space, program, model)
    values, counts = distinct(steps)
    found = exact_search(space, program, model=model, top=5)
    assert [c.step_ms for c in found.classes] == pytest.approx(values[:5].tolist())
    assert [c.count for c in found.classes] == counts[:5].tolist()
    assert found.complete
    assert values[4] <= found.proven_bound_ms <= values[5] + 1e-6
    assert found.simulated <= len(cuts)
    best = found.classes[0]
    assert space.layout_string(best.cuts) in optimal_set(space, cuts, steps)


@settings(max_examples=25, deadline=None)
@given(
    layers=st.integers(3, 9),
    pp=st.integers(2, 4),
    vpp=st.sampled_from((1, 1, 2)),
    microbatches=st.integers(1, 3),
    unit=st.tuples(*(st.integers(0, 4) for _ in range(4))),
    p2p=st.sampled_from((0.0, 0.5)),
    tail=st.sampled_from((0.0, 5.0)),
    mtp=st.integers(0, 1),
)
# p2p and tails alone: the interleaved bound once counted the hops within a chunk twice
@example(layers=4, pp=2, vpp=2, microbatches=2, unit=(0, 0, 4, 0), p2p=0.5, tail=5.0, mtp=0)
def test_exact_optimum_equals_the_plain_simulator(layers, pp, vpp, microbatches, unit, p2p, tail,
                                                  mtp):  # fmt: skip
    case = toy_case(layers, mtp, pp, vpp, microbatches * pp, unit, p2p, tail)
    if case is None:
        return
    space, program, model, cuts, steps = case
    values, counts = distinct(steps)
    found = exact_search(space, program, model=model, top=2)
    assert [c.step_ms for c in found.classes] == values[:2].tolist()
    assert [c.count for c in found.classes] == counts[:2].tolist()
    assert space.layout_string(found.classes[0].cuts) in optimal_set(space, cuts, steps)


@settings(max_examples=30, deadline=None)
@given(
    layers=st.integers(3, 12),
    pp=st.integers(2, 5),
    microbatches=st.integers(1, 12),
    unit=st.tuples(*(st.integers(0, 5) for _ in range(4))),
    p2p=st.sampled_from((0.0, 0.3, 2.0)),
    tail=st.sampled_from((0.0, 5.0, 40.0)),
)
def test_one_f_one_b_bounds_never_exceed_the_simulated_step(layers, pp, microbatches, unit, p2p,
                                                            tail):  # fmt: skip
    space = LayoutSpace(layers, 1, pp)
    program = compile_schedule(pp, 1, microbatches)
    model = toy_cost_model(pp, 1, microbatches, layers=layers, forward=unit, p2p=p2p,
                           tail_ms_per_gparam=tail)  # fmt: skip
    cuts, steps = plain_steps(space, program, model)
    sums = item_sums(model, space)
    paths = one_f_one_b_paths(program, sums, model.p2p_ms)
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
)
# E|t|tt|tL: micro-batch 0's hops to a rank were counted twice, and the p2p calls a rank makes
# before its last chunk's first forward were counted on top of micro-batch 0's way there
@example(layers=4, pp=2, vpp=2, groups=2, mtp=0, unit=(0, 0, 4, 0), p2p=0.5, tail=5.0)
@example(layers=4, pp=3, vpp=2, groups=1, mtp=1, unit=(0, 1, 0, 0), p2p=3.0, tail=40.0)
def test_interleaved_bounds_never_exceed_the_simulated_step(layers, pp, vpp, groups, mtp, unit,
                                                            p2p, tail):  # fmt: skip
    """Along every layout's path through the tree, each node's bound is at most its step (also
    with the layout's own step as the threshold: a tie is never pruned)."""
    case = toy_case(layers, mtp, pp, vpp, groups * pp, unit, p2p, tail)
    if case is None:
        return
    space, program, model, cuts, steps = case
    sums = item_sums(model, space)
    bound = bound_for(space, program, model, sums)
    for layout, step in zip(cuts.tolist(), steps.tolist(), strict=True):
        node = Node(0, 0, (), bound.root())
        for end in layout:
            ends = np.array([end])
            for threshold in (np.inf, step):
                children = bound.children(node, ends, threshold)
                assert children.lower[0] <= step + 1e-6, (space.layout_string(layout), node.stage)
            state = bound.child(node, children, 0, end)
            node = Node(node.stage + 1, end, (*node.cuts, end), state)


def test_shards_together_search_what_one_process_does():
    space = LayoutSpace(16, 1, 4, 2)
    program = compile_schedule(4, 2, 8)
    model = toy_cost_model(4, 2, 8)
    alone = exact_search(space, program, model=model, top=4)
    parts = [
        exact_search(space, program, model=model, top=4, shard=s, num_shards=3) for s in range(3)
    ]
    merged: dict[float, int] = {}
    for part in parts:
        for tie in part.classes:
            merged[tie.step_ms] = merged.get(tie.step_ms, 0) + tie.count
    assert [(c.step_ms, c.count) for c in alone.classes] == sorted(merged.items())[:4]


def test_memory_limit_applies_in_exact_search():
    space = LayoutSpace(16, 1, 4)
    program = compile_schedule(4, 1, 8)
    model = toy_cost_model(4)
    found = exact_search(space, program, model=model, top=3, hbm_gib=40.0)
    cuts = np.array([c.cuts for c in found.classes])
    counts = space.unit_counts(cuts, model.units, model.moe_pattern)
    assert (score(program, model, counts).peak_memory_bytes <= 40.0 * 2**30).all()
    assert found.rejected_memory > 0


def test_out_of_time_still_reports_a_bound_that_holds_and_which_bound_binds():
    space = LayoutSpace(16, 1, 4, 2)
    program = compile_schedule(4, 2, 8)
    model = toy_cost_model(4, 2, 8)
    _, steps = plain_steps(space, program, model)
    proven = exact_search(space, program, model=model, top=1)
    assert proven.complete and proven.bound_reason == ""
    relaxation = proven.relaxation  # the interleaved LP bound, passed on to a second search
    assert relaxation is not None and relaxation.converged
    found = exact_search(
        space, program, model=model, top=3, time_limit_s=0.0, relaxation=relaxation
    )
    assert not found.complete
    assert relaxation.bound_ms <= found.proven_bound_ms
    assert found.proven_bound_ms <= steps.min() + 1e-6 or found.gap == 0.0
    binds = found.proven_bound_ms <= relaxation.bound_ms + 1e-5
    reason = "LP relaxation binds" if binds else "subtrees left unexplored"
    assert reason in found.bound_reason if found.gap > 0 else found.bound_reason == ""


@settings(max_examples=25, deadline=None)
@given(
    layers=st.integers(6, 12),
    unit=st.tuples(*(st.integers(0, 6) for _ in range(4))),
    p2p=st.sampled_from((0.0, 0.4)),
    tail=st.sampled_from((0.0, 5.0)),
    standalone=st.booleans(),
)
def test_interleaved_search_keeps_every_best_layout(layers, unit, p2p, tail, standalone):
    """The interleaved bounds prune nothing that ties the best predictions (PP 3, VPP 2)."""
    space = LayoutSpace(layers, 1, 3, 2, allow_standalone_mtp=standalone)
    program = compile_schedule(3, 2, 6)
    model = toy_cost_model(3, 2, 6, layers=layers, forward=unit, p2p=p2p, tail_ms_per_gparam=tail)
    _, steps = plain_steps(space, program, model)
    values, counts = distinct(steps)
    found = exact_search(space, program, model=model, top=3)
    assert [c.step_ms for c in found.classes] == values[:3].tolist()
    assert [c.count for c in found.classes] == counts[:3].tolist()


@settings(max_examples=25, deadline=None)
@given(
    layers=st.integers(4, 10),
    pp=st.integers(2, 4),
    vpp=st.sampled_from((1, 2)),
    unit=st.tuples(*(st.integers(0, 6) for _ in range(4))),
    p2p=st.sampled_from((0.0, 0.4)),
    tail=st.sampled_from((0.0, 5.0)),
    seed=st.integers(0, 2**16),
)
def test_a_critical_path_is_exact_for_its_layout_and_a_bound_for_every_other(
    layers, pp, vpp, unit, p2p, tail, seed
):
    case = toy_case(layers, 1, pp, vpp, 2 * pp, unit, p2p, tail)
    if case is None:
        return
    space, program, model, cuts, steps = case
    counts = space.unit_counts(cuts, model.units, model.moe_pattern)
    forward, backward = stage_times(model, counts)
    tails = tail_ms(model, counts, pp)
    row = np.random.default_rng(seed).integers(len(cuts))
    cut = critical_path(program, forward[row], backward[row], model.p2p_ms, tails[row])
    rank_of_stage = np.arange(space.num_stages) % pp
    lengths = (forward @ cut.forward + backward @ cut.backward + cut.constant_ms
               + tails[:, rank_of_stage] @ cut.tail / (cut.tail.sum() or 1))  # fmt: skip
    assert lengths[row] == pytest.approx(steps[row])
    assert (lengths <= steps + 1e-6).all()
    sums = item_sums(model, space)
    least = least_completions(cut, sums, space.num_layers + 1, False, (vpp - 1) * pp)
    assert least[0, 0] + cut.constant_ms <= steps.min() + 1e-6
