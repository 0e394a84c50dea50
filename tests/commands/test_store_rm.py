"""``store rm RUN_ID``: a stored run taken out of the cost store, or what would be, and one-line
refusals for what is not there."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from unittest import mock

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ray_layout.commands.main import main
from ray_layout.measure.store import CostStore
from ray_layout.model.costs import load_costs
from ray_layout.model.layout import Layout
from ray_layout.model.spec import load_recipe_file
from tests.helpers.malformed_inputs import COSTS as COSTS_PATH
from tests.helpers.synthetic_runs import synthetic_log

RUN = {"run_id": "r1", "content_hash": "h1", "status": "finished", "layout": "Et*2|tL", "pp": 2}
TIMERS = {"timers": [{"iteration": 1, "rank": 0, "timer": "forward-compute", "ms": 1.0}]}


def test_store_rm_removes_a_run_after_a_dry_run_says_what_goes(tmp_path, capsys):
    store = CostStore(tmp_path)
    store.write_run(RUN, TIMERS, "s")
    rm = ["store", "rm", "r1", "--store", str(tmp_path), "--study", "s"]
    assert main([*rm, "--dry-run"]) == 0
    assert capsys.readouterr().out.strip() == "r1: would remove rows of runs 1, timers 1"
    assert len(store.read("runs")) == 1
    assert main([*rm, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["rows"]["runs"] == 1 and not report["dry_run"]
    assert store.read("runs").empty and store.read("timers").empty


def test_store_rm_refuses_in_one_line_what_is_not_there(tmp_path, capsys):
    CostStore(tmp_path).write_run(RUN, TIMERS, "s")
    cases = [
        (["store", "rm", "r2", "--store", str(tmp_path), "--study", "s"], "holds no run 'r2'"),
        (["store", "rm", "r1", "--store", str(tmp_path / "none")], "none: no such folder"),
        (["store", "ls", "r1", "--store", str(tmp_path)], "must be one of rm, not 'ls'"),
    ]
    for argv, message in cases:
        assert main(argv) == 2
        error = capsys.readouterr().err
        assert error.count("\n") == 1 and message in error
    assert len(CostStore(tmp_path).read("runs")) == 1


HANDBOOK_PATH = "configs/handbook_7b_a1b.yaml"
LAYOUTS = ("Et*3|t*7|t*6m|L", "Et|t*15|m|L", "Et*5|t*6|t*5|mL")


def _ingested(folder: Path, capsys: pytest.CaptureFixture[str]) -> tuple[Path, list[str]]:
    """Three runs of the handbook recipe ingested into a store: its root and the run ids."""
    recipe, costs = load_recipe_file(HANDBOOK_PATH), load_costs(COSTS_PATH)
    argv = ["ingest", HANDBOOK_PATH, "--store", str(folder / "store"), "--json"]
    for index, text in enumerate(LAYOUTS):
        log = folder / f"run{index}.log"
        log.write_text(synthetic_log(recipe.model, recipe.parallel, Layout.parse(text, 4), costs,
                                     16, iterations=8, noise_cv=0.01, seed=index))  # fmt: skip
        argv += ["--run", f"{text}={log}"]
    assert main(argv) == 0
    return folder / "store", [run["run_id"] for run in json.loads(capsys.readouterr().out)]


def test_a_store_rm_cut_before_it_deletes_leaves_rows_twice_that_fit_reads_once(tmp_path, capsys):
    store, ids = _ingested(tmp_path, capsys)
    real_unlink = Path.unlink

    def cut(path: Path, missing_ok: bool = False) -> None:
        if path.name.startswith("part-"):
            raise KeyboardInterrupt  # the rewritten file is in, the old one not yet gone
        real_unlink(path, missing_ok=missing_ok)

    with mock.patch.object(Path, "unlink", cut), pytest.raises(KeyboardInterrupt):
        CostStore(store).remove_run("default", ids[2])
    costs = str(tmp_path / "costs.json")
    assert main(["fit", HANDBOOK_PATH, "--store", str(store), "-o", costs]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "fitted from 3 runs" in out
    assert f"note: {store}: 2 rows stored twice were read once (runs 2)" in out
    again = str(tmp_path / "again.json")
    assert main(["fit", HANDBOOK_PATH, "--store", str(store), "-o", again, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["notes"] == [
        f"{store}: 2 rows stored twice were read once (runs 2), as an interrupted `store rm` "
        "leaves them"
    ]
    assert main(["store", "rm", ids[2], "--store", str(store)]) == 0  # finished by a re-run
    assert sorted(CostStore(store).read("runs").run_id) == sorted(ids[:2])


def _set_column(part: Path, column: str, run_id: str, value: Any, where: str = "run_id") -> None:
    """Rewrite one stored value in place, as a store written by an older version holds it."""
    data = pq.read_table(part)
    values = data[column].to_pylist()
    for index, key in enumerate(data[where].to_pylist()):
        if key == run_id:
            values[index] = value
    field = data.schema.field(column)
    pq.write_table(data.set_column(data.schema.get_field_index(column), field,
                                   pa.array(values, field.type)), part)  # fmt: skip


@pytest.mark.parametrize(
    ("table", "column", "value", "named"),
    [
        ("runs", "layout", None, "its runs row declares no layout (null)"),
        ("runs", "pp", None, "its runs row declares no pp (null)"),
        ("iterations", "elapsed_ms", 0.0, "step is 0.0 ms"),
    ],
)
def test_a_stored_run_fit_cannot_use_is_named_with_the_store_rm_that_fixes_it(
    tmp_path, capsys, table, column, value, named
):
    """A null declaration (an AttributeError once) or a 0 ms step (once fitted, moving the step
    tail without a word): one line naming the file, the run and the command; that command
    fixes it."""
    store, ids = _ingested(tmp_path, capsys)
    parts = store.glob(f"table={table}/study=default/part-*.parquet")
    part = next(p for p in parts if ids[2] in pq.read_table(p)["run_id"].to_pylist())
    _set_column(part, column, ids[2], value)
    costs = str(tmp_path / "costs.json")
    fit = ["fit", HANDBOOK_PATH, "--store", str(store), "-o", costs]
    assert main(fit) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "Traceback" not in error
    assert error.startswith(f"error: {part}: run {ids[2]} of study 'default': ") and named in error
    command = error.split("remove the run with python -m ray_layout ")[1].split(" (and")[0]
    assert command == f"store rm {ids[2]} --store {store} --study default"
    assert main(command.split()) == 0
    assert main(fit) == 0
    assert "fitted from 2 runs" in capsys.readouterr().out
