"""Shards: enumeration and exact-search shards find the plain simulator's optimum, any number of
them give one top, the memory filter holds, and an exact shard's bound holds for every layout it
does not list, proven or cut short."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ray_layout.model.sizing import GIB
from search.evaluate import score
from search.pipeline_ops import ScheduleShape
from search.planner import PlanOptions, ideal_step_ms
from search.ranking import merge
from search.schedule import compile_schedule
from search.shards import ENUMERATION, EXACT, ShardTask, evaluate_shard, run_shard
from search.space import LayoutSpace
from search.ties import prediction_key
from tests.helpers.planner_fixtures import optimal_set, plain_steps, toy_cost_model
from tests.helpers.search_shard_setup import plain_classes, shard_setup


@settings(max_examples=20, deadline=None)
@given(
    unit=st.tuples(*(st.integers(0, 4) for _ in range(4))),
    vpp=st.sampled_from((1, 2)),
    p2p=st.sampled_from((0.0, 0.4)),
    jitter=st.sampled_from((0.0, 0.05)),
    tail=st.sampled_from((0.0, 5.0)),
)
def test_enumeration_and_exact_search_find_the_plain_simulators_optimum(
    unit, vpp, p2p, jitter, tail
):
    space = LayoutSpace(7, 1, 3, vpp)
    program = compile_schedule(ScheduleShape(3, vpp, 6))
    model = toy_cost_model(
        3, vpp, 6, layers=7, forward=unit, p2p=p2p, jitter=jitter, tail_ms_per_gparam=tail
    )
    classes, cuts, steps = plain_classes(space, program, model)
    options = PlanOptions(top=3, samples=16)
    grid = max(ideal_step_ms(model, space, program), 1.0) * options.tie_tolerance
    for method in (ENUMERATION, EXACT):
        result = merge([run_shard(ShardTask(space, program, model, options, grid, method))], 3)
        by_prediction = {tie.step_ms: tie for tie in classes}
        for candidate, count in zip(result.candidates, result.ties, strict=True):
            tie = by_prediction[round(candidate.noise_free_ms, 6)]
            assert count == tie.count
        best = min(
            zip(result.candidates, result.ties, strict=True), key=lambda pair: pair[0].noise_free_ms
        )
        assert best[0].noise_free_ms == pytest.approx(steps.min())
        assert str(best[0].layout) == classes[0].key[-1]  # the representative by the tie-break
        assert best[1] == len(optimal_set(space, cuts, steps))


@pytest.mark.parametrize("shards", [2, 3, 7])
def test_any_number_of_shards_gives_the_same_top(shards):
    space, program, model, _options, grid = shard_setup(vpp=2)
    small_blocks = PlanOptions(top=6, samples=64, block_size=500)
    alone = merge([evaluate_shard(space, program, model, small_blocks, grid)], 6)
    parts = [
        evaluate_shard(space, program, model, small_blocks, grid, s, shards) for s in range(shards)
    ]
    merged = merge(parts, 6)
    assert merged.candidates == alone.candidates and merged.ties == alone.ties
    assert merged.scored == alone.scored == space.count().total


def test_memory_filter_drops_layouts_over_hbm():
    space, program, model, _, grid = shard_setup()
    tight = PlanOptions(top=5, samples=16, hbm_gib=40.0)
    result = evaluate_shard(space, program, model, tight, grid)
    assert result.rejected_memory > 0
    assert all(c.fits and c.peak_memory_gib <= 40.0 for c in result.candidates)


def test_a_shard_past_the_last_block_finds_nothing():
    space, program, model, _, grid = shard_setup()
    one_block = PlanOptions(top=6, samples=64, block_size=10**6)
    empty = evaluate_shard(space, program, model, one_block, grid, shard=1, num_shards=2)
    assert (empty.candidates, empty.scored, empty.sampled, empty.rejected_memory) == ((), 0, 0, 0)
    assert empty.smallest_peak_gib == float("inf")
    assert evaluate_shard(space, program, model, one_block, grid, 0, 2).scored == 680


def test_the_smallest_peak_counts_the_layouts_the_memory_filter_rejects():
    """What the plan reports when nothing fits: the least any layout would need."""
    space, program, model, _, grid = shard_setup()
    nothing_fits = PlanOptions(top=5, samples=16, hbm_gib=1.0)
    result = evaluate_shard(space, program, model, nothing_fits, grid)
    assert result.candidates == () and result.rejected_memory == result.scored == 680
    cuts = np.concatenate(list(space.cut_blocks()))
    counts = space.unit_counts(cuts, model.units, model.moe_pattern)
    peak = score(program, model, counts).peak_memory_bytes.min() / GIB
    assert result.smallest_peak_gib == pytest.approx(peak)


@pytest.mark.parametrize("time_limit_s", [float("inf"), 0.0])
def test_an_exact_shards_bound_holds_for_every_layout_it_does_not_list(time_limit_s):
    space, program, model, options, grid = shard_setup(jitter=0.0, vpp=2)
    task = ShardTask(space, program, model, options, grid, EXACT, time_limit_s=time_limit_s)
    result = run_shard(task)
    assert result.complete == (time_limit_s > 0)
    _, steps = plain_steps(space, program, model)
    listed = {float(prediction_key(c.noise_free_ms)) for c in result.candidates}
    unlisted = ~np.isin(prediction_key(steps), list(listed))
    assert (steps[unlisted] >= result.bound_ms - 1e-6).all()
    if result.complete:
        assert len(result.candidates) == options.top and result.bound_reason == ""
        assert result.bound_ms == pytest.approx(steps[unlisted].min())
