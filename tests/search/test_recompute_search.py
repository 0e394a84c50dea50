"""Layout and recomputation searched together: the settings tried, the pick against planning
every setting in full, what a skipped setting proves, and the model zoo's DeepSeek-V3 in 80 GiB
without its recompute flags."""

from __future__ import annotations

import math
from dataclasses import replace
from itertools import pairwise

import pytest

from ray_layout.model.costs import costs_from_flops, load_costs
from ray_layout.model.hf_config import load_hf_config
from ray_layout.model.layout import Layout
from ray_layout.model.memory_settings import memory_settings, with_recompute
from ray_layout.model.spec import load_recipe_file, with_parallel
from search.planner import PlanOptions, Problem, SearchSpec, plan, score_given
from search.recompute_search import (
    ASKED,
    joint_as_plan,
    joint_plan,
    recompute_options,
    recompute_price,
    searched_plan,
    setting_name,
)

HANDBOOK = with_parallel(load_recipe_file("configs/handbook_7b_a1b.yaml"), pp=4)
COSTS = load_costs("configs/costs/handbook_h200_example.json")
V3 = load_hf_config("tests/data/hf/DeepSeek-V3/config.json", seq_length=4096).model


def handbook(hbm_gib: float | None, *flags: str) -> Problem:
    recipe = replace(HANDBOOK, megatron_args=(*HANDBOOK.megatron_args, *flags))
    options = PlanOptions(top=3, samples=8, hbm_gib=hbm_gib)
    return Problem.of(recipe, COSTS, SearchSpec(num_microbatches=32), options)


def test_the_settings_go_from_none_through_selective_and_block_to_full_uniform():
    selective = ["--recompute-granularity", "selective", "--recompute-modules", "mlp"]
    job = memory_settings([*selective, "--moe-grouped-gemm"])
    options = recompute_options(V3, job, stages=16)
    assert options[0].recompute_granularity is None and options[1] == job
    selective = [o.selective for o in options if o.recompute_granularity == "selective"][1:]
    assert selective[0] == {"layernorm", "moe_act", "mla_up_proj"}
    assert all(a < b for a, b in pairwise(selective))  # ever more
    assert "moe" in selective[-1] and "shared_experts" in selective[-1]
    blocks = [o.recompute_num_layers for o in options if o.recompute_method == "block"]
    assert blocks == [1, 2, 3, 4]  # up to ceil(61 / 16) layers of each chunk
    assert options[-1].recompute_method == "uniform" and options[-1].recompute_num_layers == 1
    assert len(set(options)) == len(options)
    for settings in options:  # every setting is a command line Megatron reads back the same
        assert (
            memory_settings(with_recompute(["--bf16", "--moe-grouped-gemm"], settings)) == settings
        )


@pytest.mark.parametrize("hbm_gib", [30.0, 34.0, None])
def test_the_pick_is_the_fastest_fitting_pair_of_every_setting_planned_in_full(hbm_gib):
    problem = handbook(hbm_gib)
    found = joint_plan(problem)
    best = {}
    for settings in recompute_options(problem.model, problem.memory, 4):
        fitting = plan(replace(problem, memory=settings)).candidates
        best[settings.recompute_flags()] = min((c.mean_ms for c in fitting), default=math.inf)
    pick = found.candidates[0]
    assert pick.mean_ms == pytest.approx(min(best.values()))
    assert best[pick.recompute] == pytest.approx(pick.mean_ms)
    assert found.pick is not None and found.pick.flags == pick.recompute
    assert found.gap == 0.0  # each setting's space is enumerated: the pick is proven
    for tried in found.tried:  # a skipped setting's floor proves it cannot beat the pick
        assert tried.plan is not None or tried.floor_ms >= pick.noise_free_ms
        assert tried.floor_ms <= best[tried.flags] + 1e-6
    layouts = [str(c.layout) for c in found.candidates]
    assert len(set(layouts)) == len(layouts)  # each layout once, at its fastest setting
    if hbm_gib is None:
        assert pick.recompute == ()  # nothing to fit: recomputing only costs


