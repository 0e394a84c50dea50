"""The tune driver: its pure choices, its one-line errors, and whole tunes on the simulated
cluster (emulated Megatron): in process and resumed, killed mid-run and resumed, interrupted."""

from __future__ import annotations

import dataclasses
import io
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.console import Console

from ray_layout.ab.cost import ArmCost
from ray_layout.ab.decisions import Decision
from ray_layout.ab.live import ABOutcome, Arm, ArmResult
from ray_layout.ab.stats import ABConfig, ArmTrace
from ray_layout.ab.vocabulary import ABAction, ArmRole, ArmStatus
from ray_layout.commands.tune import main
from ray_layout.driver import phases
from ray_layout.driver.phases import choose_arms
from ray_layout.driver.settings import TuneSettings, study_id
from ray_layout.driver.summarize import outcomes, paste_flags, refit_note, timelines
from ray_layout.driver.tune import run_tune
from ray_layout.errors import ConfigError, MeasurementError, RunFailure
from ray_layout.measure.store import CostStore
from ray_layout.model.costs import load_costs
from ray_layout.model.layout import Layout
from ray_layout.model.loading import load_recipe
from ray_layout.model.spec import with_parallel
from ray_layout.model.split import PipelineSplit
from ray_layout.runtime.policy import RunPolicy
from ray_layout.runtime.profiling import Backend
from search.planner import PlanOptions, SearchSpec
from tests.conftest import GPUS_PER_NODE, NODES
from tests.planner_fixtures import handbook_example_plan

CONFIG = "configs/handbook_7b_a1b.yaml"
HARDWARE = Path("cluster_configs/hardware/h200_emulated.yaml")
HANDBOOK = load_recipe(CONFIG)
# PP=2 x DP=2 (EP=2) on 4 GPUs, 8 micro-batches: small and quick on the emulated cluster
SMALL = with_parallel(HANDBOOK, pp=2, global_batch_size=32)
SMALL_FLAGS = ["--pp", "2", "--global-batch-size", "32", "--profile-iters", "6",
               "--ab-top", "2", "--ab-warmup", "2", "--ab-batch", "3", "--ab-looks", "2,4",
               "--hardware", str(HARDWARE), "--hbm-gb", "131", "--timeout-s", "240",
               "--heartbeat-s", "120"]  # fmt: skip


def small_settings(tmp_path: Path, study: str) -> TuneSettings:
    return TuneSettings(
        backend=Backend("emulated", hardware_profile=HARDWARE),
        store=tmp_path / "store",
        study=study,
        log_dir=tmp_path / "logs",
        report_dir=tmp_path / "report",
        gpus_per_node=GPUS_PER_NODE,
        ab=ABConfig(warmup_iterations=2, batch_size=3, looks=(2, 4)),
        ab_top=2,
        profile_iters=6,
        hbm_gib=131.0,
        policy=RunPolicy(timeout_s=240.0, heartbeat_s=120.0),
    )


def quiet() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, width=160), out


# --- pure choices ------------------------------------------------------------------------------


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
    assert [a.name for a in arms] == ["candidate-1", "candidate-2", "current", "default",
                                      "count-based"]  # fmt: skip
    assert str(arms[2].layout) == "Et*3|t*5|t*5|t*3mL" and arms[2].roles == (ArmRole.CURRENT,)
    # the config runs Megatron's default today: one arm, the current's name, both roles
    found = handbook_example_plan(10, PipelineSplit(layout="Et*4|t*4|t*4|t*4mL"))
    arms = choose_arms(found, 2)
    assert [(a.name, a.roles) for a in arms[2:]] == [
        ("current", (ArmRole.CURRENT, ArmRole.DEFAULT)),
        ("count-based", (ArmRole.COUNT_BASED,)),
    ]
    # the report draws the current layout beside the pick and the default
    searched = phases.Searched(found, SearchSpec(32), PlanOptions(hbm_gib=131), 0.0)
    costs = load_costs("configs/costs/handbook_h200_example.json")
    drawn = timelines(HANDBOOK, arms[0].layout, searched, costs)
    assert list(drawn) == ["pick", "current", "Megatron default"]
    assert drawn["current"].candidate.layout == drawn["Megatron default"].candidate.layout


