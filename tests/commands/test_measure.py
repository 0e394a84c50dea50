"""Measuring without a cluster: ``profile-layouts`` (the runs to make), ``ingest`` (logs of runs
made elsewhere, into the store) and ``fit`` (unit costs from the runs)."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import pytest

from ray_layout.commands.main import main
from ray_layout.measure.store import CostStore
from ray_layout.model.costs import load_costs
from ray_layout.model.layout import Layout
from ray_layout.model.loading import load_recipe
from ray_layout.model.memory_settings import memory_settings
from search.cost_model import build_cost_model
from tests.helpers import synthetic_runs
from tests.helpers.commands_cli import COSTS, HANDBOOK, run_json
from tests.helpers.measure_runs import HANDBOOK_DESIGN
from tests.helpers.megatron_layout_oracle import megatron_verdict
from tests.helpers.synthetic_runs import synthetic_log

LAYOUTS = ("Et*3|t*7|t*6m|L", "Et|t*15|m|L")


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> list[str]:
    """``--run LAYOUT=PATH`` words of two logged runs of the handbook with the example costs."""
    return logged_runs(tmp_path_factory.mktemp("logs"))


def logged_runs(folder: Path) -> list[str]:
    """The ``runs`` fixture's logs, written to ``folder``."""
    recipe, truth = load_recipe(HANDBOOK), load_costs(COSTS)
    words = []
    for seed, text in enumerate(LAYOUTS):
        log = synthetic_log(
            recipe.model,
            recipe.parallel,
            Layout.parse(text, 4),
            truth,
            16,
            iterations=8,
            noise_cv=0.01,
            seed=seed,
        )
        path = folder / f"run{seed}.log"
        path.write_text(log)
        words += ["--run", f"{text}={path}"]
    return words


def test_profile_layouts_proposes_runs_megatron_accepts_with_the_flags_to_make_them(capsys):
    report = run_json(capsys, "profile-layouts", HANDBOOK, "--runs", "3", "--train-iters", "7")
    assert len(report["runs"]) >= 3 and report["rank"] == len(report["units"])
    for run in report["runs"]:
        assert megatron_verdict(run["layout"], 4, 16, 1)[0]
        flags = run["megatron_flags"]
        assert flags[flags.index("--pipeline-model-parallel-layout") + 1] == run["layout"]
        assert flags[flags.index("--train-iters") + 1] == "7"
        assert run["predicted_ms"] > 0 and run["peak_memory_gib"] > 0


