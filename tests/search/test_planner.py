"""Baselines (the current layout, Megatron's default, the count-based rule) and the whole plan:
the handbook's pick, exact search against enumeration, progress, shards through map_shards."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ray_layout.errors import ConfigError
from ray_layout.model.baselines import BaselineName
from ray_layout.model.costs import load_costs
from ray_layout.model.layout import validate
from ray_layout.model.spec import load_recipe_file
from ray_layout.model.split import PipelineSplit
from search import progress as progress_module
from search.planner import (
    Baseline,
    PlanOptions,
    Problem,
    SearchSpec,
    baselines,
    plan,
)

HANDBOOK = load_recipe_file("configs/handbook_7b_a1b.yaml")
COSTS = load_costs("configs/costs/handbook_h200_example.json")


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


def test_a_space_with_no_layout_is_an_error_that_says_why():
    """VPP 5 on PP 4 is 20 stages for 19 units: a plan of nothing is refused, not an empty
    table with exit 0."""
    run = replace(HANDBOOK, parallel=replace(HANDBOOK.parallel, vpp=5))
    with pytest.raises(ConfigError, match=r"no layout fills PP=4 x VPP=5 = 20 stages with 19 "):
        plan(Problem.of(run, COSTS, SearchSpec(num_microbatches=40), PlanOptions(top=3)))
    small = replace(HANDBOOK, model=replace(HANDBOOK.model, num_layers=6), parallel=run.parallel)
    allowed = SearchSpec(num_microbatches=40, allow_empty_stages=True)
    assert plan(Problem.of(small, COSTS, allowed, PlanOptions(top=1, samples=8))).candidates


def test_without_an_hbm_limit_no_candidate_claims_to_fit():
    result = plan(Problem.of(HANDBOOK, COSTS, SearchSpec(32), PlanOptions(top=2, samples=8)))
    assert {c.fits for c in result.candidates} == {None}
    limited = plan(Problem.of(HANDBOOK, COSTS, SearchSpec(32), PlanOptions(top=2, hbm_gib=131)))
    assert {c.fits for c in limited.candidates} == {True}
