"""Ranking, Jensen pruning, sharding (in process and on Ray), baselines, the whole plan."""

from __future__ import annotations

import itertools
import os

import numpy as np
import pytest

from ray_layout.model.costs import load_costs
from ray_layout.model.spec import load_recipe_file
from search.evaluate import monte_carlo, score, standard_normals
from search.planner import (
    PlanOptions,
    SearchSpec,
    _candidate,
    evaluate_shard,
    ideal_step_ms,
    merge,
    plan,
    rank_key,
)
from search.schedule import compile_schedule
from search.space import LayoutSpace
from tests.planner_fixtures import toy_cost_model

HANDBOOK = load_recipe_file("configs/handbook_7b_a1b.yaml")
COSTS = load_costs("configs/costs/handbook_h200_example.json")


def setup(jitter: float = 0.05, vpp: int = 1, microbatches: int = 8):
    space = LayoutSpace(16, 1, 4, vpp)
    program = compile_schedule(4, vpp, microbatches)
    model = toy_cost_model(4, vpp, microbatches, jitter=jitter)
    options = PlanOptions(top=6, samples=64)
    grid = ideal_step_ms(model, space, program) * options.tie_tolerance
    return space, program, model, options, grid


def test_top_equals_monte_carlo_of_every_layout():
    """Jensen pruning changes nothing: the top is what sampling every layout would give."""
    space, program, model, options, grid = setup()
    pruned = evaluate_shard(space, program, model, options, grid)
    assert pruned.sampled < pruned.scored  # the pruning did skip layouts
    cuts = np.concatenate(list(space.cut_blocks()))
    counts = space.unit_counts(cuts, model.units, model.moe_pattern)
    scores = score(program, model, counts)
    steps = monte_carlo(program, model, counts, standard_normals(program, 64, 0))
    everything = [_candidate(space, cuts[i], scores, i, steps[i], None) for i in range(len(cuts))]
    everything.sort(key=lambda c: rank_key(c, grid, None))
    assert [c.layout for c in pruned.candidates] == [c.layout for c in everything[:6]]
    assert [c.mean_ms for c in pruned.candidates] == [c.mean_ms for c in everything[:6]]


@pytest.mark.parametrize("shards", [2, 3, 7])
def test_any_number_of_shards_gives_the_same_top(shards):
    space, program, model, _options, grid = setup(vpp=2)
    small_blocks = PlanOptions(top=6, samples=64, block_size=500)
    alone = evaluate_shard(space, program, model, small_blocks, grid)
    parts = [evaluate_shard(space, program, model, small_blocks, grid, s, shards)
             for s in range(shards)]  # fmt: skip
    merged = merge(parts, 6)
    assert merged.candidates == alone.candidates
    assert merged.scored == alone.scored == space.count().total


def test_ties_go_to_fewer_near_bottleneck_ranks_then_headroom():
    space, program, model, options, grid = setup(jitter=0.0)
    top = evaluate_shard(space, program, model, options, grid).candidates
    for better, worse in itertools.pairwise(top):
        if int(better.mean_ms // grid) == int(worse.mean_ms // grid):
            assert (better.near_bottleneck, -better.peak_memory_gib) <= (
                worse.near_bottleneck, -worse.peak_memory_gib)  # fmt: skip


def test_memory_filter_drops_layouts_over_hbm():
    space, program, model, _, grid = setup()
    tight = PlanOptions(top=5, samples=16, hbm_gib=40.0)
    result = evaluate_shard(space, program, model, tight, grid)
    assert result.rejected_memory > 0
    assert all(c.fits and c.peak_memory_gib <= 40.0 for c in result.candidates)


def test_handbook_plan_picks_the_published_layout_with_example_costs():
    spec = SearchSpec(num_microbatches=32)
    result = plan(HANDBOOK.model, HANDBOOK.parallel, COSTS, spec, PlanOptions(top=3, hbm_gib=131))
    best = result.candidates[0]
    assert best.layout == "Et*5|t*6|t*5|mL"
    names = [b.name for b in result.baselines]
    assert names == ["Megatron default", "count-based rule"]
    assert [b.candidate.layout for b in result.baselines] == [
        "Et*4|t*4|t*4|t*4mL", "Et*4|t*5|t*5|t*2mL"]  # fmt: skip
    assert result.speedup(best, "Megatron default") > 1.4
    assert result.speedup(best, "count-based rule") > 1.1
    assert (result.valid_layouts, result.space_size, result.scored) == (816, 680, 680)


def test_no_default_split_is_reported_not_raised():
    recipe = load_recipe_file("configs/handbook_7b_a1b.yaml")
    from ray_layout.model.spec import build_recipe

    odd = build_recipe(
        {"num_layers": 15, "hidden_size": 2048, "num_attention_heads": 16, "seq_length": 4096,
         "vocab_size": 128256, "num_experts": 64, "moe_router_topk": 8,
         "moe_ffn_hidden_size": 1024, "mtp_num_layers": 1},
        {"pp": 4, "ep": 2, "dp": 2, "micro_batch_size": 2}, source="test",
    )  # fmt: skip
    result = plan(odd.model, odd.parallel, COSTS, SearchSpec(num_microbatches=8),
                  PlanOptions(top=2, samples=16))  # fmt: skip
    default = result.baselines[0]
    assert default.candidate is None and "not divisible by PP=4" in default.reason
    assert recipe.model.num_layers == 16


@pytest.mark.skipif(os.environ.get("RAY_LAYOUT_SKIP_RAY") == "1", reason="Ray disabled")
def test_ray_shards_give_the_same_plan_as_one_process():
    import ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, object_store_memory=100 * 2**20,
                 logging_level="ERROR")  # fmt: skip
    try:
        spec = SearchSpec(num_microbatches=16)
        options = PlanOptions(top=5, samples=32, block_size=200)
        local = plan(HANDBOOK.model, HANDBOOK.parallel, COSTS, spec, options)
        sharded = plan(HANDBOOK.model, HANDBOOK.parallel, COSTS,
                       SearchSpec(num_microbatches=16, shards=3), options)  # fmt: skip
        assert sharded.candidates == local.candidates
        assert sharded.scored == local.scored
    finally:
        if started:
            ray.shutdown()