def test_nothing_fits_under_any_setting_is_an_empty_pick_with_each_setting_tried():
    found = joint_plan(handbook(12.0))
    assert found.candidates == () and found.pick is None and found.gap == 0.0
    assert all(t.plan is not None and not t.plan.candidates for t in found.tried)


@pytest.mark.slow
def test_the_zoos_deepseek_v3_without_its_recompute_flags_fits_80_gib_with_a_priced_setting():
    """The model zoo's DeepSeek-V3 H100 recipe without its recompute flags overflows 80 GiB at
    every layout; the joint search picks a layout and a setting that fit, and the pick's step is
    above the same layout's without recomputation."""
    zoo = load_recipe_file("configs/deepseek_v3_zoo_h100.yaml")
    plain = memory_settings(zoo.megatron_args).without_recompute()
    recipe = replace(zoo, megatron_args=with_recompute(zoo.megatron_args, plain))
    assert recipe.flags.memory.recompute_granularity is None
    costs = costs_from_flops(recipe.model, recipe.parallel)
    problem = Problem.of(recipe, costs, SearchSpec(128), PlanOptions(top=3, hbm_gib=80.0))
    found = joint_plan(problem)
    pick = found.candidates[0]
    assert pick.fits and pick.peak_memory_gib <= 80.0 and pick.recompute
    without = score_given(pick.layout, replace(problem, memory=plain))
    assert without.peak_memory_gib > 80.0 and pick.mean_ms > without.mean_ms
    assert found.tried[0].plan is not None and not found.tried[0].plan.candidates


def test_a_setting_is_named_in_a_few_words():
    assert setting_name(()) == "none"
    full = memory_settings(["--recompute-granularity", "full", "--recompute-method", "block",
                            "--recompute-num-layers", "3"])  # fmt: skip
    assert setting_name(full.recompute_flags()) == "full block 3"
    selective = memory_settings(
        ["--recompute-granularity", "selective", "--recompute-modules", "moe_act", "core_attn"]
    )
    assert setting_name(selective.recompute_flags()) == "selective core_attn,moe_act"


def test_the_jobs_own_setting_is_searched_alone_while_it_fits_and_the_pair_after():
    fits, joint, why = searched_plan(handbook(131.0), "job")
    assert joint is None and why == "" and fits.candidates[0].recompute == ()
    merged, joint, why = searched_plan(handbook(30.0), "job")
    assert why == "the job's own recompute setting (none) fits no layout in 30 GiB"
    assert joint is not None and merged.candidates == joint.candidates
    assert merged.proven_bound_ms == joint.bound_ms and merged.ties == ()
    assert merged.smallest_peak_gib <= 30.0  # under some setting, not the job's own
    assert searched_plan(handbook(None), "auto")[2] == ASKED


def test_a_job_setting_the_joint_search_skipped_still_scores_the_baselines_under_it():
    full = ["--recompute-granularity", "full", "--recompute-method", "uniform",
            "--recompute-num-layers", "1"]  # fmt: skip
    problem = handbook(None, *full)
    joint = joint_plan(problem)
    assert next(t for t in joint.tried if t.settings == problem.memory).plan is None
    merged = joint_as_plan(joint, problem)
    assert [b.candidate.recompute for b in merged.baselines if b.candidate] == [tuple(full)] * 2


def test_beside_ep_all_to_all_overlap_no_full_recompute_is_offered():
    """megatron-core refuses --overlap-moe-expert-parallel-comm with full recomputation."""
    options = recompute_options(V3, memory_settings([]), stages=16, ep_overlap=True)
    assert {o.recompute_granularity for o in options} == {None, "selective"}


def test_the_price_is_the_step_over_the_same_layouts_without_recomputation():
    plain = handbook(30.0)
    full = replace(plain, memory=memory_settings(["--recompute-granularity", "full",
        "--recompute-method", "uniform", "--recompute-num-layers", "1"]))  # fmt: skip
    layout = Layout.parse("Et*5|t*5|t*5|tmL", 4)
    with_full = score_given(layout, full)
    assert recompute_price(with_full, full) == pytest.approx(
        with_full.mean_ms / score_given(layout, plain).mean_ms - 1
    )
    assert recompute_price(with_full, full) > 0.1
    assert recompute_price(score_given(layout, plain), plain) == 0.0
