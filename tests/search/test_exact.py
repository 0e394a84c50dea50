"""The exact search returns what the plain simulator finds by enumeration, with bounds that hold."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from search.evaluate import hidden_ms, score
from search.exact import exact_search, lower_bound_model
from search.pipeline_ops import ScheduleShape
from search.schedule import compile_schedule
from search.simulator import simulate
from search.space import LayoutSpace
from tests.helpers.planner_fixtures import (
    check_exact_top_two,
    combined_toy_case,
    distinct,
    optimal_set,
    plain_steps,
    toy_case,
    toy_cost_model,
)


@pytest.mark.parametrize(
    ("layers", "pp", "vpp", "microbatches", "standalone"),
    [(16, 4, 1, 8, False), (16, 4, 1, 32, True), (16, 4, 2, 8, False), (12, 3, 2, 6, True),
     (10, 4, 1, 4, False)],
)  # fmt: skip
def test_exact_top_equals_enumeration(layers, pp, vpp, microbatches, standalone):
    space = LayoutSpace(layers, 1, pp, vpp, allow_standalone_mtp=standalone)
    program = compile_schedule(ScheduleShape(pp, vpp, microbatches))
    cost_model = toy_cost_model(pp, vpp, microbatches, layers=layers)
    cuts, steps = plain_steps(space, program, cost_model)
    values, counts = distinct(steps)
    found = exact_search(space, program, cost_model=cost_model, top=5)
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
    p2p_overlap=st.booleans(),
)
# p2p and tails alone: the interleaved bound once counted the hops within a chunk twice
@example(layers=4, pp=2, vpp=2, microbatches=2, unit=(0, 0, 4, 0), p2p=0.5, tail=5.0, mtp=0,
         p2p_overlap=False)  # fmt: skip
def test_exact_optimum_equals_the_plain_simulator(layers, pp, vpp, microbatches, unit, p2p, tail,
                                                  mtp, p2p_overlap):  # fmt: skip
    """Blocking and overlapped p2p alike (p2p overlap applies to VPP > 1)."""
    case = toy_case(layers, mtp, pp, vpp, microbatches * pp, unit, p2p, tail, p2p_overlap)
    if case is not None:
        check_exact_top_two(case)


def test_shards_together_search_what_one_process_does():
    space = LayoutSpace(16, 1, 4, 2)
    program = compile_schedule(ScheduleShape(4, 2, 8))
    cost_model = toy_cost_model(4, 2, 8)
    alone = exact_search(space, program, cost_model=cost_model, top=4)
    parts = [
        exact_search(space, program, cost_model=cost_model, top=4, shard=s, num_shards=3)
        for s in range(3)
    ]
    merged: dict[float, int] = {}
    for part in parts:
        for tie in part.classes:
            merged[tie.step_ms] = merged.get(tie.step_ms, 0) + tie.count
    assert [(c.step_ms, c.count) for c in alone.classes] == sorted(merged.items())[:4]


def test_memory_limit_applies_in_exact_search():
    space = LayoutSpace(16, 1, 4)
    program = compile_schedule(ScheduleShape(4, 1, 8))
    cost_model = toy_cost_model(4)
    found = exact_search(space, program, cost_model=cost_model, top=3, hbm_gib=40.0)
    cuts = np.array([c.cuts for c in found.classes])
    counts = space.unit_counts(cuts, cost_model.units, cost_model.moe_pattern)
    assert (score(program, cost_model, counts).peak_memory_bytes <= 40.0 * 2**30).all()
    assert found.rejected_memory > 0


def test_out_of_time_still_reports_a_bound_that_holds_and_which_bound_binds():
    space = LayoutSpace(16, 1, 4, 2)
    program = compile_schedule(ScheduleShape(4, 2, 8))
    cost_model = toy_cost_model(4, 2, 8)
    _, steps = plain_steps(space, program, cost_model)
    proven = exact_search(space, program, cost_model=cost_model, top=1)
    assert proven.complete and proven.bound_reason == ""
    relaxation = proven.relaxation  # the interleaved LP bound, passed on to a second search
    assert relaxation is not None and relaxation.converged
    found = exact_search(
        space, program, cost_model=cost_model, top=3, time_limit_s=0.0, relaxation=relaxation
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
    program = compile_schedule(ScheduleShape(3, 2, 6))
    cost_model = toy_cost_model(
        3, 2, 6, layers=layers, forward=unit, p2p=p2p, tail_ms_per_gparam=tail
    )
    _, steps = plain_steps(space, program, cost_model)
    values, counts = distinct(steps)
    found = exact_search(space, program, cost_model=cost_model, top=3)
    assert [c.step_ms for c in found.classes] == values[:3].tolist()
    assert [c.count for c in found.classes] == counts[:3].tolist()


def test_a_merged_step_saves_against_nothing_hidden_and_not_below_compute_alone():
    """Combined 1F1B: a merged step hides time, and the bounds' cost model (each layer less its
    share of what a pair hides, nothing merged) never predicts more than the merged step."""
    case = combined_toy_case(12, 1, 3, 2, 6, (1, 10, 14, 38), 2.0, True)
    space, program, cost_model, cuts, _ = case
    counts = space.unit_counts(cuts[:50], cost_model.units, cost_model.moe_pattern)
    forward, backward = counts @ cost_model.forward_ms, counts @ cost_model.backward_ms
    links = cost_model.p2p_ms
    hidden = hidden_ms(program, cost_model, counts)
    merged = simulate(program, forward.T, backward.T, links, hidden_ms=hidden).step
    exposed = simulate(program, forward.T, backward.T, links).step
    lower = lower_bound_model(cost_model)
    compute = simulate(
        program, (counts @ lower.forward_ms).T, (counts @ lower.backward_ms).T, links
    )
    assert (hidden > 0).any() and (merged < exposed).all()
    assert (compute.step <= merged + 1e-9).all()
