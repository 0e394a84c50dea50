"""The cost store: round trips, added columns, one-line errors, idempotent and concurrent ingest,
and what a writer killed half way leaves behind."""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import signal
import time
import uuid
from pathlib import Path
from typing import Any
from unittest import mock

import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ray_layout.ab.vocabulary import StopReason
from ray_layout.errors import ConfigError, MeasurementError
from ray_layout.measure.store import CostStore
from ray_layout.measure.store_claims import acquire, claim_path
from ray_layout.measure.store_schema import (
    RUN_DATA_TABLES,
    SCHEMA_VERSION,
    TABLE_SCHEMAS,
    declaration,
)
from ray_layout.runtime.failures import FailureClass

SPAWN = multiprocessing.get_context("spawn")
DECLARED = {"model": "m", "tp": 1, "vpp": 1, "cp": 1, "ep": 1, "etp": 1, "dp": 1,
            "micro_batch_size": 1, "num_microbatches": 4}  # fmt: skip
RUN = {"run_id": "r1", "content_hash": "h1", "status": "finished", "layout": "Et*2|tL", "pp": 2,
       **DECLARED}  # fmt: skip
RUN_TABLES = {
    "timers": [
        {
            "interval": 2,
            "iteration": 10,
            "rank": 0,
            "pp_rank": 0,
            "timer": "forward-backward",
            "ms": 812.5,
        },
        {
            "interval": 2,
            "iteration": 10,
            "rank": 1,
            "pp_rank": 1,
            "timer": "forward-backward",
            "ms": 809.0,
        },
    ],
    "iterations": [{"iteration": 10, "elapsed_ms": 820.0}, {"iteration": 20, "elapsed_ms": 818.0}],
    "memory": [
        {
            "rank": 0,
            "pp_rank": 0,
            "iteration": 10,
            "allocated_mb": 1000.0,
            "max_allocated_mb": 1500.0,
        }
    ],
}


def sample_row(table: str, i: int) -> dict[str, Any]:
    """Every column the caller supplies, filled with a value of its type."""
    row: dict[str, Any] = {}
    for field in TABLE_SCHEMAS[table]:
        if field.name in ("study", "schema_version"):
            continue
        if pa.types.is_string(field.type):
            row[field.name] = f"{field.name}-{i}"
        else:
            row[field.name] = i if pa.types.is_integer(field.type) else i + 0.5
    return row


def read_columns(table: str) -> list[str]:
    names = TABLE_SCHEMAS[table].names
    return names if "study" in names else [*names, "study"]


@pytest.mark.parametrize("table", list(TABLE_SCHEMAS))
def test_every_table_round_trips(tmp_path: Path, table: str):
    store = CostStore(tmp_path)
    rows = [sample_row(table, i) for i in range(3)]
    path = store.write(table, rows, "s1")
    assert path.parent == tmp_path / f"table={table}" / "study=s1"
    assert path.name.startswith("part-") and path.suffix == ".parquet"
    got = store.read(table)
    assert list(got.columns) == read_columns(table)
    expected = [{**row, "study": "s1", "schema_version": SCHEMA_VERSION} for row in rows]
    assert got[list(expected[0])].to_dict("records") == expected
    assert len(pd.read_parquet(path)) == 3  # plain Parquet: any reader takes one file


