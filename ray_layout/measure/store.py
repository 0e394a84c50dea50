"""The cost store: runs, timers, fits and A/B decisions as hive-partitioned Parquet files.

Layout: ``<root>/table=<name>/study=<id>/part-<uuid>.parquet``, one hive-partitioned dataset per
table that pandas, pyarrow.dataset, DuckDB and Polars read as it is (``docs/measure.md`` lists
the schema).  ``study`` lives in the folder name only, never in a file: a reader adds it from
the partition, and a file column of the same name would clash with it.  Every file carries
``schema_version``; version 1 files also held ``study``, and this store still reads them.

Every write is one new file, written as ``.tmp-<uuid>.parquet`` in the same folder, fsynced, then
renamed with ``os.replace``, so a reader sees a whole file or none of it and concurrent writers
(threads, processes, hosts on one POSIX file system) need no lock.  Readers skip names that
start with ``.`` or ``_``.  Later versions may only add nullable columns; reads unify the schemas
of all files, so rows of older files get nulls in newer columns.

:meth:`CostStore.write_run` ingests one run: its timers, iterations and memory files first, its
``runs`` row last, and :meth:`CostStore.read_run_data` shows only runs that have a ``runs`` row,
so a writer that dies half way leaves nothing visible there.  A run already in the study (same
``run_id`` or ``content_hash``) is skipped.  Processes ingesting the same run at once race for a
claim file ``<root>/_claims/<study>/<sha256 of the content hash, else the run id>`` holding the
writer's host, pid and process start time; the winner writes, the others skip.  A claim whose
run has no ``runs`` row is dead when its writer's process is gone (same host: checked at once)
or when it is older than ``stale_claim_s`` (10 minutes by default; the only test for a writer on
another host): the next ingest takes it over (exactly one taker per dead claim) and deletes the
dead writer's orphan files.  Keep the timeout longer than the slowest ingest of one run: a
writer on another host merely slower than that may be taken over, and if it passes its last
ownership check first the run is stored twice.
"""

from __future__ import annotations

import functools
import hashlib
import json
import operator
import os
import re
import socket
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from ray_layout.errors import ConfigError

SCHEMA_VERSION = 2  # 2: ``study`` only in the partition path, no longer a file column
STALE_CLAIM_S = 600.0
RUN_DATA_TABLES = ("timers", "iterations", "memory")

Rows = pd.DataFrame | Sequence[Mapping[str, Any]]

_HOST = socket.gethostname()
_PARTITION_KEY = "study"
_STR, _INT, _FLOAT = pa.string(), pa.int64(), pa.float64()
_STUDY_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_PARTITIONING = ds.partitioning(pa.schema([(_PARTITION_KEY, _STR)]), flavor="hive")


def _schema(keys: set[str], **columns: pa.DataType) -> pa.Schema:
    """Keys may not be null; every other column may, so files of older versions stay readable."""
    fields = [pa.field(name, kind, nullable=name not in keys) for name, kind in columns.items()]
    return pa.schema([*fields, pa.field("schema_version", _INT, nullable=False)])


# Times are float seconds since the Unix epoch; *_json columns hold JSON text.
TABLE_SCHEMAS: dict[str, pa.Schema] = {
    "runs": _schema(
        {"run_id", "study"},
        run_id=_STR,
        study=_STR,
        model=_STR,  # the model's name
        model_hash=_STR,  # hash of the ModelSpec, so renamed copies still match
        layout=_STR,  # Megatron's --pipeline-model-parallel-layout, compact form
        pp=_INT,
        vpp=_INT,
        tp=_INT,
        cp=_INT,
        ep=_INT,
        etp=_INT,
        dp=_INT,
        micro_batch_size=_INT,
        global_batch_size=_INT,
        num_microbatches=_INT,
        backend=_STR,  # "megatron" or "emulated"
        hardware=_STR,
        status=_STR,  # e.g. "finished", "failed", "running"
        failure_class=_STR,  # e.g. "oom", "nan", "timeout" when status is "failed"
        error=_STR,
        source=_STR,  # what produced the run, e.g. "profile", "ab"
        content_hash=_STR,  # hash of the ingested logs: the same run ingested twice is one run
        started_at=_FLOAT,
        finished_at=_FLOAT,
    ),
    "timers": _schema(
        {"run_id", "timer"},
        run_id=_STR,
        interval=_INT,  # index of the logging interval the timer covers
        iteration=_INT,  # the iteration that closed that interval
        rank=_INT,  # null when ms is a statistic over ranks
        pp_rank=_INT,
        timer=_STR,  # Megatron's timer name, e.g. "forward-backward"
        ms=_FLOAT,
        stat=_STR,  # "min" or "max" over ranks, null for one rank's own time
    ),
    "iterations": _schema(
        {"run_id", "iteration"},
        run_id=_STR,
        iteration=_INT,
        elapsed_ms=_FLOAT,  # elapsed time per iteration
        throughput_tflops=_FLOAT,  # per GPU
        lm_loss=_FLOAT,
        mtp_loss=_FLOAT,
        grad_norm=_FLOAT,
        loss_scale=_FLOAT,
        skipped=_INT,  # number of skipped iterations in the interval
        nan=_INT,  # number of nan iterations in the interval
    ),
    "memory": _schema(
        {"run_id", "rank"},
        run_id=_STR,
        rank=_INT,
        pp_rank=_INT,
        iteration=_INT,
        allocated_mb=_FLOAT,
        max_allocated_mb=_FLOAT,
        reserved_mb=_FLOAT,
        max_reserved_mb=_FLOAT,
    ),
    "fits": _schema(
        {"fit_id", "study"},
        fit_id=_STR,
        study=_STR,
        created_at=_FLOAT,
        model=_STR,
        costs_json=_STR,  # the fitted UnitCosts, as COSTS.json text
        residual_max=_FLOAT,  # largest relative residual of the fit
        runs=_STR,  # JSON list of the run_ids the fit used
    ),
    "decisions": _schema(
        {"study", "decision_id"},
        study=_STR,
        decision_id=_STR,
        run_id=_STR,
        layout=_STR,
        look=_INT,  # which interim look of the A/B test
        statistic=_FLOAT,
        p_value=_FLOAT,
        action=_STR,  # e.g. "continue", "stop", "win"
        reason=_STR,
        created_at=_FLOAT,
    ),
}


