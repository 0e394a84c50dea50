"""The tune's choice of recomputation: the job's own setting alone while it fits a layout, layout
x recompute when it fits none or when asked, the baselines always under the job's own flags, and
one line where nothing fits under any setting.  The small tune's recipe on the emulated
profile's own costs: without recomputation its smallest peak is 61.6 GiB."""

from __future__ import annotations

from dataclasses import replace

import pytest

from launchers.emulated.hardware import load_profile
from ray_layout.errors import ConfigError
from ray_layout.tuning.recompute_choice import recompute_search
from search.planner import PlanOptions, Problem, SearchSpec, plan
from search.recompute_search import joint_plan
from tests.helpers.tuning_small import GROUPED, HARDWARE

COSTS = load_profile(HARDWARE).costs
CHEAP = ("--recompute-granularity", "selective", "--recompute-modules", "layernorm", "moe_act")
FULL = ("--recompute-granularity", "full", "--recompute-method", "uniform",
        "--recompute-num-layers", "1")  # fmt: skip


def problem_at(hbm_gib: float, recipe=GROUPED) -> Problem:
    spec = SearchSpec(num_microbatches=recipe.parallel.num_microbatches_or_none)
    return Problem.of(recipe, COSTS, spec, PlanOptions(hbm_gib=hbm_gib))


def test_while_the_jobs_own_setting_fits_a_layout_the_tune_searches_it_alone():
    problem = problem_at(131.0)
    found, why = recompute_search(problem, "job")
    assert why == "" and found == plan(problem)
    assert {c.recompute for c in found.candidates} == {()}


def test_a_job_whose_setting_fits_no_layout_is_searched_with_every_setting():
    problem = problem_at(60.0)
    assert not plan(problem).candidates  # 61.6 GiB at least without recomputation
    said: list[str] = []
    found, why = recompute_search(problem, "job", said.append)
    assert why == (
        "the job's own recompute setting (none) fits no layout in 60 GiB: "
        "searched layout x recompute"
    )
    assert f"recompute {' '.join(CHEAP)}" in said  # the joint search's progress, as plan's
    assert found.candidates == joint_plan(problem).candidates
    assert all(c.recompute and c.fits for c in found.candidates)
    best = found.candidates[0]
    assert (str(best.layout), best.recompute) == ("Et*9|t*7mL", CHEAP)
    # the baselines are what the user runs today: the job's own flags, over the limit
    assert [b.candidate.recompute for b in found.baselines] == [(), ()]
    assert not any(b.candidate.fits for b in found.baselines)
    assert found.scored > plan(problem).scored


def test_asked_for_the_tune_finds_a_faster_pair_than_the_jobs_own_setting():
    problem = problem_at(65.0)
    own, _ = recompute_search(problem, "job")
    found, why = recompute_search(problem, "auto")
    assert why == "asked (--recompute auto): searched layout x recompute"
    best = found.candidates[0]
    assert (str(best.layout), best.recompute) == ("Et*10|t*6mL", CHEAP)
    assert best.mean_ms < own.candidates[0].mean_ms / 1.05
    assert found.baselines == own.baselines  # the same baselines either way


def test_a_job_setting_the_joint_search_skips_still_gives_the_baselines_under_it():
    """A full-recompute job on roomy GPUs: its setting's ideal step is slower than the plain
    pick, so the joint search never plans it; the baselines are scored under it all the same."""
    job = replace(GROUPED, megatron_args=(*GROUPED.megatron_args, *FULL))
    problem = problem_at(131.0, job)
    joint = joint_plan(problem)
    assert next(t for t in joint.tried if t.settings == problem.memory).plan is None
    found, _ = recompute_search(problem, "auto")
    assert [b.candidate.recompute for b in found.baselines] == [FULL, FULL]
    assert found.candidates[0].recompute == ()


def test_nothing_fitting_under_any_setting_is_one_line():
    with pytest.raises(ConfigError) as refused:
        recompute_search(problem_at(20.0), "job")
    message = str(refused.value)
    assert message.startswith("no layout fits in 20 GiB under any recompute setting (the smallest")
    assert "\n" not in message