def test_a_column_added_later_is_kept_with_nulls_for_older_rows(tmp_path, monkeypatch):
    store = CostStore(tmp_path)
    older = store.write("iterations", [sample_row("iterations", 1)], "s")
    older.rename(older.with_name("part-0.parquet"))  # first in name order: the file readers
    # that take one file's schema would follow, dropping the column only the newer file has
    newer = TABLE_SCHEMAS["iterations"].append(pa.field("moe_aux_loss", pa.float64()))
    monkeypatch.setitem(TABLE_SCHEMAS, "iterations", newer)
    store.write("iterations", [{**sample_row("iterations", 2), "moe_aux_loss": 0.25}], "s")
    monkeypatch.undo()  # read back with the older schema, as an older reader would
    got = store.read("iterations").sort_values("iteration")
    assert got["iteration"].tolist() == [1, 2]
    assert got["moe_aux_loss"].isna().tolist() == [True, False]
    assert got["moe_aux_loss"].iloc[1] == 0.25
    assert store.read("iterations", moe_aux_loss=0.25)["iteration"].tolist() == [2]


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda s: s.write("nope", [{"run_id": "r"}], "s"), "unknown table 'nope'"),
        (lambda s: s.read("nope"), "unknown table 'nope'"),
        (lambda s: s.write("runs", [{"run_id": "r", "bogus": 1}], "s"), "no column.*bogus"),
        (lambda s: s.read("runs", bogus=1), "no column 'bogus'"),
        (lambda s: s.read("runs", pp="four"), "filter pp='four'"),
        (lambda s: s.write("runs", [{"run_id": None}], "s"), "'run_id' must not be null"),
        (lambda s: s.write("runs", [{"pp": 4}], "s"), "'run_id' must not be null"),
        (lambda s: s.write("runs", [{"run_id": "r", "pp": "four"}], "s"), "column 'pp'"),
        (lambda s: s.write("runs", [{"run_id": "r", "pp": 2.5}], "s"), "column 'pp'"),
        (lambda s: s.write("runs", [], "s"), "no rows"),
        (lambda s: s.write("runs", [{"run_id": "r", "study": "t"}], "s"), "another study"),
        (lambda s: s.write_run(RUN, {"runs": [{"run_id": "r"}]}, "s"), "write_run takes"),
        (lambda s: s.write_run(RUN, {"timers": [{"run_id": "x"}]}, "s"), "another run_id"),
        (lambda s: s.read_run_data("runs"), "read_run_data reads"),
    ],
)
def test_a_callers_mistake_is_a_one_line_value_error(tmp_path, call, match):
    with pytest.raises(ValueError, match=match) as excinfo:
        call(CostStore(tmp_path))
    assert not isinstance(excinfo.value, ConfigError)
    assert "\n" not in str(excinfo.value)


@pytest.mark.parametrize(
    "call",
    [
        lambda s: s.write("runs", [{"run_id": "r"}], "../up"),
        lambda s: s.read("runs", ".hidden"),
    ],
)
def test_a_bad_study_id_is_a_one_line_config_error(tmp_path, call):
    with pytest.raises(ConfigError, match="study id") as excinfo:
        call(CostStore(tmp_path))
    assert "\n" not in str(excinfo.value)


@pytest.mark.parametrize("table", list(TABLE_SCHEMAS))
def test_empty_reads_have_the_schema_columns(tmp_path, table):
    store = CostStore(tmp_path)
    empty = store.read(table)
    assert empty.empty and list(empty.columns) == read_columns(table)
    assert empty["schema_version"].dtype == "int64"
    store.write(table, [sample_row(table, 1)], "s")
    nothing = store.read(table, "s", schema_version=SCHEMA_VERSION + 1)
    assert nothing.empty and list(nothing.columns) == read_columns(table)
    assert store.read(table, "other").empty


def test_filters_select_by_study_and_column_equality(tmp_path):
    store = CostStore(tmp_path)
    frame = pd.DataFrame({"run_id": ["r1", "r2"], "pp": [4, 2], "layout": ["Et|tL", None]})
    store.write("runs", frame, "s1")
    store.write("runs", [{"run_id": "r3", "pp": 4, "layout": "Et|tL"}], "s2")
    assert sorted(store.read("runs", pp=4)["run_id"]) == ["r1", "r3"]
    assert store.read("runs", "s1", pp=4)["run_id"].tolist() == ["r1"]
    assert store.read("runs", layout=None)["run_id"].tolist() == ["r2"]
    assert store.read("runs", "s2")["study"].tolist() == ["s2"]
    assert store.has("runs", "s2", run_id="r3") and not store.has("runs", "s1", run_id="r3")
    assert store.has("runs", None, run_id="r3")
    assert store.studies() == ["s1", "s2"]


def test_write_run_stores_a_run_once(tmp_path):
    store = CostStore(tmp_path)
    assert store.write_run(RUN, RUN_TABLES, "s") is True
    assert store.write_run(RUN, RUN_TABLES, "s") is False
    assert store.write_run({**RUN, "run_id": "r1-again"}, RUN_TABLES, "s") is False
    assert store.write_run({**RUN, "content_hash": "h2"}, RUN_TABLES, "s") is False
    assert store.read("runs")["run_id"].tolist() == ["r1"]
    for table in RUN_DATA_TABLES:
        assert len(store.read_run_data(table)) == len(RUN_TABLES[table])
        assert set(store.read_run_data(table)["run_id"]) == {"r1"}
    assert store.write_run(RUN, RUN_TABLES, "other") is True  # studies are separate
    assert len(store.read_run_data("timers", "s")) == len(RUN_TABLES["timers"])