class CostStore:
    """The Parquet cost store under one root folder; the only object here that holds state."""

    def __init__(self, root: str | Path, stale_claim_s: float = STALE_CLAIM_S) -> None:
        self.root = Path(root)
        self.stale_claim_s = stale_claim_s

    def write(self, table: str, rows: Rows, study: str) -> Path:
        """Store rows as one new file, the unit no two writers ever share; returns its path."""
        data = _to_arrow(table, _frame(rows), study)
        return self._write_file(table, study, data, uuid.uuid4().hex)

    def read(self, table: str, study: str | None = None, **equals: Any) -> pd.DataFrame:
        """Rows of one table (of all studies, or one) whose columns equal ``equals``; None
        matches null.  Keeps every column any file has and adds ``study`` from the partition."""
        dataset = self._dataset(table, study)
        return dataset.to_table(filter=_where(table, dataset.schema, equals)).to_pandas()

    def has(self, table: str, study: str | None, **equals: Any) -> bool:
        """Whether :meth:`read` would return a row, without loading the rows."""
        dataset = self._dataset(table, study)
        return dataset.count_rows(filter=_where(table, dataset.schema, equals)) > 0

    def studies(self) -> list[str]:
        """Ids of the studies that hold at least one file."""
        found = set()
        for table in TABLE_SCHEMAS:
            for part in (self.root / f"table={table}").glob("study=*/part-*.parquet"):
                found.add(part.parent.name.removeprefix("study="))
        return sorted(found)

    def read_run_data(self, table: str, study: str | None = None, **equals: Any) -> pd.DataFrame:
        """Like :meth:`read` for timers, iterations or memory, but only rows of runs that have
        their ``runs`` row, i.e. whose ingest finished."""
        if table not in RUN_DATA_TABLES:
            raise ValueError(f"read_run_data reads {', '.join(RUN_DATA_TABLES)}, not {table!r}")
        # Runs first: a runs row present now had all its data files written before it.
        present = self.read("runs", study)[["study", "run_id"]].drop_duplicates()
        return self.read(table, study, **equals).merge(present, on=["study", "run_id"])

    def write_run(self, run: Mapping[str, Any], tables: Mapping[str, Rows], study: str) -> bool:
        """Ingest one run once: its timers/iterations/memory rows, then its ``runs`` row.

        Rows without ``run_id`` get the run's.  Returns False, writing nothing, when the study
        already holds the run (same ``run_id`` or ``content_hash``) or a live writer is
        ingesting it now.
        """
        unknown = sorted(set(tables) - set(RUN_DATA_TABLES))
        if unknown:
            raise ValueError(f"write_run takes {', '.join(RUN_DATA_TABLES)}, not {unknown}")
        runs_row = _to_arrow("runs", _frame([run]), study)
        run_id = runs_row["run_id"][0].as_py()
        content_hash = runs_row["content_hash"][0].as_py()
        data = {
            table: _to_arrow(table, _with_run_id(_frame(rows), run_id), study)
            for table, rows in tables.items()
            if len(rows)
        }
        if self._present(study, run_id, content_hash):
            return False  # the common re-run case, settled without touching claims
        claim = self._claim_path(study, content_hash or run_id)
        token = uuid.uuid4().hex
        previous = self._acquire(claim, token)
        if previous is None:
            return False
        try:
            if self._present(study, run_id, content_hash):
                return False  # stored while we were claiming
            if previous:
                self._discard(study, previous)  # a dead writer's orphan files
            for table, rows in data.items():
                self._write_file(table, study, rows, token)
            if not _holds(claim, token):
                self._discard(study, token)
                return False  # taken over while we wrote: the taker stores the run
            self._write_file("runs", study, runs_row, token)
        except BaseException:
            self._release(claim, study, token)
            raise
        return True

    def megatron_flags_path(self, study: str) -> Path:
        """The JSON file caching the flag table of the cluster's Megatron for ``study``."""
        _check_study(study)
        return self.root / "_megatron_flags" / f"{study}.json"

    def _partition(self, table: str, study: str) -> Path:
        return self.root / f"table={table}" / f"study={study}"

    def _dataset(self, table: str, study: str | None) -> ds.Dataset:
        """A dataset over the table's visible files with the union of their schemas: pyarrow
        and pandas otherwise take the first file's schema and drop columns only later ones have.
        """
        schema = _table_schema(table)
        if study is not None:
            _check_study(study)
        folder = self.root / f"table={table}"
        files = sorted(str(path) for path in folder.glob(f"study={study or '*'}/part-*.parquet"))
        schemas = [schema, _PARTITIONING.schema, *(pq.read_schema(path) for path in files)]
        return ds.dataset(
            files,
            schema=pa.unify_schemas(schemas, promote_options="permissive"),
            format="parquet",
            partitioning=_PARTITIONING,
            partition_base_dir=str(folder),
        )

    def _write_file(self, table: str, study: str, data: pa.Table, file_id: str) -> Path:
        """Write a temporary file, fsync it, then rename it into place in one atomic step."""
        folder = self._partition(table, study)
        folder.mkdir(parents=True, exist_ok=True)
        temp, final = folder / f".tmp-{file_id}.parquet", folder / f"part-{file_id}.parquet"
        try:
            with open(temp, "wb") as file:
                pq.write_table(data, file)
                file.flush()
                os.fsync(file.fileno())
            os.replace(temp, final)
        except BaseException:
            temp.unlink(missing_ok=True)
            raise
        _fsync_dir(folder)
        return final

    def _present(self, study: str, run_id: str, content_hash: str | None) -> bool:
        """Whether the study has a runs row with this run_id or content hash."""
        same = ds.field("run_id") == run_id
        if content_hash is not None:
            same = same | (ds.field("content_hash") == content_hash)
        return self._dataset("runs", study).count_rows(filter=same) > 0

    def _claim_path(self, study: str, key: str) -> Path:
        """Hashed, so any content hash or run id makes a safe file name."""
        return self.root / "_claims" / study / hashlib.sha256(key.encode()).hexdigest()

    def _acquire(self, claim: Path, token: str) -> str | None:
        """Own the claim under ``token``: the token of the dead claim taken over ("" for a new
        claim), or None when a live writer holds it.

        ``os.link`` creates the claim with its content in one step and fails if it exists,
        like ``O_CREAT | O_EXCL``, so no reader ever sees a claim without its token.
        """
        claim.parent.mkdir(parents=True, exist_ok=True)
        temp = claim.with_name(f".{claim.name}.{token}.tmp")
        temp.write_text(json.dumps({"token": token, "host": _HOST, "pid": os.getpid(),
                                    "started": _process_start(os.getpid())}))  # fmt: skip
        try:
            os.link(temp, claim)
            return ""
        except FileExistsError:
            return self._take_over(claim, temp)
        finally:
            temp.unlink(missing_ok=True)

    def _take_over(self, claim: Path, temp: Path) -> str | None:
        """Replace a dead claim with ours; of all writers that find it dead, the one that
        creates its ``.taken-<token>`` marker first wins, so it is taken over once."""
        state = _read_claim(claim)
        if state is None:
            return None
        modified, owner = state
        if not _writer_gone(owner) and time.time() - modified <= self.stale_claim_s:
            return None
        marker = claim.with_name(f"{claim.name}.taken-{owner['token']}")
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return None
        os.replace(temp, claim)
        return owner["token"]

    def _discard(self, study: str, token: str) -> None:
        """Delete the data files one ingest wrote (never its runs file: that makes a run whole)."""
        for table in RUN_DATA_TABLES:
            (self._partition(table, study) / f"part-{token}.parquet").unlink(missing_ok=True)

    def _release(self, claim: Path, study: str, token: str) -> None:
        """After a failed ingest: drop its files and age its claim so a retry need not wait."""
        self._discard(study, token)
        if _holds(claim, token):
            os.utime(claim, (0, 0))