def test_paste_flags_carry_the_layout_and_its_vpp():
    assert paste_flags(Layout.parse("Et*5|t*6|t*5|mL", 4)) == (
        "--pipeline-model-parallel-size", "4",
        "--pipeline-model-parallel-layout", "Et*5|t*6|t*5|mL",
    )  # fmt: skip
    interleaved = Layout.parse("Et*2|t*2|t*2|t*2|t*2|t*2|t*2|t*2mL", 4)
    assert interleaved.vpp == 2 and paste_flags(interleaved)[1] == "4"


def test_each_arm_s_status_and_reason_come_from_its_last_decision():
    config = ABConfig(warmup_iterations=2, batch_size=3, looks=(2, 4))
    layout = Layout.parse("Et*5|t*6|t*5|mL", 4)

    def result(name, n, failure=None, ran=True):
        arm = Arm(name, layout, (ArmRole.CANDIDATE,), 100.0, (40.0,) * 4)
        steps = (100.0,) * n
        run = SimpleNamespace() if ran else None
        return ArmResult(arm, ArmTrace(name, str(layout), steps, failure), run, None,
                         ArmCost(8, 0.0, steps, config.max_iterations))  # fmt: skip

    def decision(arm, look, action, reason):
        return Decision(arm, str(layout), look, action, reason, 0.0, 0.5, None, 6, 100.0)

    ab = ABOutcome(
        "ab-test",
        (result("won", 14), result("stopped", 8), result("failed", 5, "oom"), result("short", 4),
         result("never", 0, ran=False)),
        (decision("stopped", 0, ABAction.CONTINUE, "close"),
         decision("stopped", 0, ABAction.STOP, "slower"),
         decision("failed", 0, ABAction.STOP, "out of memory"),
         decision("won", 2, ABAction.WIN, "won on time")),
    )  # fmt: skip
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


def _ingested(run_id: str) -> SimpleNamespace:
    return SimpleNamespace(ingested=SimpleNamespace(run_id=run_id))


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

    monkeypatch.setattr(phases, "fit", fit)
    profiled = [_ingested("profile-1")]
    results = [SimpleNamespace(run=_ingested("ab-1")), SimpleNamespace(run=None)]
    args = {"study": "study", "profiled": profiled, "gpus_per_node": GPUS_PER_NODE}
    if surfaces:  # a bad input is not "nothing new to refit"
        with pytest.raises(ConfigError):
            phases.refit(SMALL, None, results=results, **args)
        return
    refined = phases.refit(SMALL, None, results=results, **args)
    assert refined.result is None and "no steady timer interval" in refined.skipped
    assert refit_note(SMALL, refined, None, None, None) == refined.skipped  # the report says it
    assert phases.refit(SMALL, None, results=[SimpleNamespace(run=None)], **args).result is None


def test_profiling_runs_that_cannot_be_fitted_are_a_run_failure(monkeypatch, tmp_path):
    def fit(recipe, store, *, study, run_ids, gpus_per_node):
        raise MeasurementError("profile-1: no steady timer interval")

    monkeypatch.setattr(phases, "fit", fit)
    settings = small_settings(tmp_path, "study")
    with pytest.raises(RunFailure, match="cannot be fitted: profile-1: no steady timer interval"):
        phases.first_fit(SMALL, None, settings, [_ingested("profile-1")])


def test_study_id_is_stable_and_changes_with_what_changes_the_measurements():
    emulated = Backend("emulated", hardware_profile=HARDWARE)
    assert study_id(SMALL, emulated) == study_id(SMALL, emulated)
    assert study_id(SMALL, emulated).startswith("handbook_7b_a1b-pp2-")
    other_hardware = Backend(
        "emulated", hardware_profile=Path("cluster_configs/hardware/a100_emulated.yaml")
    )
    assert study_id(SMALL, emulated) != study_id(SMALL, other_hardware)
    assert study_id(SMALL, emulated) != study_id(with_parallel(SMALL, dp=4), emulated)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--ab-looks", "3,x"], "--ab-looks must be integers"),
        (["--ab-looks", "6,3"], "looks must be strictly increasing"),
        (["--hardware", "nowhere.yaml"], "--hardware nowhere.yaml: no such file"),
        (["--backend", "megatron"], "needs --megatron-path"),
        (["--profile-iters", "2"], "--profile-iters must be >= 5"),
        (["--ab-top", "-1"], "--ab-top must be >= 0"),
        (["--hbm-gb", "0"], "--hbm-gb must be positive"),
        (["--global-batch-size", "30"], "global_batch_size 30 not divisible"),
        (["--frobnicate"], "unrecognized arguments: --frobnicate"),
    ],
)
def test_bad_input_is_one_line_and_starts_no_cluster(flags, message, capsys):
    import ray

    connected = ray.is_initialized()
    try:
        code = main([CONFIG, "--pp", "4", *flags])
    except SystemExit as exit_:  # argparse's usage errors
        code = exit_.code
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and "Traceback" not in err
    assert ray.is_initialized() == connected  # nothing was started or joined


