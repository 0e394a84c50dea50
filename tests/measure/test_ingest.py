"""Logs -> cost store -> observations -> costs, and the commands that drive it."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from ray_layout.commands.main import main
from ray_layout.errors import LayoutError, MeasurementError
from ray_layout.measure.declared import CheckedRun
from ray_layout.measure.fit import fit_costs
from ray_layout.measure.ingest import (
    LoggedRun,
    ingest,
    model_hash,
    observations_from_store,
    parse_run_argument,
    refuse_idle_stage,
)
from ray_layout.measure.logs import parse_log, parse_log_file
from ray_layout.measure.observations import observation_from_log
from ray_layout.measure.store import CostStore
from ray_layout.model.costs import load_costs
from ray_layout.model.layout import Layout
from ray_layout.model.spec import load_recipe_file
from tests.helpers.synthetic_runs import synthetic_log

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


def runs_of(logs, layouts=LAYOUTS) -> list[str]:
    return [arg for t, p in zip(layouts, logs, strict=True) for arg in ("--run", f"{t}={p}")]


def test_ingest_stores_every_run_or_none(logs, tmp_path, capsys):
    """A bad second --run (a NaN timer) is found before anything is written: the first, good
    run is not stored either, and the error names the file, the line and the value."""
    text = logs[1].read_text()
    nan = tmp_path / "nan.log"
    nan.write_text(re.sub(r"rank  3: [\d.]+", "rank  3: nan", text, count=1))
    store = str(tmp_path / "store")
    runs = runs_of([logs[0], nan])
    assert main(["ingest", HANDBOOK_PATH, *runs, "--store", store]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and f"{nan}: line " in error and "is nan ms" in error
    assert CostStore(store).read("runs").empty and CostStore(store).read("timers").empty


def test_a_combined_1f1b_log_is_refused_before_anything_is_stored(logs, tmp_path, capsys):
    """Its forward-compute timer holds merged forward+backward steps: no unit cost splits it."""
    merged = tmp_path / "merged.log"
    block = (
        "------------------------ arguments ------------------------\n"
        "  overlap_moe_expert_parallel_comm ................ True\n"
        "-------------------- end of arguments ---------------------\n"
    )
    merged.write_text(block + logs[1].read_text())
    store, costs = str(tmp_path / "store"), str(tmp_path / "costs.json")
    for command in (["ingest", "--store", store], ["fit", "-o", costs]):
        assert main([command[0], HANDBOOK_PATH, *runs_of([logs[0], merged]), *command[1:]]) == 2
        error = capsys.readouterr().err
        assert error.count("\n") == 1 and f"{merged}: the run used --overlap-moe-expert" in error
    assert CostStore(store).read("runs").empty and not Path(costs).exists()


def test_one_log_given_twice_is_refused(logs, tmp_path, capsys):
    store, costs = str(tmp_path / "store"), str(tmp_path / "costs.json")
    twice = runs_of([logs[0], logs[0]])
    for command in (["ingest", "--store", store], ["fit", "-o", costs]):
        assert main([command[0], HANDBOOK_PATH, *twice, *command[1:]]) == 2
        assert f"the same log as --run {LAYOUTS[0]}={logs[0]}" in capsys.readouterr().err
    assert CostStore(store).read("runs").empty


def test_fit_refuses_runs_of_another_shape_stored_under_the_same_name(logs, tmp_path, capsys):
    store = str(tmp_path / "store")
    assert main(["ingest", HANDBOOK_PATH, *runs_of(logs), "--store", store]) == 0
    wider = tmp_path / "handbook_wider.yaml"  # the same name, hidden 4096 instead of 2048
    text = Path(HANDBOOK_PATH).read_text()
    wider.write_text(text.replace("hidden_size: 2048", "hidden_size: 4096"))
    capsys.readouterr()
    costs = str(tmp_path / "costs.json")
    assert main(["fit", str(wider), "--store", store, "-o", costs]) == 2
    error = capsys.readouterr().err
    mine = model_hash(load_recipe_file(str(wider)).model)
    theirs = model_hash(HANDBOOK.model)
    assert f"model hash {theirs}; this config's is {mine}" in error and "2 of the 2" in error
    assert not (tmp_path / "costs.json").exists()


def test_a_stored_impossible_value_names_the_run_to_remove(logs, tmp_path, capsys):
    """A store written before NaN timers were refused: the fit names the run and the command
    that removes it, instead of failing inside its algebra; once removed, the fit runs."""
    root = tmp_path / "store"
    results = ingest(CostStore(root), HANDBOOK.model, logged(logs), "s")
    bad = results[1].run_id
    row = {"run_id": bad, "interval": 5, "rank": 0, "timer": "forward-compute", "stat": "rank"}
    CostStore(root).write("timers", [{**row, "ms": float("nan")}], "s")
    costs = str(tmp_path / "costs.json")
    fit = ["fit", HANDBOOK_PATH, "--store", str(root), "--study", "s", "-o", costs]
    assert main(fit) == 2
    error = capsys.readouterr().err
    assert f"run {bad} of study 's': timer forward-compute of rank 0 is nan ms" in error
    assert f"store rm {bad} --store {root} --study s" in error
    assert main(["store", "rm", bad, "--store", str(root), "--study", "s"]) == 0
    assert main(fit) == 0  # the run left fits (with a warning that nothing checks it)
    assert "wrote" in capsys.readouterr().out


def test_a_run_argument_whose_layout_is_wrong_names_the_run():
    with pytest.raises(LayoutError, match=r"^--run Et\*5\|t\*6=x.log: layout has 2 stages, not "):
        parse_run_argument("Et*5|t*6=x.log", 4)


def zeroed(text: str, block: int, rank: int) -> tuple[str, int]:
    """``text`` with ``rank``'s forward-compute of the ``block``-th timer block printed as 0.00,
    and the line it is on."""
    lines = text.split("\n")
    header = [i for i, line in enumerate(lines) if line == "  forward-compute:"][block]
    at = next(i for i in range(header, len(lines)) if lines[i].startswith(f"     rank {rank:2d}:"))
    lines[at] = f"     rank {rank:2d}: 0.00"
    return "\n".join(lines), at + 1


@pytest.mark.parametrize("command", ["ingest", "fit"])
def test_a_rank_that_holds_layers_computing_in_no_time_is_refused(logs, tmp_path, capsys, command):
    """A stage that holds layers cannot compute in 0 ms: the log is refused at the line with
    the value, before anything is stored or fitted."""
    idle = tmp_path / "idle.log"
    text, line = zeroed(logs[1].read_text(), 4, 5)
    idle.write_text(text)
    store, costs = str(tmp_path / "store"), str(tmp_path / "costs.json")
    flags = ["--store", store] if command == "ingest" else ["-o", costs]
    assert main([command, HANDBOOK_PATH, *runs_of([logs[0], idle]), *flags]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1
    assert f"{idle}: line {line}: rank 5 times forward-compute at 0.0 ms, but its " in error
    assert "pipeline stage 2 holds layers (m) of layout Et|t*15|m|L" in error
    assert CostStore(store).read("runs").empty and not Path(costs).exists()


def test_a_stage_without_layers_may_time_no_compute():
    """An empty stage (``Et*8||t*8|mL``) has nothing to compute: its zeros are no refusal; the
    same zeros on a stage with layers are."""
    block = ["times across ranks (ms):", "  forward-compute:"]
    block += [f"     rank  {rank}: {0.0 if rank == 1 else 5.0:.2f}" for rank in range(4)]
    lines = [f" iteration {i}/ 9 | elapsed time per iteration (ms): 9.0 |" for i in (1, 2)]
    parsed = parse_log("\n".join([lines[0], *block, lines[1], *block]) + "\n")
    parallel = replace(HANDBOOK.parallel, pp=4, tp=1, cp=1, dp=1, ep=1, etp=1)
    empty = Layout.parse("Et*8||t*8|mL", 4)
    refuse_idle_stage(CheckedRun(parsed, empty, parallel, 1), "log")
    with pytest.raises(MeasurementError, match=r"^log: line 5: rank 1 times forward-compute"):
        refuse_idle_stage(CheckedRun(parsed, Layout.parse("Et*8|t|t*7|mL", 4), parallel, 1), "log")
