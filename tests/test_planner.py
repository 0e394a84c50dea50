"""Ranking, Jensen pruning, ties, sharding (in process and on Ray), baselines, the whole plan."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ray_layout.errors import ConfigError
from ray_layout.model.baselines import BaselineName
from ray_layout.model.costs import load_costs
from ray_layout.model.layout import validate
from ray_layout.model.spec import load_recipe_file
from ray_layout.model.split import PipelineSplit
from search import progress as progress_module
from search.evaluate import monte_carlo, standard_normals
from search.planner import (
    Baseline,
    PlanOptions,
    Problem,
    SearchSpec,
    baselines,
    ideal_step_ms,
    plan,
)
from search.ranking import candidates_of, merge, rank_key
from search.schedule import compile_schedule
from search.shards import ENUMERATION, EXACT, ShardTask, evaluate_shard, run_shard
from search.space import LayoutSpace
from search.ties import iter_tie_classes
from tests.planner_fixtures import optimal_set, plain_steps, toy_cost_model

HANDBOOK = load_recipe_file("configs/handbook_7b_a1b.yaml")
COSTS = load_costs("configs/costs/handbook_h200_example.json")


def setup(jitter: float = 0.05, vpp: int = 1, microbatches: int = 8, **costs):
    space = LayoutSpace(16, 1, 4, vpp)
    program = compile_schedule(4, vpp, microbatches)
    model = toy_cost_model(4, vpp, microbatches, jitter=jitter, **costs)
    options = PlanOptions(top=6, samples=64)
    grid = ideal_step_ms(model, space, program) * options.tie_tolerance
    return space, program, model, options, grid


def plain_classes(space, program, model):
    """Every distinct prediction of the space, by the plain simulator, with its representative."""
    cuts, steps = plain_steps(space, program, model)
    found = candidates_of(space, program, model, cuts, None, None)
    near = np.array([c.near_bottleneck for c in found])
    peak = np.array([c.peak_memory_gib for c in found]) * 2**30
    return list(iter_tie_classes(steps, near, peak, cuts, space.layout_string)), cuts, steps


def test_top_equals_monte_carlo_of_every_distinct_prediction():
    """Jensen pruning changes nothing: the top is what sampling every class would give."""
    space, program, model, options, grid = setup()
    pruned = merge([evaluate_shard(space, program, model, options, grid)], options.top)
    classes, _, _ = plain_classes(space, program, model)
    assert pruned.sampled < len(classes)  # the pruning did skip classes
    cuts = np.array([tie.cuts for tie in classes])
    counts = space.unit_counts(cuts, model.units, model.moe_pattern)
    steps = monte_carlo(program, model, counts, standard_normals(program, 64, 0))
    everything = candidates_of(space, program, model, cuts, steps, None)
    ranked = sorted(zip(everything, classes, strict=True), key=lambda p: rank_key(p[0], grid, None))
    assert [c.layout for c in pruned.candidates] == [c.layout for c, _ in ranked[:6]]
    assert [c.mean_ms for c in pruned.candidates] == [c.mean_ms for c, _ in ranked[:6]]
    assert list(pruned.ties) == [tie.count for _, tie in ranked[:6]]


@settings(max_examples=20, deadline=None)
@given(
    unit=st.tuples(*(st.integers(0, 4) for _ in range(4))),
    vpp=st.sampled_from((1, 2)),
    p2p=st.sampled_from((0.0, 0.4)),
    jitter=st.sampled_from((0.0, 0.05)),
    tail=st.sampled_from((0.0, 5.0)),
)
def test_enumeration_and_exact_search_find_the_plain_simulators_optimum(unit, vpp, p2p, jitter,
                                                                        tail):  # fmt: skip
    space = LayoutSpace(7, 1, 3, vpp)
    program = compile_schedule(3, vpp, 6)
    model = toy_cost_model(3, vpp, 6, layers=7, forward=unit, p2p=p2p, jitter=jitter,
                           tail_ms_per_gparam=tail)  # fmt: skip
    classes, cuts, steps = plain_classes(space, program, model)
    options = PlanOptions(top=3, samples=16)
    grid = max(ideal_step_ms(model, space, program), 1.0) * options.tie_tolerance
    for method in (ENUMERATION, EXACT):
        result = merge([run_shard(ShardTask(space, program, model, options, grid, method))], 3)
        by_prediction = {tie.step_ms: tie for tie in classes}
        for candidate, count in zip(result.candidates, result.ties, strict=True):
            tie = by_prediction[round(candidate.noise_free_ms, 6)]
            assert count == tie.count
        best = min(zip(result.candidates, result.ties, strict=True),
                   key=lambda pair: pair[0].noise_free_ms)  # fmt: skip
        assert best[0].noise_free_ms == pytest.approx(steps.min())
        assert str(best[0].layout) == classes[0].key[-1]  # the representative by the tie-break
        assert best[1] == len(optimal_set(space, cuts, steps))


@pytest.mark.parametrize("shards", [2, 3, 7])
def test_any_number_of_shards_gives_the_same_top(shards):
    space, program, model, _options, grid = setup(vpp=2)
    small_blocks = PlanOptions(top=6, samples=64, block_size=500)
    alone = merge([evaluate_shard(space, program, model, small_blocks, grid)], 6)
    parts = [evaluate_shard(space, program, model, small_blocks, grid, s, shards)
             for s in range(shards)]  # fmt: skip
    merged = merge(parts, 6)
    assert merged.candidates == alone.candidates and merged.ties == alone.ties
    assert merged.scored == alone.scored == space.count().total


def test_ties_collapse_to_one_candidate_with_a_count():
    """A heavy output layer, no p2p and no tails: while the stage holding it stays the slowest,
    every arrangement of the others predicts the same step."""
    space, program, model, options, grid = setup(jitter=0.0, forward=(0.0, 10.0, 0.0, 100.0),
                                                  p2p=0.0, tail_ms_per_gparam=0.0)  # fmt: skip
    result = merge([evaluate_shard(space, program, model, options, grid)], options.top)
    _, cuts, steps = plain_classes(space, program, model)
    assert result.ties[0] == len(optimal_set(space, cuts, steps)) > 1
    noise_free = [c.noise_free_ms for c in result.candidates]
    assert len(set(noise_free)) == len(noise_free)  # one candidate per prediction


def test_ties_go_to_fewer_near_bottleneck_ranks_then_headroom():
    space, program, model, options, grid = setup(jitter=0.0)
    top = evaluate_shard(space, program, model, options, grid).candidates
    for better, worse in itertools.pairwise(top):
        if int(better.mean_ms // grid) == int(worse.mean_ms // grid):
            assert (better.near_bottleneck, better.peak_memory_gib) <= (
                worse.near_bottleneck, worse.peak_memory_gib)  # fmt: skip


def test_memory_filter_drops_layouts_over_hbm():
    space, program, model, _, grid = setup()
    tight = PlanOptions(top=5, samples=16, hbm_gib=40.0)
    result = evaluate_shard(space, program, model, tight, grid)
    assert result.rejected_memory > 0
    assert all(c.fits and c.peak_memory_gib <= 40.0 for c in result.candidates)


def test_handbook_plan_picks_the_published_layout_with_example_costs():
    spec = SearchSpec(num_microbatches=32)
    result = plan(Problem.of(HANDBOOK, COSTS, spec, PlanOptions(top=3, hbm_gib=131)))
    best = result.candidates[0]
    assert str(best.layout) == "Et*5|t*6|t*5|mL"
    names = [b.name for b in result.baselines]
    assert names == [BaselineName.DEFAULT, BaselineName.COUNT_BASED]  # no split: no current
    assert names == ["Megatron default", "count-based rule"]  # the strings the store holds
    assert [str(b.candidate.layout) for b in result.baselines] == [
        "Et*4|t*4|t*4|t*4mL", "Et*4|t*5|t*5|t*2mL"]  # fmt: skip
    assert result.speedup(best, BaselineName.DEFAULT) > 1.4
    assert result.speedup(best, BaselineName.COUNT_BASED) > 1.1
    assert result.speedup(best, BaselineName.CURRENT) is None
    assert (result.valid_layouts, result.space_size, result.scored) == (816, 680, 680)
    assert len(result.ties) == len(result.candidates) and result.ties[0] >= 1


def _baselines(split: PipelineSplit, model=HANDBOOK.model, **sizes) -> dict[str, Baseline]:
    problem = Problem(model, replace(HANDBOOK.parallel, **sizes), COSTS, SearchSpec(32),
                      PlanOptions(samples=8), split)  # fmt: skip
    return {b.name: b for b in baselines(problem)}


def test_the_configs_current_layout_is_the_first_baseline_with_its_own_name():
    found = _baselines(PipelineSplit(layout="Et*3|t*5|t*5|t*3mL"))
    assert list(found) == [BaselineName.CURRENT, BaselineName.DEFAULT, BaselineName.COUNT_BASED]
    assert str(found["current"].candidate.layout) == "Et*3|t*5|t*5|t*3mL"
    # a current layout that is another baseline's is still listed, under its own name
    same = _baselines(PipelineSplit(layout="Et*4|t*4|t*4|t*4mL"))
    assert same["current"].candidate == same["Megatron default"].candidate
    # a split of another PP (a --pp override) is no current layout, and says why
    other = _baselines(PipelineSplit(layout="Et*3|t*5|t*5|t*3mL"), pp=8)
    assert other["current"].candidate is None and "not divisible by PP=8" in other["current"].reason


def test_megatron_default_follows_the_configs_split_flags():
    found = _baselines(PipelineSplit(last_stage_layers=13))
    assert str(found["Megatron default"].candidate.layout) == "Et|t|t|t*13mL"
    assert str(found["current"].candidate.layout) == "Et|t|t|t*13mL"  # the flags are the current
    # 94 + E + L = 96 slots over PP 8: Megatron has a default (12 each), and it is the current
    deep = replace(HANDBOOK.model, num_layers=94, moe_layer_pattern=(True,) * 94)
    both = PipelineSplit(account_for_embedding=True, account_for_loss=True)
    found = _baselines(both, deep, pp=8)
    assert str(found["Megatron default"].candidate.layout) == "Et*11|(t*12|)*6t*11mL"
    assert found["current"].candidate == found["Megatron default"].candidate
    assert _baselines(PipelineSplit(), deep, pp=8)["Megatron default"].candidate is None


def test_interleaved_baselines_are_layouts_of_the_runs_vpp():
    found = _baselines(PipelineSplit(), vpp=2)
    assert list(found) == [BaselineName.DEFAULT, BaselineName.COUNT_BASED]
    for baseline in found.values():
        layout = baseline.candidate.layout
        assert (layout.pp, layout.vpp) == (4, 2)
        validate(layout, 16, 1)
    assert str(found["count-based rule"].candidate.layout) == "Ett|t*3|t*3|(tt|)*4mL"
    # the current keeps the VPP its split gives, whatever the run's (a VPP sweep)
    current = _baselines(PipelineSplit(layout="Et*3|t*5|t*5|t*3mL"), vpp=2)["current"]
    assert current.candidate.layout.vpp == 1
    # an interleaved current layout that this step's 2 micro-batches cannot schedule: a reason
    interleaved = PipelineSplit(layout="Ett|(tt|)*6t*2mL")
    few = Problem(
        HANDBOOK.model, HANDBOOK.parallel, COSTS, SearchSpec(2), PlanOptions(), interleaved
    )
    current = baselines(few)[0]
    assert current.candidate is None and "micro-batches (2) >= PP (4)" in current.reason


def test_exact_search_plan_agrees_with_enumeration_and_proves_it():
    spec = SearchSpec(num_microbatches=32)
    options = PlanOptions(top=3, hbm_gib=131)
    enumerated = plan(Problem.of(HANDBOOK, COSTS, spec, options))
    searched = plan(Problem.of(HANDBOOK, COSTS, replace(spec, enumerate_limit=0), options))
    assert searched.method == "exact search" and enumerated.method == "enumeration"
    assert searched.candidates[0] == enumerated.candidates[0]
    assert searched.ties[0] == enumerated.ties[0]
    assert searched.proven_bound_ms >= searched.candidates[0].noise_free_ms
    assert searched.bound_reason == ""


def test_an_unfinished_interleaved_plan_says_which_bound_binds(monkeypatch):
    monkeypatch.setattr(progress_module, "PROGRESS_AFTER_S", 0.0)
    lines: list[str] = []
    parallel = replace(HANDBOOK.parallel, vpp=2)
    spec = SearchSpec(num_microbatches=32, enumerate_limit=0, time_limit_s=0.0)
    searched = plan(
        Problem(HANDBOOK.model, parallel, COSTS, spec, PlanOptions(top=2)), progress=lines.append
    )
    gap = 1 - searched.proven_bound_ms / searched.candidates[0].noise_free_ms
    assert not searched.complete
    assert (gap > 1e-9) == bool(searched.bound_reason)
    assert all("exact search" in line for line in lines)


def test_a_slow_plan_reports_progress(monkeypatch):
    monkeypatch.setattr(progress_module, "PROGRESS_AFTER_S", 0.0)
    lines: list[str] = []
    spec = SearchSpec(num_microbatches=32, enumerate_limit=0)
    plan(
        Problem.of(HANDBOOK, COSTS, spec, PlanOptions(top=2)),
        progress=lines.append,
    )
    assert lines and all("exact search" in line for line in lines)


@pytest.mark.parametrize("shards", [2, 3])
def test_exact_search_shards_give_the_same_plan(shards):
    """Each shard keeps every prediction of its subtrees that can reach the top, with all their
    layouts; merged, the top and its tie counts are the single process's."""
    spec = SearchSpec(num_microbatches=32, enumerate_limit=0)
    options = PlanOptions(top=8, samples=32)
    alone = plan(Problem.of(HANDBOOK, COSTS, spec, options))
    split = plan(Problem.of(HANDBOOK, COSTS, replace(spec, shards=shards), options))
    assert split.candidates == alone.candidates and split.ties == alone.ties
    assert split.complete and alone.complete


