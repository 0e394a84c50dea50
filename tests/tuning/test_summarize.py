"""From what the phases found to the report's summary: the flags to paste (with the pick's
recomputation where it is not the job's), each arm's outcome from its last decision, the
timelines drawn beside the pick, the GPU time of the profiling runs, the refit's note, and a
tune without an A/B."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from ray_layout.ab.cost import ArmCost
from ray_layout.ab.decisions import Decision
from ray_layout.ab.live import ABOutcome, Arm, ArmResult
from ray_layout.ab.stats import ABConfig, ArmTrace
from ray_layout.ab.vocabulary import ABAction, ArmRole, ArmStatus
from ray_layout.measure.store import CostStore
from ray_layout.model.costs import load_costs
from ray_layout.model.layout import Layout
from ray_layout.model.spec import with_parallel
from ray_layout.model.split import PipelineSplit
from ray_layout.runtime.layout_runs import ProfiledRun
from ray_layout.runtime.run_spec import RunResult
from ray_layout.tuning import phases
from ray_layout.tuning.phases import choose_arms
from ray_layout.tuning.refit import Refit
from ray_layout.tuning.summarize import (
    outcomes,
    paste_flags,
    predicted_only,
    profile_gpu_seconds,
    recompute_note,
    refit_note,
    summarize,
    timelines,
)
from search.planner import PlanOptions, Problem, SearchSpec, score_given
from tests.helpers.planner_fixtures import handbook_example_plan
from tests.helpers.tuning_small import CONFIG, HANDBOOK, small_settings

COSTS = load_costs("configs/costs/handbook_h200_example.json")
PP4 = with_parallel(HANDBOOK, pp=4)
SELECTIVE = ("--recompute-granularity", "selective", "--recompute-modules", "core_attn", "moe")
FULL = ("--recompute-granularity", "full", "--recompute-method", "uniform",
        "--recompute-num-layers", "1")  # fmt: skip


def searched_of(found) -> phases.Searched:
    return phases.Searched(found, SearchSpec(32), PlanOptions(hbm_gib=131), 0.1234)


def test_paste_flags_carry_the_layout_and_its_vpp():
    assert paste_flags(Layout.parse("Et*5|t*6|t*5|mL", 4)) == (
        "--pipeline-model-parallel-size",
        "4",
        "--pipeline-model-parallel-layout",
        "Et*5|t*6|t*5|mL",
    )
    interleaved = Layout.parse("Et*2|t*2|t*2|t*2|t*2|t*2|t*2|t*2mL", 4)
    assert interleaved.vpp == 2 and paste_flags(interleaved)[1] == "4"
    # a pick that recomputes otherwise than the job: its recompute flags follow the layout's
    layout = Layout.parse("Et*5|t*6|t*5|mL", 4)
    assert paste_flags(layout, SELECTIVE) == (*paste_flags(layout), *SELECTIVE)


def test_what_the_user_changes_besides_pasting_where_the_pick_recomputes_otherwise():
    assert recompute_note(SELECTIVE, SELECTIVE) is None and recompute_note((), ()) is None
    assert recompute_note((), SELECTIVE) == (
        f"the pick recomputes ({' '.join(SELECTIVE)}): the flags to paste carry it"
    )
    assert recompute_note(FULL, SELECTIVE) == (
        f"the pick recomputes otherwise than your job: take out your recompute flags "
        f"({' '.join(FULL)}) and paste {' '.join(SELECTIVE)}"
    )
    assert recompute_note(FULL, ()).endswith(f"({' '.join(FULL)}) to run without recomputation")


def test_each_arm_s_status_and_reason_come_from_its_last_decision():
    config = ABConfig(warmup_iterations=2, batch_size=3, looks=(2, 4))
    layout = Layout.parse("Et*5|t*6|t*5|mL", 4)

    def result(name, n, failure=None, ran=True):
        arm = Arm(name, layout, (ArmRole.CANDIDATE,), 100.0, (40.0,) * 4)
        steps = (100.0,) * n
        run = SimpleNamespace() if ran else None
        return ArmResult(
            arm,
            ArmTrace(name, str(layout), steps, failure),
            run,
            None,
            ArmCost(8, 0.0, steps, config.max_iterations),
        )

    def decision(arm, look, action, reason):
        return Decision(arm, str(layout), look, action, reason, 0.0, 0.5, None, 6, 100.0)

    ab = ABOutcome(
        "ab-test",
        (
            result("won", 14),
            result("stopped", 8),
            result("failed", 5, "oom"),
            result("short", 4),
            result("never", 0, ran=False),
        ),
        (
            decision("stopped", 0, ABAction.CONTINUE, "close"),
            decision("stopped", 0, ABAction.STOP, "slower"),
            decision("failed", 0, ABAction.STOP, "out of memory"),
            decision("won", 2, ABAction.WIN, "won on time"),
        ),
    )
    rows = {o.arm: (o.status, o.reason, o.roles) for o in outcomes(ab, config)}
    assert {arm: row[:2] for arm, row in rows.items()} == {
        "won": (ArmStatus.WON, "won on time"),
        "stopped": (ArmStatus.STOPPED, "slower"),
        "failed": (ArmStatus.FAILED, "out of memory"),
        "short": (ArmStatus.FINISHED, "no decision"),  # too few steps for any verdict
        "never": (ArmStatus.NOT_RUN, "the test ended before its turn"),
    }
    assert {row[2] for row in rows.values()} == {(ArmRole.CANDIDATE,)}
    assert ab.winner.arm.name == "won" and ab.last_decisions["stopped"].action is ABAction.STOP
    assert [action.status for action in ABAction] == ["finished", "stopped", "won", "lost"]
    assert [action.is_terminal for action in ABAction] == [False, True, True, True]


def test_the_report_draws_the_current_layout_beside_the_pick_and_the_default():
    found = handbook_example_plan(10, PipelineSplit(layout="Et*3|t*5|t*5|t*3mL"))
    pick = choose_arms(found, 2)[0]
    drawn = timelines(HANDBOOK, pick, searched_of(found), COSTS)
    assert list(drawn) == ["pick", "current", "Megatron default"]
    assert [str(sim.candidate.layout) for sim in drawn.values()] == [
        str(pick.layout),
        "Et*3|t*5|t*5|t*3mL",
        "Et*4|t*4|t*4|t*4mL",
    ]
    # the config runs Megatron's default today: drawn under both names
    found = handbook_example_plan(10, PipelineSplit(layout="Et*4|t*4|t*4|t*4mL"))
    arms = choose_arms(found, 2)
    searched = searched_of(found)
    drawn = timelines(HANDBOOK, arms[0], searched, COSTS)
    assert list(drawn) == ["pick", "current", "Megatron default"]
    assert drawn["current"].candidate.layout == drawn["Megatron default"].candidate.layout
    # no split of its own: the pick and the default only
    plain = handbook_example_plan(10)
    assert list(timelines(HANDBOOK, pick, searched_of(plain), COSTS)) == [
        "pick",
        "Megatron default",
    ]
    # a pick that recomputes is drawn under its recomputation, the baselines under the job's
    recomputing = timelines(HANDBOOK, replace(pick, recompute=FULL), searched_of(plain), COSTS)
    default = timelines(HANDBOOK, pick, searched_of(plain), COSTS)["Megatron default"]
    assert recomputing["pick"].candidate.mean_ms > drawn["pick"].candidate.mean_ms
    assert recomputing["Megatron default"].candidate.mean_ms == default.candidate.mean_ms


def test_without_an_ab_every_arm_is_a_prediction_and_the_best_is_the_pick():
    found = handbook_example_plan(10)
    arms = choose_arms(found, 2)
    rows = predicted_only(arms)
    assert [row.arm for row in rows] == [arm.name for arm in arms]
    assert {(row.status, row.reason, row.measured_ms, row.iterations) for row in rows} == {
        (ArmStatus.NOT_RUN, "--ab-top 0: no A/B test", None, 0)
    }
    assert [row.predicted_ms for row in rows] == [arm.predicted_ms for arm in arms]
    first = SimpleNamespace(costs=COSTS, warnings=["unit m: residual 4.1%"])

    def summary_of(arms: list) -> object:
        return summarize(
            PP4,
            settings=small_settings(Path("/nowhere"), "study"),
            config_path=CONFIG,
            searched=searched_of(found),
            first=first,
            arms=arms,
            ab=ABOutcome("ab-none", (), ()),
            profile_seconds=120.0,
            notes=("a note",),
            phase_seconds={"size": 0.5},
        )

    summary = summary_of(arms)
    assert summary.pick == str(arms[0].layout) and summary.pick_source == "prediction (no A/B)"
    assert summary.flags == paste_flags(arms[0].layout) and summary.parallel["vpp"] == 1
    assert (summary.gpu_seconds_spent, summary.gpu_seconds_full) == (120.0, 120.0)
    assert summary.arms == rows and summary.decisions == ()
    assert summary.search.seconds == 0.123 and summary.search.scored == found.scored
    assert summary.fit_warnings == ("unit m: residual 4.1%",) and summary.notes == ("a note",)
    assert list(summary.timelines) == ["pick", "Megatron default"]
    assert summary.recompute == summary.job_recompute == ()
    # the pick of a layout x recompute search: its flags to paste and a note carry its setting
    arms = [replace(arms[0], recompute=SELECTIVE), *arms[1:]]
    summary = summary_of(arms)
    assert summary.flags == paste_flags(arms[0].layout, SELECTIVE)
    assert (summary.recompute, summary.job_recompute) == (SELECTIVE, ())
    assert summary.notes == ("a note", recompute_note((), SELECTIVE))
    assert [row.recompute for row in summary.arms] == [arm.recompute for arm in arms]
    recomputed = Problem.of(replace(PP4, megatron_args=SELECTIVE), COSTS, SearchSpec(32),
                            PlanOptions(hbm_gib=131))  # fmt: skip
    predicted = score_given(arms[0].layout, recomputed).mean_ms
    assert summary.timelines["pick"].candidate.mean_ms == predicted > arms[0].predicted_ms


def run_of(run_id: str, ranks: int) -> ProfiledRun:
    result = RunResult(run_id, "finished", None, [0] * ranks, [], 1, None)
    return ProfiledRun(Layout.parse("Et*8|t*8mL", 2), result, None)


def test_profiling_gpu_seconds_are_each_attempts_wall_time_on_every_rank(tmp_path):
    """A run's id is its last attempt's, whose row holds its wall time; other runs do not
    count."""
    store = CostStore(tmp_path)
    rows = [
        {"run_id": "p1", "started_at": 200.0, "finished_at": 210.0},
        {"run_id": "p2", "started_at": 300.0, "finished_at": 305.0},
        {"run_id": "other", "started_at": 0.0, "finished_at": 1000.0},
    ]
    for row in rows:
        store.write("runs", [row], "s")
    ran = [run_of("p1", 8), run_of("p2", 4), run_of("never stored", 8)]
    assert profile_gpu_seconds(store, "s", ran) == pytest.approx(10.0 * 8 + 5.0 * 4)
    assert profile_gpu_seconds(store, "s", []) == 0.0


def test_the_refit_note_says_how_far_the_refined_model_is_from_what_was_measured():
    config = ABConfig(warmup_iterations=2, batch_size=3, looks=(2, 4))
    found = handbook_example_plan(10)
    arms = choose_arms(found, 2)[:2]
    searched = searched_of(found)
    problem = Problem.of(PP4, COSTS, searched.spec, searched.options)

    def measured(arm: Arm, ratio: float, failure: str | None = None) -> ArmResult:
        step = score_given(arm.layout, problem).mean_ms * ratio
        trace = ArmTrace(arm.name, str(arm.layout), (step,) * 8, failure)
        return ArmResult(arm, trace, None, None, ArmCost(8, 0.0, trace.steps_ms, 14))

    refined = Refit(SimpleNamespace(costs=COSTS))
    ab = ABOutcome("ab", (measured(arms[0], 1 / 1.1), measured(arms[1], 1 / 0.95)), ())
    assert refit_note(PP4, refined, ab, searched, config) == (
        "refit with the A/B runs: the refined cost model is within 10.0% of every measured arm "
        "(mean 7.5%); the next plan of this study uses it"
    )
    failed = ABOutcome("ab", (measured(arms[0], 1.0, "oom"),), ())
    assert refit_note(PP4, refined, failed, searched, config) == "refit: no arm measured"
    assert refit_note(PP4, Refit(None), ab, searched, config) is None
    assert refit_note(PP4, Refit(None, "no new runs"), ab, searched, config) == "no new runs"
    # an arm that recomputed is predicted under its own setting; runs left out are said
    slower = replace(arms[1], recompute=FULL)
    at = Problem.of(replace(PP4, megatron_args=FULL), COSTS, searched.spec, searched.options)
    step = score_given(slower.layout, at).mean_ms
    trace = ArmTrace(slower.name, str(slower.layout), (step,) * 8)
    recomputed = ArmResult(slower, trace, None, None, ArmCost(8, 0.0, trace.steps_ms, 14))
    left = replace(refined, left_out="candidate-2 left out")
    ab = ABOutcome("ab", (measured(arms[0], 1 / 1.1), recomputed), ())
    assert refit_note(PP4, left, ab, searched, config) == (
        "refit with the A/B runs: the refined cost model is within 10.0% of every measured arm "
        "(mean 5.0%); the next plan of this study uses it; candidate-2 left out"
    )