def test_failure_classes_and_stop_reasons_come_back_by_their_codes(tmp_path):
    """Enum members are stored as their plain strings; a stop reason's code heads the error, so
    a row an older version wrote (its words, no enum) reads back the same."""
    store = CostStore(tmp_path)
    old_settled = ("settled: every other arm is stopped or failed, so more steps cannot change "
                   "the verdict")  # fmt: skip
    store.write("runs", [
        {"run_id": "new", "status": "stopped", "failure_class": FailureClass.EARLY_STOP,
         "error": StopReason.COVERED.text},
        {"run_id": "old", "status": "stopped", "failure_class": "early-stop", "error": old_settled},
        {"run_id": "lost", "status": "stopped", "failure_class": "early-stop",
         "error": "20.0% slower than the best"},
        {"run_id": "oom", "status": "infeasible", "failure_class": FailureClass.OOM},
    ], "s")  # fmt: skip
    rows = store.read("runs", "s").set_index("run_id")
    assert set(rows.failure_class) == {FailureClass.EARLY_STOP, FailureClass.OOM}
    assert FailureClass(rows.failure_class["oom"]) is FailureClass.OOM
    assert rows.error["new"] == StopReason.COVERED.text
    stops = {run: StopReason.of(rows.error[run]) for run in ("new", "old", "lost")}
    assert stops == {"new": StopReason.COVERED, "old": StopReason.SETTLED, "lost": None}


def test_a_failed_ingest_leaves_nothing_and_can_be_retried_at_once(tmp_path):
    store, real_replace = CostStore(tmp_path), os.replace

    def full_disk_for_runs(src, dst):
        if "table=runs" in str(dst):
            raise OSError("no space left on device")
        real_replace(src, dst)

    with (
        mock.patch.object(os, "replace", full_disk_for_runs),
        pytest.raises(ConfigError, match="cannot write the store"),
    ):
        store.write_run(RUN, RUN_TABLES, "s")
    assert store.read("runs").empty and store.read("timers").empty
    assert store.write_run(RUN, RUN_TABLES, "s") is True
    assert len(store.read("timers")) == len(RUN_TABLES["timers"])


def _write_files(root: str, writer: int, count: int) -> None:
    store = CostStore(root)
    for i in range(count):
        store.write("timers", [{"run_id": f"w{writer}", "timer": "t", "iteration": i}], "s")


def _ingest(root: str, barrier: Any, results: Any) -> None:
    store = CostStore(root)
    barrier.wait()
    results.put(store.write_run(RUN, RUN_TABLES, "s"))


def _sigkill(*_args: Any) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _die_before_replace(root: str) -> None:
    with mock.patch.object(os, "replace", _sigkill):
        CostStore(root).write("runs", [{"run_id": "r1"}], "s")


def _die_before_runs_row(root: str) -> None:
    real_replace = os.replace

    def replace(src: Any, dst: Any) -> None:
        if "table=runs" in str(dst):
            _sigkill()
        real_replace(src, dst)

    with mock.patch.object(os, "replace", replace):
        CostStore(root).write_run(RUN, RUN_TABLES, "s")


def run_processes(*processes: Any) -> list[int | None]:
    for process in processes:
        process.start()
    for process in processes:
        process.join(60)
    return [process.exitcode for process in processes]


def test_concurrent_writers_each_add_their_own_files(tmp_path):
    args = [(str(tmp_path), writer, 20) for writer in range(4)]
    assert run_processes(*(SPAWN.Process(target=_write_files, args=a) for a in args)) == [0] * 4
    folder = tmp_path / "table=timers" / "study=s"
    assert len(list(folder.glob("part-*.parquet"))) == 80
    assert list(folder.glob(".*")) == []
    got = CostStore(tmp_path).read("timers")
    assert len(got) == 80
    assert len(set(zip(got["run_id"], got["iteration"], strict=True))) == 80