def test_map_shards_runs_the_same_tasks_anywhere():
    spec = SearchSpec(num_microbatches=16, shards=3)
    options = PlanOptions(top=5, samples=32, block_size=200)
    here = plan(Problem.of(HANDBOOK, COSTS, spec, options))
    mapped = plan(
        Problem.of(HANDBOOK, COSTS, spec, options),
        map_shards=lambda function, tasks: list(map(function, tasks)),
    )
    assert mapped == here


def test_no_default_split_is_reported_not_raised():
    recipe = load_recipe_file("configs/handbook_7b_a1b.yaml")
    from ray_layout.model.spec import build_recipe

    odd = build_recipe(
        {"num_layers": 15, "hidden_size": 2048, "num_attention_heads": 16, "seq_length": 4096,
         "vocab_size": 128256, "num_experts": 64, "moe_router_topk": 8,
         "moe_ffn_hidden_size": 1024, "mtp_num_layers": 1},
        {"pp": 4, "ep": 2, "dp": 2, "micro_batch_size": 2}, source="test",
    )  # fmt: skip
    result = plan(
        Problem.of(
            odd,
            COSTS,
            SearchSpec(num_microbatches=8),
            PlanOptions(top=2, samples=16),
        )
    )
    default = result.baselines[0]
    assert default.candidate is None and "not divisible by PP=4" in default.reason
    assert recipe.model.num_layers == 16


def test_a_huge_space_with_empty_stages_is_refused_in_one_line():
    deep = replace(HANDBOOK.parallel, pp=16)
    spec = SearchSpec(num_microbatches=32, allow_empty_stages=True)
    with pytest.raises(ConfigError, match="leave empty stages out"):
        plan(Problem(HANDBOOK.model, deep, COSTS, spec, PlanOptions(top=2)))