def _read_claim(claim: Path) -> tuple[float, dict[str, Any]] | None:
    """(mtime, content) of a claim through one handle, so both describe the same file."""
    try:
        with open(claim) as file:
            return os.fstat(file.fileno()).st_mtime, json.load(file)
    except FileNotFoundError:
        return None


def _holds(claim: Path, token: str) -> bool:
    state = _read_claim(claim)
    return state is not None and state[1]["token"] == token


def _proc_stat(pid: int) -> list[str] | None:
    """Linux's /proc/<pid>/stat fields from the state on (the name before may hold spaces)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def _process_start(pid: int) -> str | None:
    """When a process started (clock ticks since boot), so that a new process that reuses a
    dead writer's pid is not taken for it; None where /proc has no answer."""
    fields = _proc_stat(pid)
    return None if fields is None else fields[19]


def _writer_gone(owner: Mapping[str, Any]) -> bool:
    """Whether a claim's writer has exited (a zombie has): known only for a writer on this
    host."""
    pid = owner.get("pid")
    if owner.get("host") != _HOST or not isinstance(pid, int):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass  # another user's process: alive
    fields = _proc_stat(pid)
    if fields is None:
        return False  # no /proc: the pid answering is all there is to go by
    started = owner.get("started")
    return fields[0] in ("Z", "X") or (started is not None and started != fields[19])