def test_processes_racing_to_ingest_one_run_store_it_once(tmp_path):
    barrier, results = SPAWN.Barrier(4), SPAWN.Queue()
    racers = [SPAWN.Process(target=_ingest, args=(str(tmp_path), barrier, results)) for _ in "abcd"]
    assert run_processes(*racers) == [0] * 4
    assert sorted(results.get(timeout=5) for _ in racers) == [False, False, False, True]
    store = CostStore(tmp_path)
    assert store.read("runs")["run_id"].tolist() == ["r1"]
    for table in RUN_DATA_TABLES:
        assert len(store.read(table)) == len(RUN_TABLES[table])


def test_a_writer_killed_before_its_rename_leaves_only_an_ignored_temp_file(tmp_path):
    killed = SPAWN.Process(target=_die_before_replace, args=(str(tmp_path),))
    assert run_processes(killed) == [-signal.SIGKILL]
    assert list((tmp_path / "table=runs" / "study=s").glob(".tmp-*.parquet"))
    store = CostStore(tmp_path)
    assert store.read("runs").empty and not store.has("runs", "s")
    assert store.studies() == []


def test_a_run_whose_writer_died_is_invisible_and_taken_over_at_once(tmp_path):
    killed = SPAWN.Process(target=_die_before_runs_row, args=(str(tmp_path),))
    assert run_processes(killed) == [-signal.SIGKILL]
    store = CostStore(tmp_path)  # the default 10-minute timeout: the dead pid is what counts
    assert store.read("runs").empty
    for table in RUN_DATA_TABLES:
        assert store.read_run_data(table).empty
        assert len(store.read(table)) == len(RUN_TABLES[table])  # orphans, on disk only
    assert store.write_run(RUN, RUN_TABLES, "s") is True
    assert store.write_run(RUN, RUN_TABLES, "s") is False
    assert store.read("runs")["run_id"].tolist() == ["r1"]
    for table in RUN_DATA_TABLES:
        assert len(store.read_run_data(table)) == len(RUN_TABLES[table])
        assert len(store.read(table)) == len(RUN_TABLES[table])  # the orphans are gone


def _claim_of(root: Path) -> Path:
    (claim,) = (path for path in (root / "_claims" / "s").iterdir() if "." not in path.name)
    return claim


def _rewrite_claim(claim: Path, **changes: Any) -> None:
    mtime = claim.stat().st_mtime
    claim.write_text(json.dumps({**json.loads(claim.read_text()), **changes}))
    os.utime(claim, (mtime, mtime))


def test_a_claim_of_a_live_or_remote_writer_holds_until_it_goes_stale(tmp_path):
    killed = SPAWN.Process(target=_die_before_runs_row, args=(str(tmp_path),))
    assert run_processes(killed) == [-signal.SIGKILL]
    claim = _claim_of(tmp_path)
    _rewrite_claim(claim, pid=os.getpid(), started=None)  # a live process holds it
    assert CostStore(tmp_path).write_run(RUN, RUN_TABLES, "s") is False
    _rewrite_claim(claim, pid=os.getpid(), started="1")  # the pid, reused by a newer process
    assert CostStore(tmp_path).write_run(RUN, RUN_TABLES, "s") is True

    other = tmp_path / "other"
    killed = SPAWN.Process(target=_die_before_runs_row, args=(str(other),))
    assert run_processes(killed) == [-signal.SIGKILL]
    _rewrite_claim(_claim_of(other), host="another-host")  # its pid says nothing here
    assert CostStore(other).write_run(RUN, RUN_TABLES, "s") is False
    patient = CostStore(other, stale_claim_s=0.2)
    time.sleep(0.3)
    assert patient.write_run(RUN, RUN_TABLES, "s") is True
    assert patient.read("runs")["run_id"].tolist() == ["r1"]


