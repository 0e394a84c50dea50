"""Logs -> cost store -> observations -> costs, and the commands that drive it."""

from __future__ import annotations

import json

import pytest

from ray_layout.commands.main import main
from ray_layout.measure.fit import fit_costs
from ray_layout.measure.ingest import LoggedRun, ingest, observations_from_store
from ray_layout.measure.logs import parse_log_file
from ray_layout.measure.observations import observation_from_log
from ray_layout.measure.store import CostStore
from ray_layout.model.costs import load_costs
from ray_layout.model.layout import Layout
from ray_layout.model.spec import load_recipe_file
from tests.synthetic_runs import synthetic_log

HANDBOOK_PATH = "configs/handbook_7b_a1b.yaml"
HANDBOOK = load_recipe_file(HANDBOOK_PATH)
TRUTH = load_costs("configs/costs/handbook_h200_example.json")
LAYOUTS = ("Et*3|t*7|t*6m|L", "Et|t*15|m|L")


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("logs")
    paths = []
    for index, text in enumerate(LAYOUTS):
        path = folder / f"run{index}.log"
        layout = Layout.parse(text, 4)
        log = synthetic_log(HANDBOOK.model, HANDBOOK.parallel, layout, TRUTH, 16, iterations=8,
                            noise_cv=0.01, seed=index)  # fmt: skip
        path.write_text(log)
        paths.append(path)
    return paths


def logged(paths):
    pairs = zip(LAYOUTS, paths, strict=True)
    return [LoggedRun(Layout.parse(t, 4), p, HANDBOOK.parallel) for t, p in pairs]


def test_store_round_trip_fits_like_the_raw_logs(logs, tmp_path):
    store = CostStore(tmp_path / "store")
    first = ingest(store, HANDBOOK.model, logged(logs), "study1")
    again = ingest(store, HANDBOOK.model, logged(logs), "study1")
    assert [r.stored for r in first] == [True, True]
    assert [r.stored for r in again] == [False, False]  # idempotent: not counted twice
    assert len(store.read("runs", study="study1")) == 2
    runs = store.read("runs", study="study1")
    assert set(runs.num_microbatches) == {16}  # from the log's global batch size
    from_store = fit_costs(HANDBOOK.model, HANDBOOK.parallel,
                           observations_from_store(store, "study1", HANDBOOK.model,
                                                   HANDBOOK.parallel))  # fmt: skip
    raw = [observation_from_log(str(p), parse_log_file(p), Layout.parse(t, 4), HANDBOOK.parallel,
                                16) for t, p in zip(LAYOUTS, logs, strict=True)]  # fmt: skip
    from_logs = fit_costs(HANDBOOK.model, HANDBOOK.parallel, raw)
    assert from_store.costs.forward_ms == pytest.approx(from_logs.costs.forward_ms)
    assert from_store.costs.forward_ms["t"] == pytest.approx(10.0, rel=0.01)


def test_commands_ingest_then_fit_then_plan(logs, tmp_path, capsys):
    store, costs = str(tmp_path / "store"), str(tmp_path / "costs.json")
    runs = [arg for t, p in zip(LAYOUTS, logs, strict=True) for arg in ("--run", f"{t}={p}")]
    assert main(["ingest", HANDBOOK_PATH, *runs, "--store", store, "--study", "s"]) == 0
    assert "stored" in capsys.readouterr().out
    assert main(["ingest", HANDBOOK_PATH, *runs, "--store", store, "--study", "s"]) == 0
    assert "not counted twice" in capsys.readouterr().out
    assert main(["fit", HANDBOOK_PATH, "--store", store, "--study", "s", "-o", costs,
                 "--json"]) == 0  # fmt: skip
    report = json.loads(capsys.readouterr().out)
    assert report["units"] == ["E", "t", "m", "L"]
    assert report["forward_ms"]["L"] == pytest.approx(38.0, rel=0.02)
    assert len(CostStore(store).read("fits", study="s")) == 1
    assert main(["plan", HANDBOOK_PATH, "--pp", "4", "--costs", costs, "--top", "1",
                 "--json"]) == 0  # fmt: skip
    assert json.loads(capsys.readouterr().out)["candidates"][0]["layout"] == "Et*5|t*6|t*5|mL"


def test_fit_from_raw_logs_and_errors(logs, tmp_path, capsys):
    costs = str(tmp_path / "costs.json")
    runs = [arg for t, p in zip(LAYOUTS, logs, strict=True) for arg in ("--run", f"{t}={p}")]
    assert main(["fit", HANDBOOK_PATH, *runs, "-o", costs]) == 0
    assert "wrote" in capsys.readouterr().out
    assert main(["fit", HANDBOOK_PATH, "-o", costs]) == 2
    assert "either as --run" in capsys.readouterr().err
    assert main(["fit", HANDBOOK_PATH, "--run", "Et*4|t*4|t*4|t*4mL", "-o", costs]) == 2
    assert "expected LAYOUT=PATH" in capsys.readouterr().err
    assert main(["fit", HANDBOOK_PATH, "--run", f"Et*4|t*4|t*4|t*4mL={tmp_path}/none.log",
                 "-o", costs]) == 2  # fmt: skip
    assert "cannot read" in capsys.readouterr().err
    junk = tmp_path / "junk.log"
    junk.write_text("hello\nworld\n")
    assert main(["ingest", HANDBOOK_PATH, "--run", f"Et*4|t*4|t*4|t*4mL={junk}", "--store",
                 str(tmp_path / "s2")]) == 2  # fmt: skip
    assert "no Megatron timers" in capsys.readouterr().err
    assert main(["fit", HANDBOOK_PATH, "--store", str(tmp_path / "empty"), "-o", costs]) == 2
    assert "no finished runs" in capsys.readouterr().err


def test_profile_layouts_command(capsys):
    assert main(["profile-layouts", HANDBOOK_PATH, "--pp", "4", "--hbm-gb", "131",
                 "--json"]) == 0  # fmt: skip
    report = json.loads(capsys.readouterr().out)
    assert report["rank"] == 3 and report["units"] == ["E", "t", "m+L"]
    assert len(report["runs"]) == 2 and report["condition_number"] < 10
    assert 0 < report["worst_relative_error"] <= 1.0  # E alone on a rank of the second run
    assert main(["profile-layouts", HANDBOOK_PATH, "--pp", "4", "--standalone-mtp"]) == 0
    out = capsys.readouterr().out
    assert "identify E, t, m, L" in out and "--pipeline-model-parallel-layout" in out
