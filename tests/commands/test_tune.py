"""The tune command (``commands/tune.py``): its flags become the driver's settings, checked before
any cluster; its end (the JSON line, ``--write-script``) and its interruption (Ctrl-C, SIGTERM
from ``ray job stop``). The tune itself is faked here; it runs in tests/tuning/test_loop.py."""

from __future__ import annotations

import json
import os
import signal
from dataclasses import replace
from pathlib import Path

import pytest

from ray_layout.ab.stats import ABConfig
from ray_layout.commands import tune
from ray_layout.commands.flags import from_args
from ray_layout.commands.tune import TuneFlags, build_parser, main, tune_settings
from ray_layout.errors import EXIT_INTERRUPTED, ConfigError
from ray_layout.model.loading import load_recipe
from ray_layout.tuning.settings import study_id
from tests.helpers.commands_cli import DEEPSEEK, HANDBOOK, SCRIPT
from tests.helpers.report_summary import PICK, handbook_summary


def flags_of(*argv: str) -> TuneFlags:
    return from_args(TuneFlags, build_parser().parse_args(list(argv)))


def test_the_ab_flags_default_to_the_ab_tests_own_settings():
    assert flags_of(HANDBOOK).options.ab == ABConfig()
    given = flags_of(HANDBOOK, "--ab-looks", "2,4", "--ab-batch", "5", "--ab-warmup", "1")
    wanted = replace(ABConfig(), looks=(2, 4), batch_size=5, warmup_iterations=1)
    assert given.options.ab == wanted


def test_an_ab_budget_past_the_iteration_bound_is_refused_with_its_sum():
    with pytest.raises(ConfigError) as refused:
        flags_of(HANDBOOK, "--ab-warmup", "10", "--ab-batch", "100000", "--ab-looks", "3,20")
    assert str(refused.value) == (
        "--ab-warmup 10 + --ab-batch 100000 x 20 batches (--ab-looks) = 2,000,010 iterations "
        "per arm, more than 1,000,000"
    )


def test_recompute_searches_the_jobs_own_setting_unless_asked_for_every_one():
    assert flags_of(HANDBOOK).options.recompute == "job"
    assert flags_of(HANDBOOK, "--recompute", "auto").options.recompute == "auto"
    with pytest.raises(SystemExit):
        flags_of(HANDBOOK, "--recompute", "always")


def test_the_study_and_report_folder_follow_the_model_unless_given(tmp_path):
    recipe = load_recipe(HANDBOOK)
    flags = flags_of(HANDBOOK, "--store", str(tmp_path / "store"))
    settings = tune_settings(flags, recipe, 4)
    assert settings.study == study_id(recipe, flags.runner.to_backend())
    assert settings.report_dir == Path("ray_layout_report") / settings.study
    assert (settings.store, settings.gpus_per_node, settings.log_dir) == (
        tmp_path / "store",
        4,
        None,
    )
    assert settings.options == flags.options  # the flags' own options, unchanged
    named = flags_of(
        HANDBOOK,
        "--study",
        "mine",
        "--report-dir",
        str(tmp_path / "r"),
        "--log-dir",
        str(tmp_path / "logs"),
    )
    settings = tune_settings(named, recipe, 8)
    assert (settings.study, settings.report_dir) == ("mine", tmp_path / "r")
    assert settings.log_dir == tmp_path / "logs"


def test_a_config_without_a_batch_is_refused_before_any_cluster(capsys, monkeypatch):
    monkeypatch.setattr(tune, "connected", lambda *args: pytest.fail("a cluster was started"))
    assert main([DEEPSEEK, "--pp", "4"]) == 2
    assert capsys.readouterr().err == (
        "error: the number of micro-batches is unknown: give --global-batch-size\n"
    )


@pytest.fixture
def signals():
    """``main`` takes SIGINT and SIGTERM for the tune; the test process gets its own back."""
    saved = {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM)}
    yield
    for number, handler in saved.items():
        signal.signal(number, handler)


@pytest.fixture
def tuned(monkeypatch, signals):
    """A tune that ends at once with the handbook's summary; its cancel event kept."""
    cancelled = []

    def tune_on_cluster(flags, console, cancel):
        cancelled.append(cancel)
        recipe = load_recipe(flags.config)
        return handbook_summary(), recipe, tune_settings(flags, recipe, 4)

    monkeypatch.setattr(tune, "tune_on_cluster", tune_on_cluster)
    return cancelled


def test_json_prints_the_pick_its_flags_the_study_and_the_report(capsys, tuned, tmp_path):
    assert main([HANDBOOK, "--report-dir", str(tmp_path), "--json"]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    summary = handbook_summary()
    assert json.loads(last) == {
        "pick": PICK,
        "flags": list(summary.flags),
        "recompute": [],
        "study": summary.study,
        "report_dir": str(tmp_path),
    }
    assert not tuned[0].is_set()


def test_write_script_hands_back_the_script_with_the_pick_and_what_it_measured(
    capsys, tuned, tmp_path
):
    out = tmp_path / "tuned.sh"
    assert main([SCRIPT, "--write-script", str(out)]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    comment = out.read_text().splitlines()[1]
    assert comment.startswith(f"# ray_layout tune, study {handbook_summary().study}: ")
    assert f"--pipeline-model-parallel-layout {PICK}, measured " in comment
    assert load_recipe(str(out)).split.layout == PICK


SELECTIVE = ("--recompute-granularity", "selective", "--recompute-modules", "core_attn")


def test_a_pick_that_recomputes_is_in_the_json_and_the_written_script_says_what_it_lacks(
    capsys, monkeypatch, signals, tmp_path
):
    def tune_on_cluster(flags, console, cancel):
        recipe = load_recipe(flags.config)
        summary = replace(
            handbook_summary(), flags=(*handbook_summary().flags, *SELECTIVE), recompute=SELECTIVE
        )
        return summary, recipe, tune_settings(flags, recipe, 4)

    monkeypatch.setattr(tune, "tune_on_cluster", tune_on_cluster)
    out = tmp_path / "tuned.sh"
    assert main([SCRIPT, "--write-script", str(out), "--json"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert (
        f"{out} keeps your job's recompute flags: change them to {' '.join(SELECTIVE)}" in printed
    )
    shown = json.loads(printed[-1])
    assert shown["recompute"] == list(SELECTIVE) and shown["flags"][-4:] == list(SELECTIVE)
    assert load_recipe(str(out)).split.layout == PICK


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_cancels_the_runs_and_says_the_tune_resumes(
    capsys, monkeypatch, signals, stop
):
    cancels = []

    def tune_on_cluster(flags, console, cancel):
        cancels.append(cancel)
        os.kill(os.getpid(), stop)  # as `ray job stop`, or Ctrl-C, would
        pytest.fail("the signal did not stop the tune")

    monkeypatch.setattr(tune, "tune_on_cluster", tune_on_cluster)
    assert main([HANDBOOK]) == EXIT_INTERRUPTED
    assert cancels[0].is_set()
    err = capsys.readouterr().err
    assert err.startswith("interrupted: every run was stopped and its GPUs released")
    assert err.rstrip().endswith("run the same command again to resume")
