"""The tune's phases: the arms chosen from the search (baselines once, what the search predicted
and the recomputation it ranked them under carried), the fit and refit and their one-line
failures, the search (layout x recompute where the job's own setting fits nothing) sharded on Ray
tasks, and the GPU memory taken from the cluster, never assumed: the emulated GPUs' from their
hardware profile, a real GPU's from a probe on a worker (which fails in one line on fake
GPUs)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from launchers.emulated.hardware import load_profile
from ray_layout.ab.live import LiveTest, arm_runs
from ray_layout.ab.stats import ABConfig
from ray_layout.ab.vocabulary import ArmRole
from ray_layout.errors import MeasurementError, RunFailure
from ray_layout.model.costs import load_costs
from ray_layout.model.memory_settings import memory_settings
from ray_layout.model.spec import with_parallel
from ray_layout.model.split import PipelineSplit
from ray_layout.runtime.layout_runs import Backend
from ray_layout.tuning import phases
from ray_layout.tuning.phases import arm_label, choose_arms, cluster_hbm_gib
from tests.helpers.cluster import GPUS_PER_NODE
from tests.helpers.planner_fixtures import handbook_example_plan
from tests.helpers.tuning_small import GROUPED, HANDBOOK, SMALL, small_settings

PROFILE = Path("cluster_configs/hardware/h200_emulated.yaml")
DEFAULT = ABConfig()
CHEAP = ("--recompute-granularity", "selective", "--recompute-modules", "layernorm", "moe_act")


# --- the GPU memory ----------------------------------------------------------------------------


def test_the_emulated_cluster_has_its_hardware_profiles_memory():
    hbm_gib, where = cluster_hbm_gib(Backend("emulated", hardware_profile=PROFILE))
    assert hbm_gib == load_profile(PROFILE).hbm_gib and where == "h200_emulated.yaml"


def test_a_probe_on_a_gpu_without_cuda_is_a_one_line_run_failure(ray_cluster, tmp_path):
    (tmp_path / "pretrain_gpt.py").touch()
    with pytest.raises(
        RunFailure, match=r"cannot read the GPUs' memory .*; give --hbm-gb$"
    ) as caught:
        cluster_hbm_gib(Backend("megatron", megatron_path=tmp_path))
    assert "\n" not in str(caught.value)


# --- choosing the arms -------------------------------------------------------------------------


def test_choose_arms_takes_the_top_fitting_layouts_then_both_baselines_once():
    found = handbook_example_plan(200)
    arms = choose_arms(found, 3)
    assert [a.name for a in arms] == [
        "candidate-1",
        "candidate-2",
        "candidate-3",
        "default",
        "count-based",
    ]
    assert str(arms[0].layout) == "Et*5|t*6|t*5|mL"  # the hand-checked pick (docs/search.md)
    assert str(arms[3].layout) == "Et*4|t*4|t*4|t*4mL" and arms[3].roles == (ArmRole.DEFAULT,)
    assert arms[0].predicted_ms == found.candidates[0].mean_ms
    # a baseline the search ranks among the top is one arm: its candidate name, both roles
    rank = 1
    ranked = (found.candidates[0], found.baselines[1].candidate, *found.candidates[1:])
    merged = choose_arms(replace(found, candidates=ranked), rank + 1)
    layouts = [str(a.layout) for a in merged]
    assert len(layouts) == len(set(layouts)) and "count-based" not in [a.name for a in merged]
    arm = merged[rank]
    assert (arm.name, arm.roles) == (
        f"candidate-{rank + 1}",
        (ArmRole.CANDIDATE, ArmRole.COUNT_BASED),
    )


def test_the_configs_current_layout_is_an_arm_and_keeps_its_role_where_shared():
    found = handbook_example_plan(10, PipelineSplit(layout="Et*3|t*5|t*5|t*3mL"))
    arms = choose_arms(found, 2)
    assert [a.name for a in arms] == [
        "candidate-1",
        "candidate-2",
        "current",
        "default",
        "count-based",
    ]
    assert str(arms[2].layout) == "Et*3|t*5|t*5|t*3mL" and arms[2].roles == (ArmRole.CURRENT,)
    # the config runs Megatron's default today: one arm, the current's name, both roles
    found = handbook_example_plan(10, PipelineSplit(layout="Et*4|t*4|t*4|t*4mL"))
    arms = choose_arms(found, 2)
    assert [(a.name, a.roles) for a in arms[2:]] == [
        ("current", (ArmRole.CURRENT, ArmRole.DEFAULT)),
        ("count-based", (ArmRole.COUNT_BASED,)),
    ]


def test_the_tunes_arms_carry_what_the_search_predicted_and_far_losers_look_sooner():
    found = handbook_example_plan(10)
    arms = choose_arms(found, 3)
    by_layout = {c.layout: c for c in found.candidates}
    pick = by_layout[arms[0].layout]
    assert arms[0].critical_stages == pick.near_bottleneck
    assert arms[0].predicted_cv == pytest.approx((pick.p90_ms / pick.mean_ms - 1) / 1.2816)
    assert all(arm.predicted_cv >= 0 for arm in arms)
    early = LiveTest(arms, DEFAULT, 131.0).first_looks
    slower = {a.name: a.predicted_ms / arms[0].predicted_ms - 1 for a in arms}
    assert slower["default"] > 0.2 and early.get("default", 3) < DEFAULT.looks[0]
    assert all(slower[name] > DEFAULT.margin for name in early)


def test_arms_from_a_layout_x_recompute_search_carry_the_setting_they_run():
    """60 GiB fits no layout of the small tune without recomputation: the candidates recompute,
    the baselines run the job's own flags, and a candidate of the current layout under another
    setting is an arm of its own."""
    recipe = replace(GROUPED, split=PipelineSplit(layout="Et*9|t*7mL"))
    costs = load_profile(PROFILE).costs
    settings = small_settings(Path("/nowhere"), "study", hbm_gib=60.0)
    said: list[str] = []
    searched = phases.search(recipe, costs, settings, progress=said.append)
    assert searched.recompute == (
        "the job's own recompute setting (none) fits no layout in 60 GiB: "
        "searched layout x recompute"
    )
    assert any(line.startswith("recompute --recompute-granularity") for line in said)
    arms = choose_arms(searched.found, 2)
    assert [(a.name, str(a.layout), a.recompute) for a in arms] == [
        ("candidate-1", "Et*9|t*7mL", CHEAP),
        ("candidate-2", "Et*10|t*6mL", searched.found.candidates[1].recompute),
        ("current", "Et*9|t*7mL", ()),
        ("default", "Et*8|t*8mL", ()),
    ]
    assert arms[2].roles == (ArmRole.CURRENT, ArmRole.COUNT_BASED)
    runs = arm_runs(LiveTest(arms, DEFAULT, 60.0), "ab-key")
    assert runs[0].recompute == memory_settings(CHEAP)
    assert runs[2].recompute.recompute_flags() == ()
    assert arm_label(arms[0], ()) == "candidate-1 Et*9|t*7mL (selective layernorm,moe_act)"
    assert arm_label(arms[2], ()) == "current Et*9|t*7mL"
    # the job asked the search for every setting: the same arms, said so
    auto = phases.search(recipe, costs, replace(settings, options=replace(
        settings.options, recompute="auto")))  # fmt: skip
    assert auto.recompute == "asked (--recompute auto): searched layout x recompute"
    assert choose_arms(auto.found, 2) == arms
    # megatron-core's CPU ranks cannot recompute the experts' activation: never offered there
    core = replace(settings, backend=Backend("megatron-core", hardware_profile=PROFILE))
    on_cpu = phases.search(recipe, costs, core)
    assert on_cpu.found.candidates and all(
        "moe_act" not in c.recompute for c in on_cpu.found.candidates
    )


# --- the fit ---------------------------------------------------------------------------


def _ingested(run_id: str) -> SimpleNamespace:
    return SimpleNamespace(ingested=SimpleNamespace(run_id=run_id))


def test_profiling_runs_that_cannot_be_fitted_are_a_run_failure(monkeypatch, tmp_path):
    def fit(recipe, store, *, study, run_ids, gpus_per_node):
        raise MeasurementError("profile-1: no steady timer interval")

    monkeypatch.setattr(phases, "fit", fit)
    settings = small_settings(tmp_path, "study")
    with pytest.raises(RunFailure, match="cannot be fitted: profile-1: no steady timer interval"):
        phases.first_fit(SMALL, None, settings, [_ingested("profile-1")])


# --- the search --------------------------------------------------------------------------------


def test_a_large_space_is_searched_on_ray_tasks_with_the_same_top(
    ray_cluster, tmp_path, monkeypatch
):
    import ray_layout.tuning.phases as phases

    recipe = with_parallel(HANDBOOK, pp=4)
    costs = load_costs("configs/costs/handbook_h200_example.json")
    settings = small_settings(tmp_path, "search")
    alone = phases.search(recipe, costs, settings, cpus=4)
    assert alone.spec.shards == 1  # 680 layouts: one process
    monkeypatch.setattr(phases, "SHARD_ABOVE", 100)
    sharded = phases.search(recipe, costs, settings, cpus=4)
    assert sharded.spec.shards == 4
    found, alone_found = sharded.found, alone.found
    assert [c.layout for c in found.candidates] == [c.layout for c in alone_found.candidates]
    assert found.scored == alone_found.scored


def test_the_fit_calibrates_memory_under_the_jobs_own_memory_flags(monkeypatch):
    recompute = ("--recompute-granularity", "full", "--recompute-method", "uniform",
                 "--recompute-num-layers", "1")  # fmt: skip
    recipe = replace(SMALL, megatron_args=recompute)
    seen = {}

    def fit_costs(model, parallel, observations, *, gpus_per_node, memory):
        seen["memory"] = memory
        raise MeasurementError("stop here")

    monkeypatch.setattr(phases, "fit_costs", fit_costs)
    monkeypatch.setattr(phases, "observations_from_store", lambda *args: [])
    with pytest.raises(MeasurementError):
        phases.fit(recipe, None, study="s", run_ids=[], gpus_per_node=GPUS_PER_NODE)
    assert seen["memory"] == memory_settings(recompute)
