"""``store rm RUN_ID``: a stored run taken out of the cost store, or what would be, and one-line
refusals for what is not there."""

from __future__ import annotations

import json

from ray_layout.commands.main import main
from ray_layout.measure.store import CostStore

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