def test_profile_layouts_says_what_the_runs_identify_and_what_they_cannot(capsys):
    assert main(["profile-layouts", HANDBOOK]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "profiling runs identify E, t, m+L: design rank 3 of 3" in out
    assert f"--pipeline-model-parallel-layout '{HANDBOOK_DESIGN[0]}' --train-iters 20" in out
    assert "m and L apart: no run holds MTP without the loss" in out


def test_ingest_stores_a_run_once_and_says_so(capsys, runs, tmp_path):
    store = ["--store", str(tmp_path / "store")]
    assert main(["ingest", HANDBOOK, *runs[:2], *store]) == 0
    first = capsys.readouterr().out
    assert first.startswith(f"{runs[1]}: run-") and " stored (" in first
    again = run_json(capsys, "ingest", HANDBOOK, *runs, *store)
    assert [row["stored"] for row in again] == [False, True]  # the first run was in already
    assert all(row["timer_rows"] > 0 and row["skipped_lines"] == 0 for row in again)


def test_a_log_that_contradicts_a_size_given_as_a_flag_is_refused(capsys, runs, tmp_path):
    argv = ["ingest", HANDBOOK, *runs[:2], "--store", str(tmp_path / "s"), "--dp", "4"]
    assert main([*argv, "--ep", "4"]) == 2
    err = capsys.readouterr().err
    assert "the run's TP·CP·DP·PP is 16; check its parallel sizes" in err
    assert err.count("\n") == 1 and not (tmp_path / "s" / "runs").exists()


def test_fit_recovers_the_costs_the_runs_were_logged_with(capsys, runs, tmp_path):
    out = tmp_path / "costs.json"
    report = run_json(capsys, "fit", HANDBOOK, *runs, "-o", str(out))
    truth = load_costs(COSTS)
    for unit in ("t", "m", "L"):
        assert report["forward_ms"][unit] == pytest.approx(truth.forward_ms[unit], rel=0.02)
    assert load_costs(str(out)).forward_ms == pytest.approx(report["forward_ms"])
    assert set(report["residuals"]) == {path.partition("=")[2] for path in runs[1::2]}
    assert main(["fit", HANDBOOK, *runs, "-o", str(out)]) == 0
    assert capsys.readouterr().out.rstrip().endswith(f"wrote {out}")


def test_fit_from_one_run_warns_that_nothing_checks_it(capsys, runs, tmp_path):
    report = run_json(capsys, "fit", HANDBOOK, *runs[:2], "-o", str(tmp_path / "c.json"))
    assert any("fit any timers exactly" in warning for warning in report["warnings"])


def test_fit_takes_its_runs_from_logs_or_from_the_store_not_both(capsys, runs, tmp_path):
    both = ["fit", HANDBOOK, *runs, "--store", str(tmp_path), "-o", str(tmp_path / "c.json")]
    assert main(both) == 2
    assert capsys.readouterr().err == (
        "error: give the runs either as --run LAYOUT=PATH or from --store DIR\n"
    )
    assert not (tmp_path / "c.json").exists()


def test_a_store_fit_records_what_it_fitted(capsys, runs, tmp_path):
    store = str(tmp_path / "store")
    assert main(["ingest", HANDBOOK, *runs, "--store", store, "--study", "s1"]) == 0
    capsys.readouterr()
    costs = tmp_path / "costs.json"
    report = run_json(capsys, "fit", HANDBOOK, "--store", store, "--study", "s1", "-o", str(costs))
    assert json.loads(costs.read_text())["forward_ms"] == pytest.approx(report["forward_ms"])
    (fit,) = CostStore(store).read("fits", study="s1").to_dict("records")
    assert sorted(json.loads(fit["runs"])) == sorted(report["residuals"])
    assert main(["fit", HANDBOOK, "--store", store, "--study", "other", "-o", str(costs)]) == 2
    assert "other" in capsys.readouterr().err


def test_profile_layouts_refuses_runs_the_fit_would_refuse_as_too_short(capsys):
    """--train-iters 3 once proposed runs whose logs fit then refused: fail before any run."""
    assert main(["profile-layouts", HANDBOOK, "--pp", "4", "--train-iters", "3"]) == 2
    assert capsys.readouterr().err == (
        "error: --train-iters must be >= 5: the fit drops the first 2 timer blocks and needs 3 "
        "more, got 3\n"
    )


def test_fit_shows_predicted_against_measured_memory_per_stage(capsys, runs, tmp_path):
    out = str(tmp_path / "costs.json")
    report = run_json(capsys, "fit", HANDBOOK, *runs, "-o", out)
    rows = report["memory"]
    assert {(row["run"], row["pp_rank"]) for row in rows} == {
        (path.partition("=")[2], rank) for path in runs[1::2] for rank in range(4)
    }
    for row in rows:
        assert row["fitted_gib"] == pytest.approx(row["measured_gib"], rel=0.03)
    assert main(["fit", HANDBOOK, *runs, "-o", str(tmp_path / "again.json")]) == 0
    shown = capsys.readouterr().out
    assert "peak allocated per PP rank" in shown and "fitted error" in shown


def test_fit_of_recomputing_runs_shows_what_it_took_out_of_the_backward(
    capsys, monkeypatch, tmp_path
):
    """Runs of a config that recomputes every layer: the costs keep the plain backward, and the
    report says per unit what the runs' backward re-ran on top."""
    flags = "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1"
    config = tmp_path / "handbook_full_recompute.yaml"
    config.write_text(Path(HANDBOOK).read_text() + f"megatron_args: [{', '.join(flags.split())}]\n")
    recomputing = partial(build_cost_model, settings=memory_settings(flags.split()))
    monkeypatch.setattr(synthetic_runs, "build_cost_model", recomputing)
    words = logged_runs(tmp_path)
    report = run_json(capsys, "fit", str(config), *words, "-o", str(tmp_path / "costs.json"))
    truth = load_costs(COSTS)
    for unit in ("t", "m"):
        assert report["backward_ms"][unit] == pytest.approx(truth.backward_ms[unit], rel=0.02)
        assert report["recompute_ms"][unit] == pytest.approx(truth.forward_ms[unit], rel=0.02)
    assert set(report["recompute_ms"]) == {"t", "m"}  # the embedding and the loss are not
    assert main(["fit", str(config), *words, "-o", str(tmp_path / "again.json")]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "recomputed ms" in out and "backward ms is without recomputation" in out