def _fsync_dir(folder: Path) -> None:
    """Make a rename durable: the new directory entry lives in the folder's own blocks."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _table_schema(table: str) -> pa.Schema:
    if table not in TABLE_SCHEMAS:
        raise ValueError(f"unknown table {table!r}; tables are {', '.join(TABLE_SCHEMAS)}")
    return TABLE_SCHEMAS[table]


def _check_study(study: str) -> None:
    if not isinstance(study, str) or not _STUDY_ID.fullmatch(study):
        raise ConfigError(
            f"study id must be letters, digits, '.', '_' or '-', not starting with '.', '_' "
            f"or '-', got {study!r}"
        )


def _frame(rows: Rows) -> pd.DataFrame:
    return rows if isinstance(rows, pd.DataFrame) else pd.DataFrame([dict(row) for row in rows])


def _with_run_id(frame: pd.DataFrame, run_id: str) -> pd.DataFrame:
    if "run_id" in frame and not (frame["run_id"] == run_id).all():
        raise ValueError(f"rows given for run {run_id!r} name another run_id")
    return frame.assign(run_id=run_id)


def file_schema(table: str) -> pa.Schema:
    """The columns a table's files hold: its schema less ``study``, which the partition holds."""
    schema = _table_schema(table)
    index = schema.get_field_index(_PARTITION_KEY)
    return schema if index < 0 else schema.remove(index)


def _to_arrow(table: str, frame: pd.DataFrame, study: str) -> pa.Table:
    """Rows cast to the table's file schema; ``schema_version`` is set here, and a ``study``
    column in the rows, which every table accepts, must name the partition's study."""
    schema = file_schema(table)
    _check_study(study)
    unknown = sorted(set(frame.columns) - set(schema.names) - {"study"})
    if unknown:
        raise ValueError(f"table {table!r} has no column(s) {', '.join(map(str, unknown))}")
    if len(frame) == 0:
        raise ValueError(f"no rows to write to table {table!r}")
    if "study" in frame and not (frame["study"] == study).all():
        raise ValueError(f"rows for study {study!r} name another study")
    arrays = [_column(table, field, _values(field.name, frame)) for field in schema]
    return pa.Table.from_arrays(arrays, schema=schema)


def _values(name: str, frame: pd.DataFrame) -> Any:
    """One column's values: set by the store, given in the rows, or null."""
    if name == "schema_version":
        return [SCHEMA_VERSION] * len(frame)
    return frame[name] if name in frame else [None] * len(frame)


def _column(table: str, field: pa.Field, values: Any) -> pa.Array:
    try:
        array = pa.array(values, type=field.type, from_pandas=True)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise ValueError(f"table {table!r} column {field.name!r}: {_first_line(exc)}") from None
    if not field.nullable and array.null_count:
        raise ValueError(f"table {table!r} column {field.name!r} must not be null")
    return array


def _where(table: str, schema: pa.Schema, equals: Mapping[str, Any]) -> ds.Expression | None:
    """Equality on every named column (None matches null), values cast to the column's type."""
    conditions = []
    for name, value in equals.items():
        if name not in schema.names:
            raise ValueError(f"table {table!r} has no column {name!r}")
        if value is None:
            conditions.append(ds.field(name).is_null())
            continue
        try:
            conditions.append(ds.field(name) == pa.scalar(value, type=schema.field(name).type))
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise ValueError(f"filter {name}={value!r}: {_first_line(exc)}") from None
    return functools.reduce(operator.and_, conditions) if conditions else None


def _first_line(exc: Exception) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