@pytest.mark.parametrize("table", list(TABLE_SCHEMAS))
def test_every_table_is_a_hive_dataset_pandas_and_pyarrow_read(tmp_path, table):
    store = CostStore(tmp_path)
    for study in ("s1", "s2"):
        store.write(table, [sample_row(table, i) for i in range(2)], study)
    folder = tmp_path / f"table={table}"
    by_pandas = pd.read_parquet(folder)
    by_arrow = ds.dataset(folder, format="parquet", partitioning="hive").to_table().to_pandas()
    ours = store.read(table)
    for frame in (by_pandas, by_arrow):
        assert sorted(frame.columns) == sorted(ours.columns)
        assert sorted(frame["study"].astype(str)) == ["s1", "s1", "s2", "s2"]
        assert set(frame["schema_version"]) == {SCHEMA_VERSION}
    assert "study" not in pq.read_schema(next(folder.glob("study=s1/part-*.parquet"))).names


@pytest.mark.parametrize("table", ["runs", "timers"])
def test_duckdb_reads_a_table_as_the_docs_say(tmp_path, table):
    duckdb = pytest.importorskip("duckdb")
    store = CostStore(tmp_path)
    for study in ("s1", "s2"):
        store.write(table, [sample_row(table, i) for i in range(2)], study)
    files = f"{tmp_path}/table={table}/study=*/part-*.parquet"
    query = f"select * from read_parquet('{files}', hive_partitioning=true, union_by_name=true)"
    got = duckdb.connect().sql(query).df()
    assert set(got.pop("table")) == {table}  # DuckDB takes every key=value folder of the path
    assert sorted(got.columns) == sorted(store.read(table).columns)
    assert sorted(got["study"]) == ["s1", "s1", "s2", "s2"]


def test_version_1_files_with_study_inside_are_still_read(tmp_path):
    store = CostStore(tmp_path)
    store.write("runs", [{"run_id": "new", "pp": 2}], "s")
    old = pa.table({"run_id": ["old"], "study": ["s"], "pp": [4], "schema_version": [1]})
    pq.write_table(old, tmp_path / "table=runs" / "study=s" / "part-old.parquet")
    got = store.read("runs").sort_values("run_id")
    assert got[["run_id", "study", "pp", "schema_version"]].to_dict("records") == [
        {"run_id": "new", "study": "s", "pp": 2, "schema_version": SCHEMA_VERSION},
        {"run_id": "old", "study": "s", "pp": 4, "schema_version": 1},
    ]


def test_runs_written_together_become_visible_together_or_not_at_all(tmp_path):
    store, real_replace = CostStore(tmp_path), os.replace
    second = {**RUN, "run_id": "r2", "content_hash": "h2"}
    written = []

    def full_disk_at_the_runs_file(src, dst):
        if "table=runs" in str(dst):
            raise OSError("no space left on device")
        written.append(dst)
        real_replace(src, dst)

    full = pytest.raises(ConfigError, match=r"cannot write the store \(no space left on device\)$")
    with mock.patch.object(os, "replace", full_disk_at_the_runs_file), full:
        store.write_runs([(RUN, RUN_TABLES), (second, RUN_TABLES)], "s")
    assert len(written) == 6  # both runs' data files were written, then taken back
    assert store.read("runs").empty and store.read("timers").empty
    assert store.write_runs([(RUN, RUN_TABLES), (second, RUN_TABLES)], "s") == [True, True]
    assert len(list((tmp_path / "table=runs" / "study=s").glob("part-*"))) == 1  # one file
    third = {**RUN, "run_id": "r3", "content_hash": "h3"}
    assert store.write_runs([(RUN, RUN_TABLES), (third, RUN_TABLES)], "s") == [False, True]


