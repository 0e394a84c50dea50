"""The LP relaxation bounds every layout's step, and its mixed path bounds every subtree."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from search.evaluate import stage_times, tail_ms
from search.item_sums import item_sums
from search.paths import PathCut, combine, critical_paths, least_completions
from search.pipeline_ops import ScheduleShape
from search.relaxation import relax
from search.schedule import compile_schedule
from search.space import LayoutSpace
from tests.helpers.planner_fixtures import plain_steps, toy_cost_model


def path_lengths(cut: PathCut, space, model, cuts: np.ndarray) -> np.ndarray:
    """The path's length under each layout's stage durations and tails."""
    counts = space.unit_counts(cuts, model.units, model.moe_pattern)
    forward, backward = stage_times(model, counts)
    # a stage's own items' tail: what the stage adds to its rank's tail
    stage_tail = (counts @ model.tail_params) * model.tail_ms_per_gparam
    return forward @ cut.forward + backward @ cut.backward + stage_tail @ cut.tail + cut.constant_ms


def seeds_of(space, program, model, cuts: np.ndarray) -> list[PathCut]:
    counts = space.unit_counts(cuts, model.units, model.moe_pattern)
    forward, backward = stage_times(model, counts)
    tails = tail_ms(model, counts, space.pp)
    return [cut for row in range(len(cuts))
            for cut in critical_paths(program, forward[row], backward[row], model.p2p_ms,
                                      tails[row])[1]]  # fmt: skip


def random_space(
    layers, pp, vpp, mtp, standalone, microbatches, unit, p2p, tail, p2p_overlap=False
):
    space = LayoutSpace(layers, mtp, pp, vpp, allow_standalone_mtp=standalone and mtp > 0)
    if space.count().total == 0:
        return None
    program = compile_schedule(ScheduleShape(pp, vpp, microbatches, p2p_overlap=p2p_overlap))
    model = toy_cost_model(pp, vpp, microbatches, layers=layers, forward=unit, p2p=p2p,
                           tail_ms_per_gparam=tail)  # fmt: skip
    return space, program, model


@settings(max_examples=40, deadline=None)
@given(
    layers=st.integers(3, 10),
    pp=st.integers(2, 4),
    vpp=st.sampled_from((1, 2, 2, 3)),
    mtp=st.integers(0, 1),
    standalone=st.booleans(),
    groups=st.integers(1, 2),
    unit=st.tuples(*(st.integers(0, 6) for _ in range(4))),
    p2p=st.sampled_from((0.0, 0.4, 3.0)),
    tail=st.sampled_from((0.0, 5.0, 40.0)),
    seed=st.integers(0, 2**16),
    p2p_overlap=st.booleans(),
)
def test_the_relaxation_and_its_mixed_path_never_exceed_a_simulated_step(
    layers, pp, vpp, mtp, standalone, groups, unit, p2p, tail, seed, p2p_overlap
):
    """For every layout of random small spaces, 1F1B and interleaved, with and without p2p and
    tails, blocking and overlapped p2p: the relaxation's bound and the mixed path's length stay
    at or below the plain
    simulator's step, and the mixed path's least completion under any placed prefix stays at
    or below every layout of that subtree."""
    case = random_space(layers, pp, vpp, mtp, standalone, groups * pp, unit, p2p, tail, p2p_overlap)
    if case is None:
        return
    space, program, model = case
    cuts, steps = plain_steps(space, program, model)
    sums = item_sums(model, space)
    rows = np.random.default_rng(seed).integers(len(cuts), size=2)
    found = relax(space, program, model.p2p_ms, sums, seeds_of(space, program, model, cuts[rows]))
    assert found.bound_ms <= steps.min() + 1e-6
    assert found.lp_ms <= steps.min() + 1e-6
    mixed = found.mixed
    assert mixed is not None  # the LP is feasible: every layout lies in it
    assert (path_lengths(mixed, space, model, cuts) <= steps + 1e-6).all()
    mtp_item = space.num_layers + 1 if mtp else None
    least = least_completions(mixed, sums, mtp_item, space.allow_standalone_mtp,
                              (vpp - 1) * pp)  # fmt: skip
    # the subtree of layouts sharing the first k boundaries of one layout
    layout = cuts[rows[0]]
    for k in range(len(layout) + 1):
        edges = [0, *layout[:k].tolist()]
        placed = sum(least_stage(mixed, s, edges[s], edges[s + 1], sums) for s in range(k))
        subtree = (cuts[:, :k] == layout[:k]).all(axis=1)
        bound = placed + least[k, edges[k]] + mixed.constant_ms
        assert bound <= steps[subtree].min() + 1e-6


def least_stage(cut: PathCut, stage: int, start: int, end: int, sums) -> float:
    return (cut.forward[stage] * (sums.forward[end] - sums.forward[start])
            + cut.backward[stage] * (sums.backward[end] - sums.backward[start])
            + cut.tail[stage] * (sums.tail[end] - sums.tail[start]))  # fmt: skip


def test_a_converged_relaxation_meets_a_fractional_layout_below_the_best():
    """Uniform layers on PP 4, VPP 2: the LP's optimum is a fractional layout's simulated step,
    at or below the best whole-layer layout, and within a few percent of it."""
    space = LayoutSpace(16, 1, 4, 2)
    program = compile_schedule(ScheduleShape(4, 2, 8))
    model = toy_cost_model(4, 2, 8)
    cuts, steps = plain_steps(space, program, model)
    sums = item_sums(model, space)
    best = cuts[np.argsort(steps)[:3]]
    found = relax(space, program, model.p2p_ms, sums, seeds_of(space, program, model, best),
                  time_limit_s=30.0)  # fmt: skip
    assert found.converged
    assert found.fractional_ms == pytest.approx(found.lp_ms, rel=1e-6)
    assert found.lp_ms - 1e-6 <= found.bound_ms <= steps.min() + 1e-6
    assert found.bound_ms >= 0.9 * steps.min()


def test_combining_paths_weights_them_to_one():
    one = PathCut(np.array([1.0, 0.0]), np.array([2.0, 0.0]), np.array([1.0, 0.0]), 3.0)
    two = PathCut(np.array([0.0, 4.0]), np.array([0.0, 2.0]), np.array([0.0, 1.0]), 1.0)
    mixed = combine([one, two], np.array([3.0, 1.0]))
    assert mixed.forward.tolist() == [0.75, 1.0]
    assert mixed.backward.tolist() == [1.5, 0.5]
    assert mixed.constant_ms == pytest.approx(2.5)