# --- whole tunes on the simulated cluster ------------------------------------------------------


def attempts(store: CostStore, study: str):
    runs = store.read("runs", study=study)
    return runs[runs.backend == "emulated"]


def cluster_is_clean(timeout_s: float = 30.0) -> bool:
    """Every placement group removed and every GPU free again."""
    import ray

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        groups = ray.util.placement_group_table().values()
        free = ray.available_resources().get("GPU", 0)
        if all(g["state"] == "REMOVED" for g in groups) and free == NODES * GPUS_PER_NODE:
            return True
        time.sleep(0.5)
    return False


def test_a_whole_tune_then_the_same_tune_again_from_the_store(ray_cluster, tmp_path):
    settings = small_settings(tmp_path, "whole")
    console, out = quiet()
    summary = run_tune(SMALL, settings, CONFIG, console, threading.Event())

    store = CostStore(settings.store)
    runs = attempts(store, "whole")
    assert (runs.source == "profile").sum() == 2 and set(runs.status) <= {"finished", "stopped"}
    arms = [a for a in summary.arms if a.status is not ArmStatus.NOT_RUN]
    assert len(arms) == len(runs) - 2 >= 3
    decisions = store.read("decisions", study="whole")
    assert (decisions.action == "win").sum() == 1
    assert summary.pick_source == "A/B test"
    won = next(a for a in summary.arms if a.status is ArmStatus.WON)
    assert won.layout == summary.pick and summary.flags == paste_flags(Layout.parse(won.layout, 2))
    for arm in arms:  # the fit's predictions hold; medians, as a loaded 2-core machine spikes
        median = statistics.median(arm.steps_ms[settings.ab.warmup_iterations :])
        assert median == pytest.approx(arm.predicted_ms, rel=0.15), arm
    assert summary.gpu_seconds_spent <= summary.gpu_seconds_full
    assert len(store.read("fits", study="whole")) == 2  # the fit, and the refit with the A/B
    assert (settings.report_dir / "report.md").read_text().count(summary.pick) >= 2
    assert (settings.report_dir / "report.html").is_file()
    assert cluster_is_clean()

    console, out = quiet()
    again = run_tune(SMALL, settings, CONFIG, console, threading.Event())
    assert len(attempts(store, "whole")) == len(runs)  # nothing ran twice
    assert again.pick == summary.pick
    assert out.getvalue().count("(from the store)") >= 2


@pytest.mark.slow
def test_a_tune_of_a_config_with_its_own_layout_measures_the_speedup_over_it(ray_cluster, tmp_path):
    recipe = replace(SMALL, split=PipelineSplit(layout="Et*7|t*9mL"))
    console, out = quiet()
    summary = run_tune(recipe, small_settings(tmp_path, "current"), CONFIG, console,
                       threading.Event())  # fmt: skip
    current = next(a for a in summary.arms if ArmRole.CURRENT in a.roles)
    assert current.layout == "Et*7|t*9mL" and current.status is not ArmStatus.NOT_RUN
    speedup = next(line for line in out.getvalue().splitlines() if line.startswith("Speedup: "))
    assert speedup.index(" over current (") < speedup.index(" over Megatron default (")
    report = (tmp_path / "report" / "report.md").read_text()
    assert "| current | `Et*7\\|t*9mL` |" in report  # its speedup row
    assert cluster_is_clean()