def test_remove_run_takes_a_run_out_of_every_table(tmp_path):
    store = CostStore(tmp_path)
    second = {**RUN, "run_id": "r2", "content_hash": "h2"}
    assert store.write_runs([(RUN, RUN_TABLES), (second, RUN_TABLES)], "s") == [True, True]
    decisions = [{"decision_id": "d1", "run_id": "r1"}, {"decision_id": "d2", "run_id": "r2"}]
    store.write("decisions", decisions, "s")
    fits = [{"fit_id": "f1", "runs": json.dumps(["r1", "r2"])}, {"fit_id": "f2", "runs": "[]"}]
    store.write("fits", fits, "s")
    counts = {"runs": 1, "timers": 2, "iterations": 2, "memory": 1, "decisions": 1, "fits": 1}
    assert store.remove_run("s", "r1", dry_run=True) == counts
    assert len(store.read("runs", "s")) == 2  # a dry run removes nothing
    assert store.remove_run("s", "r1") == counts
    assert store.read("runs", "s").run_id.tolist() == ["r2"]  # its file rewritten without r1
    for table in RUN_DATA_TABLES:
        assert set(store.read(table, "s").run_id) == {"r2"}
    assert store.read("decisions", "s").decision_id.tolist() == ["d2"]
    assert store.read("fits", "s").fit_id.tolist() == ["f2"]  # a fit made from r1 goes too
    claims = tmp_path / "_claims" / "s"
    assert not (claims / hashlib.sha256(b"h1").hexdigest()).exists()  # r1's claim is gone
    assert (claims / hashlib.sha256(b"h2").hexdigest()).exists()
    assert store.write_run(RUN, RUN_TABLES, "s") is True  # ingested again at once
    with pytest.raises(ConfigError, match=r"study 's' holds no run 'r9' \(it holds r1, r2\)"):
        store.remove_run("s", "r9")


def test_remove_run_changes_nothing_when_a_file_of_the_study_is_unreadable(tmp_path):
    store = CostStore(tmp_path)
    store.write_run(RUN, RUN_TABLES, "s")
    corrupt = tmp_path / "table=decisions" / "study=s" / "part-x.parquet"
    corrupt.parent.mkdir(parents=True)
    corrupt.write_bytes(b"garbage")
    with pytest.raises(MeasurementError, match=r"part-x\.parquet: the store cannot read it"):
        store.remove_run("s", "r1")
    assert store.read("runs", "s").run_id.tolist() == ["r1"]  # nothing was removed
    assert len(store.read("timers", "s")) == len(RUN_TABLES["timers"])


@pytest.mark.parametrize("damage", ["truncated", "not_parquet", "mistyped"])
def test_a_damaged_file_in_the_store_is_one_error_naming_it(tmp_path: Path, damage: str):
    """A file cut short, something else under a Parquet name, or a column of another type: the
    reader names the damage and changes nothing."""
    store = CostStore(tmp_path)
    written = store.write("iterations", [{"run_id": "r1", "iteration": 1, "elapsed_ms": 2.0}], "s")
    if damage == "truncated":
        written.write_bytes(written.read_bytes()[:100])
    elif damage == "not_parquet":
        written.write_text('{"a": 1}')
    else:
        mistyped = pa.table({"run_id": ["r2"], "iteration": ["ten"], "elapsed_ms": ["x"]})
        pq.write_table(mistyped, written.with_name("part-mistyped.parquet"))
    before = sorted(p.name for p in written.parent.iterdir())
    with pytest.raises(MeasurementError, match=r"the store cannot read it .*move the damaged"):
        store.read("iterations", study="s")
    assert sorted(p.name for p in written.parent.iterdir()) == before


# --- a run is its log and its declaration ------------------------------------------------------


def _ingest_declared(root: str, barrier: Any, results: Any, layout: str) -> None:
    store = CostStore(root)
    barrier.wait()
    try:
        results.put((layout, store.write_run({**RUN, "layout": layout}, RUN_TABLES, "s")))
    except ConfigError as exc:
        results.put((layout, str(exc)))


def test_processes_racing_to_ingest_one_log_declared_two_ways_refuse_the_contradiction(tmp_path):
    """Three ingests of one log at once, two declaring one layout and one another: one stores
    it, one that agrees with it is told it is there, one that does not is refused naming both
    (never "already in the store")."""
    layouts = ["Et*2|tL", "Et|t*2L", "Et*2|tL"]
    for attempt in range(2):
        root = tmp_path / str(attempt)
        barrier, results = SPAWN.Barrier(3), SPAWN.Queue()
        racers = [
            SPAWN.Process(target=_ingest_declared, args=(str(root), barrier, results, layout))
            for layout in layouts
        ]
        assert run_processes(*racers) == [0, 0, 0]
        outcomes = [results.get(timeout=5) for _ in racers]
        (stored,) = CostStore(root).read("runs").layout
        assert sorted(o for _, o in outcomes if isinstance(o, bool)).count(True) == 1
        for layout, outcome in outcomes:
            if layout == stored:
                assert isinstance(outcome, bool)
                continue
            assert isinstance(outcome, str) and "\n" not in outcome
            assert f"declared with layout {stored!r}" in outcome
            assert f"declares it with layout {layout!r}" in outcome
        assert len(CostStore(root).read_run_data("timers")) == len(RUN_TABLES["timers"])


