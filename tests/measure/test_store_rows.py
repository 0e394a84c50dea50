"""What readers take of stored rows: each row once however many files hold it (what an
interrupted ``store rm`` leaves), and a run whose rows no reader can use named in one line with
its file and the ``store rm`` that removes it."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ray_layout.errors import MeasurementError
from ray_layout.measure.store import CostStore
from ray_layout.measure.store_files import PART_FIX
from ray_layout.measure.store_rows import without_duplicates
from ray_layout.measure.store_schema import DECLARATION

RUN = {"run_id": "r1", "content_hash": "h1", "status": "finished", "model": "m",
       "layout": "Et*2|tL", "tp": 1, "pp": 2, "vpp": 1, "cp": 1, "ep": 1, "etp": 1, "dp": 1,
       "micro_batch_size": 1, "num_microbatches": 4}  # fmt: skip
TIMER = {"interval": 2, "iteration": 10, "rank": 0, "pp_rank": 0, "timer": "forward-compute",
         "ms": 12.5, "stat": "rank"}  # fmt: skip
STEP = {"iteration": 10, "elapsed_ms": 820.0}


def _stored(root: Path, run: dict[str, Any] = RUN, **tables: list[dict[str, Any]]) -> CostStore:
    store = CostStore(root)
    rows = {"timers": [TIMER], "iterations": [STEP]} | tables
    assert store.write_run(run, rows, "s")
    return store


def _copy_every_part(root: Path) -> None:
    """What a store rm cut between its rename and its delete leaves, in every table."""
    for part in list(root.glob("table=*/study=*/part-*.parquet")):
        shutil.copy(part, part.with_name(f"part-{uuid.uuid4().hex}.parquet"))


def test_rows_stored_twice_are_read_once_and_counted(tmp_path):
    store = _stored(tmp_path, timers=[TIMER, {**TIMER, "rank": 1, "ms": 12.0}])
    assert store.notes() == ()
    _copy_every_part(tmp_path)
    store = CostStore(tmp_path)
    assert len(store.read("runs", "s")) == 1
    assert len(store.read_run_data("timers", "s")) == 2
    assert len(store.read_run_data("iterations", "s")) == 1
    (note,) = store.notes()
    assert note == (
        f"{tmp_path}: 4 rows stored twice were read once (runs 1, timers 2, iterations 1), as "
        "an interrupted `store rm` leaves them"
    )


def test_only_rows_alike_in_every_column_are_one():
    frame = pd.DataFrame(
        {
            "run_id": ["a", "a", "a", "b"],
            "ms": [1.0, 1.0, float("nan"), float("nan")],
            "__filename": ["x", "y", "x", "y"],
        }
    )
    kept, dropped = without_duplicates(frame)
    assert dropped == 1 and kept.ms.isna().tolist() == [False, True, True]
    twice = pd.concat([frame, frame])
    assert without_duplicates(twice)[1] == 5  # 8 rows, 3 unlike


@pytest.mark.parametrize("column", DECLARATION)
def test_a_run_whose_timers_are_read_without_its_declaration_is_named(tmp_path, column):
    store = _stored(tmp_path, {**RUN, column: None})
    assert store.read("runs", "s")[column].isna().all()  # the raw rows stay readable
    assert len(store.read_run_data("iterations", "s")) == 1  # steps need no layout
    with pytest.raises(MeasurementError) as error:
        store.read_run_data("timers", "s")
    message = str(error.value)
    runs_file = next(tmp_path.glob("table=runs/study=s/part-*.parquet"))
    assert message.startswith(f"{runs_file}: run r1 of study 's': its runs row declares no ")
    assert column in message.split("declares no ")[1].split(" (null)")[0]
    assert message.endswith(
        f"python -m ray_layout store rm r1 --store {tmp_path} --study s (and ingest its log again)"
    )
    assert "\n" not in message


def test_a_timer_row_without_its_interval_is_named(tmp_path):
    store = _stored(tmp_path, timers=[{**TIMER, "interval": None}])
    with pytest.raises(MeasurementError, match=r"part-\w+\.parquet: run r1 .*holds no interval"):
        store.read_run_data("timers")


@pytest.mark.parametrize("ms", [0.0, -2.0])
def test_a_stored_step_of_no_time_is_refused_naming_run_and_iteration(tmp_path, ms):
    store = _stored(tmp_path, iterations=[STEP, {"iteration": 11, "elapsed_ms": ms}])
    with pytest.raises(MeasurementError) as error:
        store.read_run_data("iterations", "s")
    message = str(error.value)
    assert (
        f"run r1 of study 's': iteration 11's step is {ms!r} ms (no step takes no time" in message
    )
    assert message.startswith(str(tmp_path / "table=iterations" / "study=s" / "part-"))
    assert "store rm r1" in message and "\n" not in message


def test_a_stored_compute_timer_of_no_time_is_refused_naming_run_and_iteration(tmp_path):
    zero = {**TIMER, "rank": 1, "timer": "backward-compute", "ms": 0.0}
    store = _stored(tmp_path, timers=[TIMER, zero])
    refused = r"run r1 of study 's': at iteration 10, timer backward-compute of rank 1 is 0\.0 ms"
    with pytest.raises(MeasurementError, match=refused):
        store.read_run_data("timers", "s")
    untimed = _stored(tmp_path / "b", timers=[TIMER, {**zero, "iteration": None}])
    with pytest.raises(MeasurementError, match=r"in timer block 2, timer backward-compute"):
        untimed.read_run_data("timers", "s")


def test_a_timer_megatron_prints_as_0_00_is_read(tmp_path):
    """A gradient all-reduce under 5 µs prints as 0.00: a real value, not a missing step."""
    tiny = {**TIMER, "timer": "embedding-grads-all-reduce", "ms": 0.0}
    store = _stored(tmp_path, timers=[TIMER, tiny])
    assert sorted(store.read_run_data("timers", "s").ms) == [0.0, 12.5]


def test_a_declared_runs_memory_row_without_its_iteration_is_named(tmp_path):
    """Every row of a run that declares what it ran is whole (ingest writes them so); a run
    that declares nothing (an A/B arm's bare rows) is read as it is."""
    memory = [{"rank": 0, "pp_rank": 0, "max_allocated_mb": 1024.0}]
    store = _stored(tmp_path, memory=memory)
    with pytest.raises(MeasurementError, match=r"run r1 of study 's': a memory row holds no it"):
        store.read_run_data("memory", "s")
    bare = {"run_id": "r2", "content_hash": "h2", "status": "finished"}
    assert store.write_run(bare, {"memory": memory}, "t")
    assert store.read_run_data("memory", "t").max_allocated_mb.tolist() == [1024.0]


KEYS = [("runs", "run_id"), ("memory", "rank"), ("timers", "timer"), ("iterations", "iteration")]


@pytest.mark.parametrize(("table", "key"), KEYS)
def test_a_row_without_a_key_every_write_sets_is_damage_in_its_file(tmp_path, table, key):
    memory = [{"rank": 0, "iteration": 10, "max_allocated_mb": 1024.0}]
    _stored(tmp_path, memory=memory)
    (part,) = tmp_path.glob(f"table={table}/study=s/part-*.parquet")
    data = pq.read_table(part)
    index = data.schema.get_field_index(key)
    nulls = pa.nulls(len(data), data.schema.field(key).type)
    pq.write_table(data.set_column(index, pa.field(key, nulls.type), nulls), part)
    store = CostStore(tmp_path)
    data = "timers" if table == "runs" else table  # runs: the rows a data read joins with
    for read in (lambda: store.read(table), lambda: store.read_run_data(data)):
        with pytest.raises(MeasurementError) as error:
            read()
        assert str(error.value) == (
            f"{part}: the store cannot read it (a {table} row holds no {key}, which every row "
            f"has); {PART_FIX}"
        )