def tune_process(tmp_path: Path, study: str, address: str) -> subprocess.Popen[str]:
    places = ["--store", str(tmp_path / "store"), "--log-dir", str(tmp_path / "logs"),
              "--report-dir", str(tmp_path / "report")]  # fmt: skip
    command = [sys.executable, "-m", "ray_layout.tune", CONFIG, *SMALL_FLAGS,
               "--ray-address", address, "--study", study, *places]  # fmt: skip
    env = os.environ | {"RAY_AUTH_MODE": "disabled", "PYTHONUNBUFFERED": "1",
                        "PYTHONFAULTHANDLER": "1"}  # fmt: skip
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env)  # fmt: skip


def read_until(process: subprocess.Popen[str], marker: str, timeout_s: float) -> str:
    seen: list[str] = []
    deadline = time.monotonic() + timeout_s

    def pump() -> None:
        for line in process.stdout:
            seen.append(line)
            if marker in line:
                return

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    reader.join(max(0.0, deadline - time.monotonic()))
    text = "".join(seen)
    assert marker in text, f"no {marker!r} in time:\n{text}"
    return text


def test_a_killed_driver_leaves_no_run_and_the_tune_resumes(ray_cluster, tmp_path):
    process = tune_process(tmp_path, "killed", ray_cluster.address)
    try:
        read_until(process, "A/B:", 240)
        time.sleep(4.0)  # arms are running
    finally:
        process.kill()
        process.wait()
    assert cluster_is_clean(), "the killed driver's runs outlived it"
    store = CostStore(tmp_path / "store")
    profiled = attempts(store, "killed")
    assert (profiled.source == "profile").sum() == 2

    console, out = quiet()
    settings = small_settings(tmp_path, "killed")
    summary = run_tune(SMALL, settings, CONFIG, console, threading.Event())
    assert (attempts(store, "killed").source == "profile").sum() == 2  # not profiled again
    assert out.getvalue().count("(from the store)") >= 2
    assert summary.pick_source == "A/B test"


def test_ctrl_c_stops_every_run_and_exits_130(ray_cluster, tmp_path):
    process = tune_process(tmp_path, "interrupted", ray_cluster.address)
    try:
        read_until(process, "iteration 10/14", 240)  # A/B arms are running
        process.send_signal(signal.SIGINT)
        try:
            output, _ = process.communicate(timeout=60)
        except subprocess.TimeoutExpired:  # hung: its threads' stacks say where
            process.send_signal(signal.SIGABRT)
            output, _ = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130, output
    assert "interrupted: every run was stopped" in output and "Traceback" not in output
    assert cluster_is_clean(10.0)
    runs = attempts(CostStore(tmp_path / "store"), "interrupted")
    assert set(runs[runs.source == "profile"].status) == {"finished"}
    assert "cancelled" in set(runs[runs.source != "profile"].status)


def test_a_large_space_is_searched_on_ray_tasks_with_the_same_top(
    ray_cluster, tmp_path, monkeypatch
):
    import ray_layout.driver.phases as phases

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


def test_an_interleaved_tune_runs_its_candidates_with_their_vpp(ray_cluster, tmp_path):
    recipe = with_parallel(HANDBOOK, pp=4, vpp=2, ep=1, dp=1, global_batch_size=16)  # 4 GPUs
    settings = dataclasses.replace(small_settings(tmp_path, "interleaved"), ab_top=1)
    summary = run_tune(recipe, settings, CONFIG, quiet()[0], threading.Event())

    def layout_of(role: ArmRole) -> Layout:
        return next(Layout.parse(a.layout, 4) for a in summary.arms if role in a.roles)

    assert layout_of(ArmRole.CANDIDATE).vpp == 2 and layout_of(ArmRole.DEFAULT).vpp == 2
    assert layout_of(ArmRole.COUNT_BASED).vpp == 2  # cut over every virtual stage
    pick = Layout.parse(summary.pick, 4)  # whichever won the A/B: the layout carries its VPP
    assert summary.flags == paste_flags(pick) and summary.parallel["vpp"] == pick.vpp
    runs = attempts(CostStore(settings.store), "interleaved")
    assert set(runs.status) <= {"finished", "stopped"}
    assert cluster_is_clean()