def test_a_live_writers_declaration_settles_what_a_loser_is_told(tmp_path):
    """Deterministically, the loser's side of the race: a live claim that declares another
    layout refuses, one that declares the same is "being stored" (False), and nothing is
    written either way."""
    store = CostStore(tmp_path)
    claim = claim_path(tmp_path, "s", RUN["content_hash"])
    acquire(claim, uuid.uuid4().hex, declaration({**RUN, "layout": "Et|t*2L"}), 600.0)
    being = r"is being stored now by another ingest \(pid \d+ on '.+'\) declared with layout"
    with pytest.raises(ConfigError, match=being + r" 'Et\|t\*2L'; this ingest declares it with"):
        store.write_run(RUN, RUN_TABLES, "s")
    claim.unlink()
    acquire(claim, uuid.uuid4().hex, declaration(RUN), 600.0)
    assert store.write_run(RUN, RUN_TABLES, "s") is False
    assert store.read("runs").empty and store.read("timers").empty


def test_a_stored_run_declared_otherwise_refuses_and_writes_nothing_of_the_call(tmp_path):
    store = CostStore(tmp_path)
    assert store.write_run(RUN, RUN_TABLES, "s")
    other = {**RUN, "run_id": "r2", "content_hash": "h2"}
    refused = (
        rf"^{tmp_path}: run r1 of study 's' is stored declared with pp 2, num_microbatches 4; "
        r"this ingest declares it with pp 4, num_microbatches 8: .* store rm r1 "
    )
    twice = {**RUN, "pp": 4, "num_microbatches": 8}
    with pytest.raises(ConfigError, match=refused):
        store.write_runs([(other, RUN_TABLES), (twice, RUN_TABLES)], "s")
    assert store.read("runs").run_id.tolist() == ["r1"]  # r2 was not stored either
    assert len(store.read("timers")) == len(RUN_TABLES["timers"])
    assert store.write_runs([(other, RUN_TABLES), (RUN, RUN_TABLES)], "s") == [True, False]


def test_remove_run_names_a_fit_whose_runs_are_not_a_list(tmp_path):
    store = CostStore(tmp_path)
    store.write_run(RUN, RUN_TABLES, "s")
    fits = store.write("fits", [{"fit_id": "f1", "runs": '["r1", '}], "s")
    with pytest.raises(MeasurementError, match=rf"^{fits}: the store cannot read it \(a fit's"):
        store.remove_run("s", "r1")
    assert store.read("runs", "s").run_id.tolist() == ["r1"]


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_any_damaged_part_is_read_right_or_one_line_by_every_reader(tmp_path_factory, data):
    """A part of any table cut short, overwritten, emptied, or a folder or FIFO in its place:
    every reader returns or says one line naming the damage, and changes nothing."""
    root = tmp_path_factory.mktemp("store")
    store = CostStore(root)
    store.write_run(RUN, RUN_TABLES, "s")
    part = data.draw(st.sampled_from(sorted(root.glob("table=*/study=s/part-*.parquet"))))
    good = part.read_bytes()
    how = data.draw(st.sampled_from(["cut", "overwrite", "empty", "folder", "fifo"]))
    at = data.draw(st.integers(0, len(good)))
    part.unlink()
    if how == "folder":
        part.mkdir()
    elif how == "fifo":
        os.mkfifo(part)
    else:
        noise = data.draw(st.binary(min_size=1, max_size=32))
        part.write_bytes({"cut": good[:at], "overwrite": good[:at] + noise + good[at + 32 :],
                          "empty": b""}[how])  # fmt: skip
    before = sorted(p.name for p in part.parent.iterdir())
    for read in (
        lambda: store.read("runs", "s"),
        lambda: store.read_run_data("timers", "s"),
        lambda: store.read_run_data("iterations"),
        lambda: store.remove_run("s", "r1", dry_run=True),
    ):
        try:
            read()
        except (MeasurementError, ConfigError) as error:
            assert "\n" not in str(error) and str(root) in str(error)
    assert sorted(p.name for p in part.parent.iterdir()) == before
