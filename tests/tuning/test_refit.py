"""The tune's refit: the first fit stands where the A/B runs cannot be used, and says why; arms
that ran another recompute setting than the job's are left out, and the note says so; under
combined 1F1B the arms' steps (each simulated under its own recomputation) fit the EP all-to-all
time, stored for the study's next plan."""

from __future__ import annotations

import json
from dataclasses import replace
from types import SimpleNamespace

import pytest

from ray_layout.ab.cost import ArmCost
from ray_layout.ab.live import Arm, ArmResult
from ray_layout.ab.stats import ABConfig, ArmTrace
from ray_layout.ab.vocabulary import ArmRole
from ray_layout.errors import ConfigError, MeasurementError
from ray_layout.measure.fit import FitResult
from ray_layout.measure.store import CostStore
from ray_layout.model.costs import costs_from_flops
from ray_layout.model.layout import Layout
from ray_layout.model.spec import with_parallel
from ray_layout.tuning import refit as refit_module
from ray_layout.tuning.phases import Searched
from ray_layout.tuning.refit import arm_problem, refit, refit_all_to_all
from ray_layout.tuning.summarize import refit_note
from search.planner import PlanOptions, Problem, SearchSpec, score_given
from tests.helpers.cluster import GPUS_PER_NODE
from tests.helpers.tuning_small import GROUPED, HANDBOOK, SMALL

DEFAULT = ABConfig()
SELECTIVE = ("--recompute-granularity", "selective", "--recompute-modules", "layernorm", "moe_act")


def _ingested(run_id: str) -> SimpleNamespace:
    return SimpleNamespace(ingested=SimpleNamespace(run_id=run_id))


def _arm(name: str, recompute: tuple[str, ...] = ()) -> Arm:
    layout = Layout.parse("Et*9|t*7mL", 2)
    return Arm(name, layout, (ArmRole.CANDIDATE,), 0.0, (), recompute=recompute)


def _ran(run_id: str | None, arm: Arm) -> SimpleNamespace:
    return SimpleNamespace(run=_ingested(run_id) if run_id else None, arm=arm)


@pytest.mark.parametrize(
    ("error", "surfaces"),
    [(MeasurementError("ab-1: no steady timer interval"), False), (ConfigError("bad"), True)],
)
def test_refit_keeps_the_first_fit_only_for_runs_it_cannot_use_and_says_why(
    monkeypatch, error, surfaces
):
    def fit(recipe, store, *, study, run_ids, gpus_per_node):
        assert run_ids == ["profile-1", "ab-1"]
        raise error

    monkeypatch.setattr(refit_module, "fit", fit)
    profiled = [_ingested("profile-1")]
    results = [_ran("ab-1", _arm("candidate-1")), _ran(None, _arm("default"))]
    args = {"study": "study", "profiled": profiled, "gpus_per_node": GPUS_PER_NODE}
    if surfaces:  # a bad input is not "nothing new to refit"
        with pytest.raises(ConfigError):
            refit(SMALL, None, results=results, **args)
        return
    refined = refit(SMALL, None, results=results, **args)
    assert refined.result is None and "no steady timer interval" in refined.skipped
    assert refit_note(SMALL, refined, None, None, None) == refined.skipped  # the report says it
    assert refit(SMALL, None, results=[_ran(None, _arm("default"))], **args).result is None


def test_arms_that_ran_another_recompute_setting_are_left_out_of_the_refit_and_said(monkeypatch):
    fitted = []

    def fit(recipe, store, *, study, run_ids, gpus_per_node):
        fitted.append(run_ids)
        return FitResult(costs_from_flops(recipe.model, recipe.parallel), (), {}, {}, {}, (), None)

    monkeypatch.setattr(refit_module, "fit", fit)
    args = {"study": "study", "profiled": [_ingested("profile-1")], "gpus_per_node": 4}
    results = [_ran("ab-1", _arm("candidate-1", SELECTIVE)), _ran("ab-2", _arm("current"))]
    refined = refit(SMALL, None, results=results, **args)
    assert fitted == [["profile-1", "ab-2"]] and refined.result is not None
    assert refined.left_out.startswith("candidate-1 left out of the refit: they ran another")
    # a job that recomputes as the candidate did fits the candidate's run, not the other
    job = replace(GROUPED, megatron_args=(*GROUPED.megatron_args, *SELECTIVE))
    refined = refit(job, None, results=results, **args)
    assert fitted[-1] == ["profile-1", "ab-1"] and refined.left_out.startswith("current left")
    # nothing left to refit with: the first fit stands, and the note says why
    alone = refit(SMALL, None, results=results[:1], **args)
    assert alone.result is None and len(fitted) == 2
    assert refit_note(SMALL, alone, None, None, DEFAULT) == alone.left_out


def test_under_combined_1f1b_the_refit_fits_the_all_to_all_to_the_arms_steps(tmp_path):
    """The A/B arms time merged steps whole: the first fit's unit costs stay, the all-to-all
    time comes from their measured steps (made with 0.4 ms; the FLOP prior says 0.89), and the
    refit is stored for the study's next plan."""
    flags = ("--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute", "--moe-grouped-gemm")
    recipe = replace(with_parallel(HANDBOOK, pp=4, vpp=2), megatron_args=flags)
    costs = costs_from_flops(recipe.model, recipe.parallel)
    searched = Searched(None, SearchSpec(num_microbatches=32), PlanOptions(), 0.0)
    truth = Problem.of(recipe, replace(costs, a2a_ms=0.4), searched.spec, searched.options)

    def arm_result(index: int, text: str, recompute: tuple[str, ...] = ()) -> ArmResult:
        layout = Layout.parse(text, 4)
        arm = Arm(f"arm-{index}", layout, (ArmRole.CANDIDATE,), 0.0, (), recompute=recompute)
        at = arm_problem(recipe, arm, truth.costs, searched)  # each arm ran its recomputation
        trace = ArmTrace(arm.name, text, (score_given(layout, at).mean_ms,) * 12)
        run = _ingested(f"ab-{index}")
        return ArmResult(arm, trace, run, None, ArmCost(8, 0.0, trace.steps_ms, 12))

    texts = ("Et*5|t*5|t|t|t|tt|t|mL", "Ett|(tt|)*6t*2mL", "Ett|t*3|t*3|(tt|)*4mL")
    results = [arm_result(i, text) for i, text in enumerate(texts)]
    results[1] = arm_result(1, texts[1], SELECTIVE)
    recomputed = arm_problem(recipe, results[1].arm, truth.costs, searched)
    assert recomputed.memory != truth.memory  # the arm's own setting, not the job's
    first = FitResult(costs, (), {}, {}, {}, (), None)
    store = CostStore(tmp_path)
    refined = refit_all_to_all(
        recipe, store, study="s", first=first, searched=searched, results=results, config=DEFAULT
    )
    assert refined.result.costs.a2a_ms == pytest.approx(0.4, abs=5e-3)
    assert refined.result.costs.forward_ms == costs.forward_ms
    assert "fitted to 3 combined 1F1B arms' steps (the prior said 0.895 ms)" in refined.fitted
    stored = store.read("fits", study="s")
    assert json.loads(stored.costs_json.iloc[-1])["a2a_ms"] == refined.result.costs.a2a_ms
    assert json.loads(stored.runs.iloc[-1]) == ["ab-0", "ab-1", "ab-2"]
