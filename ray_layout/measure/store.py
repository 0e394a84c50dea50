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

import hashlib
import json
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from ray_layout.errors import ConfigError, MeasurementError, clipped
from ray_layout.measure.store_schema import (
    PARTITIONING,
    RUN_DATA_TABLES,
    TABLE_SCHEMAS,
    Rows,
    check_study,
    frame_of,
    table_schema,
    to_arrow,
    where,
    with_run_id,
)

STALE_CLAIM_S = 600.0

_HOST = socket.gethostname()


class CostStore:
    """The Parquet cost store under one root folder; the only object here that holds state."""

    def __init__(self, root: str | Path, stale_claim_s: float = STALE_CLAIM_S) -> None:
        self.root = Path(root)
        self.stale_claim_s = stale_claim_s

    def write(self, table: str, rows: Rows, study: str) -> Path:
        """Store rows as one new file, the unit no two writers ever share; returns its path."""
        data = to_arrow(table, frame_of(rows), study)
        return self._write_file(table, study, data, uuid.uuid4().hex)

    def read(self, table: str, study: str | None = None, **equals: Any) -> pd.DataFrame:
        """Rows of one table (of all studies, or one) whose columns equal ``equals``; None
        matches null.  Keeps every column any file has and adds ``study`` from the partition."""
        dataset = self._dataset(table, study)
        with self._readable(table):
            return dataset.to_table(filter=where(table, dataset.schema, equals)).to_pandas()

    def has(self, table: str, study: str | None, **equals: Any) -> bool:
        """Whether :meth:`read` would return a row, without loading the rows."""
        dataset = self._dataset(table, study)
        with self._readable(table):
            return dataset.count_rows(filter=where(table, dataset.schema, equals)) > 0

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
        """Ingest one run once (:meth:`write_runs` of one)."""
        return self.write_runs([(run, tables)], study)[0]

    def write_runs(
        self, runs: Sequence[tuple[Mapping[str, Any], Mapping[str, Rows]]], study: str
    ) -> list[bool]:
        """Ingest runs together, each once: every run's timers/iterations/memory rows, then one
        ``runs`` file with all their rows, so they become visible at once or not at all.

        Rows without ``run_id`` get their run's.  Every row is checked before anything is
        written.  A run is not written (False) when the study already holds it (same
        ``run_id`` or ``content_hash``) or a live writer is ingesting it now.
        """
        prepared = [_prepared(run, tables, study) for run, tables in runs]
        claimed: list[tuple[int, Path, str]] = []  # (index, claim, token)
        try:
            for index, (_, run_id, content_hash, data) in enumerate(prepared):
                if self._present(study, run_id, content_hash):
                    continue  # the common re-run case, settled without touching claims
                claim, token = self._claim_path(study, content_hash or run_id), uuid.uuid4().hex
                previous = self._acquire(claim, token)
                if previous is None or self._present(study, run_id, content_hash):
                    continue  # a live writer has it, or stored it while we were claiming
                claimed.append((index, claim, token))
                if previous:
                    self._discard(study, previous)  # a dead writer's orphan files
                for table, rows in data.items():
                    self._write_file(table, study, rows, token)
            held = []
            for index, claim, token in claimed:
                if _holds(claim, token):
                    held.append(index)
                else:  # taken over while we wrote: the taker stores the run
                    self._discard(study, token)
            if held:
                rows = pa.concat_tables([prepared[index][0] for index in held])
                self._write_file("runs", study, rows, claimed[0][2])
        except BaseException:
            for _, claim, token in claimed:
                self._release(claim, study, token)
            raise
        return [index in held for index in range(len(prepared))]

    def remove_run(self, study: str, run_id: str, dry_run: bool = False) -> dict[str, int]:
        """Remove a stored run: its ``runs`` row first (it stops being a run at once), then its
        timers, iterations and memory, the A/B decisions about it, the fits made from it and
        its claim.  Returns the rows removed (or, ``dry_run``, that would be) per table.

        A file holding other rows too is rewritten without the run's, the new file renamed in
        before the old one goes: a crash in between leaves a row twice, never one lost."""
        runs = self.read("runs", study, run_id=run_id)
        if runs.empty:
            held = sorted(self.read("runs", study).run_id)
            raise ConfigError(
                f"{self.root}: study {study!r} holds no run {run_id!r} (it holds "
                f"{', '.join(held[:5]) or 'none'}{', …' if len(held) > 5 else ''})"
            )

        def of_run(data: pa.Table) -> pa.Array:
            return pc.fill_null(pc.equal(data["run_id"], run_id), False)

        def fitted_from_run(data: pa.Table) -> pa.Array:
            used = [json.loads(listed or "[]") for listed in data["runs"].to_pylist()]
            return pa.array([run_id in runs for runs in used], type=pa.bool_())

        chosen = {table: of_run for table in ("runs", *RUN_DATA_TABLES, "decisions")}
        chosen["fits"] = fitted_from_run
        # every file read once before any is changed: an unreadable one stops it all
        removed = {t: self._remove_rows(t, study, rows, True) for t, rows in chosen.items()}
        if not dry_run:
            for table, rows in chosen.items():
                self._remove_rows(table, study, rows, False)
            claim = self._claim_path(study, runs.content_hash.iloc[0] or run_id)
            for path in [claim, *claim.parent.glob(f"{claim.name}.taken-*")]:
                path.unlink(missing_ok=True)
        return removed

    def _remove_rows(
        self, table: str, study: str, chosen: Callable[[pa.Table], pa.Array], dry_run: bool
    ) -> int:
        """Delete the ``chosen`` rows of a table's files in ``study``; how many there were."""
        removed = 0
        for path in sorted(self._partition(table, study).glob("part-*.parquet")):
            try:
                data = pq.read_table(path, partitioning=None)
            except (OSError, pa.ArrowException) as exc:  # nothing removed from this file on
                raise ConfigError(f"{path}: not a readable Parquet file ({exc})") from None
            drop = chosen(data)
            count = pc.sum(drop).as_py() or 0
            removed += count
            if not count or dry_run:
                continue
            rest = data.filter(pc.invert(drop))
            if len(rest):
                self._write_file(table, study, rest, uuid.uuid4().hex)
            path.unlink()
            _fsync_dir(path.parent)
        return removed

    def megatron_flags_path(self, study: str) -> Path:
        """The JSON file caching the flag table of the cluster's Megatron for ``study``."""
        check_study(study)
        return self.root / "_megatron_flags" / f"{study}.json"

    def _partition(self, table: str, study: str) -> Path:
        return self.root / f"table={table}" / f"study={study}"

    def _dataset(self, table: str, study: str | None) -> ds.Dataset:
        """A dataset over the table's visible files with the union of their schemas: pyarrow
        and pandas otherwise take the first file's schema and drop columns only later ones have.
        """
        schema = table_schema(table)
        if study is not None:
            check_study(study)
        folder = self.root / f"table={table}"
        files = sorted(str(path) for path in folder.glob(f"study={study or '*'}/part-*.parquet"))
        schemas = [schema, PARTITIONING.schema]
        for path in files:
            with self._readable(table, path):
                schemas.append(pq.read_schema(path))
        with self._readable(table):
            return ds.dataset(
                files,
                schema=pa.unify_schemas(schemas, promote_options="permissive"),
                format="parquet",
                partitioning=PARTITIONING,
                partition_base_dir=str(folder),
            )

    @contextmanager
    def _readable(self, table: str, path: str | None = None) -> Iterator[None]:
        """A file of the store that is cut short, is no Parquet or holds a column of another
        type is one error naming it (or the table), never a traceback; nothing is changed."""
        try:
            yield
        except (pa.ArrowException, OSError) as exc:
            where = path or str(self.root / f"table={table}")
            reason = clipped(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
            raise MeasurementError(
                f"{where}: the store cannot read it ({reason}); move the damaged file out of "
                "the store and run again (its rows are lost, the rest is kept)"
            ) from None

    def _write_file(self, table: str, study: str, data: pa.Table, file_id: str) -> Path:
        """Write a temporary file, fsync it, then rename it into place in one atomic step."""
        folder = self._partition(table, study)
        temp, final = folder / f".tmp-{file_id}.parquet", folder / f"part-{file_id}.parquet"
        try:
            folder.mkdir(parents=True, exist_ok=True)
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
        except OSError as exc:  # a full disk, a path the pre-check could not see through
            raise ConfigError(
                f"{self.root}: cannot write the store ({exc.strerror or exc})"
            ) from None
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
        temp = claim.with_name(f".{claim.name}.{token}.tmp")
        owner = {"token": token, "host": _HOST, "pid": os.getpid()}
        try:
            claim.parent.mkdir(parents=True, exist_ok=True)
            temp.write_text(json.dumps(owner | {"started": _process_start(os.getpid())}))
        except OSError as exc:  # a path the pre-check could not see through, a full disk
            raise ConfigError(
                f"{self.root}: cannot write the store ({exc.strerror or exc})"
            ) from None
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


def _prepared(
    run: Mapping[str, Any], tables: Mapping[str, Rows], study: str
) -> tuple[pa.Table, str, str | None, dict[str, pa.Table]]:
    """One run's rows cast to their tables: (runs row, run id, content hash, data tables)."""
    unknown = sorted(set(tables) - set(RUN_DATA_TABLES))
    if unknown:
        raise ValueError(f"write_run takes {', '.join(RUN_DATA_TABLES)}, not {unknown}")
    row = to_arrow("runs", frame_of([run]), study)
    run_id = row["run_id"][0].as_py()
    data = {
        table: to_arrow(table, with_run_id(frame_of(rows), run_id), study)
        for table, rows in tables.items()
        if len(rows)
    }
    return row, run_id, row["content_hash"][0].as_py(), data


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
