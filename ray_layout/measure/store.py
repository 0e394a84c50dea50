"""The cost store: runs, timers, fits and A/B decisions as hive-partitioned Parquet files.

Layout: ``<root>/table=<name>/study=<id>/part-<uuid>.parquet``, one hive-partitioned dataset per
table that pandas, pyarrow.dataset, DuckDB and Polars read as it is (``docs/measure.md`` lists
the schema).  ``study`` lives in the folder name only, never in a file: a reader adds it from
the partition, and a file column of the same name would clash with it.  Every file carries
``schema_version``; version 1 files also held ``study``, and this store still reads them.

Every write is one new file, written as ``.tmp-<uuid>.parquet`` in the same folder, fsynced, then
renamed with ``os.replace``, so a reader sees a whole file or none of it and concurrent writers
(threads, processes, hosts on one POSIX file system) need no lock.  Readers skip names that
start with ``.`` or ``_``, read every file through ``store_files`` (a damaged one is one error
naming it and the fix) and keep each row once (``store_rows``).  Later versions may only add
nullable columns; reads unify the schemas of all files, so rows of older files get nulls in
newer columns.

:meth:`CostStore.write_run` ingests one run: its timers, iterations and memory files first, its
``runs`` row last, and :meth:`CostStore.read_run_data` shows only runs that have a ``runs`` row,
so a writer that dies half way leaves nothing visible there.  A run is its log's content and
its declaration (``store_schema.DECLARATION``: layout, sizes, micro-batches): a run the study
already holds (same ``run_id`` or ``content_hash``) is skipped when it declares the same, and
refused when it declares otherwise.  Processes ingesting the same run at once race for a claim
(``store_claims``) that holds the winner's declaration: the winner writes, a loser that declares
the same skips and one that declares otherwise is refused.  A claim whose run has no ``runs``
row is taken over when its writer is gone or it is older than ``stale_claim_s`` (10 minutes by
default; the only test for a writer on another host), and the dead writer's orphan files are
deleted.  Keep the timeout longer than the slowest ingest of one run: a writer on another host
merely slower than that may be taken over, and if it passes its last ownership check first the
run is stored twice.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from ray_layout.errors import ConfigError, MeasurementError, clipped, quoted
from ray_layout.measure.store_claims import acquire, claim_path, holds
from ray_layout.measure.store_files import (
    PART_FIX,
    damaged,
    fsync_dir,
    part_schema,
    part_table,
    reason_of,
    write_parquet,
)
from ray_layout.measure.store_rows import FILE, check_keys, check_run_data, without_duplicates
from ray_layout.measure.store_schema import (
    DECLARATION,
    PARTITIONING,
    RUN_DATA_TABLES,
    TABLE_SCHEMAS,
    Rows,
    check_study,
    declaration,
    frame_of,
    table_schema,
    to_arrow,
    where,
    with_run_id,
)

STALE_CLAIM_S = 600.0


class CostStore:
    """The Parquet cost store under one root folder; the only object here that holds state:
    how many rows stored twice its reads have kept once (:meth:`notes`)."""

    def __init__(self, root: str | Path, stale_claim_s: float = STALE_CLAIM_S) -> None:
        self.root = Path(root)
        self.stale_claim_s = stale_claim_s
        self._duplicates: dict[tuple[str, str | None], int] = {}

    def write(self, table: str, rows: Rows, study: str) -> Path:
        """Store rows as one new file, the unit no two writers ever share; returns its path."""
        data = to_arrow(table, frame_of(rows), study)
        return self._write_file(table, study, data, uuid.uuid4().hex)

    def read(self, table: str, study: str | None = None, **equals: Any) -> pd.DataFrame:
        """Rows of one table (of all studies, or one) whose columns equal ``equals``; None
        matches null.  Keeps every column any file has and adds ``study`` from the partition;
        a row stored twice comes once."""
        return self._rows(table, study, equals).drop(columns=FILE)

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
        their ``runs`` row, i.e. whose ingest finished; a row no reader can use (``store_rows``)
        is refused in one line naming its file and run."""
        if table not in RUN_DATA_TABLES:
            raise ValueError(f"read_run_data reads {', '.join(RUN_DATA_TABLES)}, not {table!r}")
        # Runs first: a runs row present now had all its data files written before it.
        runs = self._rows("runs", study, {})
        present = runs[["study", "run_id"]].drop_duplicates()
        rows = self._rows(table, study, equals).merge(present, on=["study", "run_id"])
        check_run_data(table, rows, runs, self.root)
        return rows.drop(columns=FILE)

    def notes(self) -> tuple[str, ...]:
        """What this store's reads dropped, for a command to say: rows stored twice."""
        counts: dict[str, int] = {}
        for (table, _), count in self._duplicates.items():
            counts[table] = max(counts.get(table, 0), count)
        listed = ", ".join(f"{table} {count:,}" for table, count in counts.items() if count)
        if not listed:
            return ()
        return (
            f"{self.root}: {sum(counts.values()):,} rows stored twice were read once ({listed}), "
            "as an interrupted `store rm` leaves them",
        )

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
        ``run_id`` or ``content_hash``) or a live writer is ingesting it now, and declared the
        same; declared otherwise, it is a :class:`ConfigError` naming both declarations (and
        nothing of this call is stored).
        """
        prepared = [_prepared(run, tables, study) for run, tables in runs]
        claimed: list[tuple[int, Path, str]] = []  # (index, claim, token)
        try:
            for index, (row, run_id, content_hash, data) in enumerate(prepared):
                ours = declaration(row.to_pylist()[0])
                if self._stored_alike(study, run_id, content_hash, ours):
                    continue  # the common re-run case, settled without touching claims
                claim = claim_path(self.root, study, content_hash or run_id)
                token = uuid.uuid4().hex
                outcome = acquire(claim, token, ours, self.stale_claim_s)
                if outcome.previous is None:  # a live writer has it: the same run, or refused
                    theirs = (outcome.holder or {}).get("declaration")
                    if isinstance(theirs, dict) and _differs(theirs, ours):
                        raise self._contradiction(study, run_id, theirs, ours, outcome.holder)
                    continue
                if self._stored_alike(study, run_id, content_hash, ours):
                    continue  # stored while we were claiming
                claimed.append((index, claim, token))
                if outcome.previous:
                    self._discard(study, outcome.previous)  # a dead writer's orphan files
                for table, rows in data.items():
                    self._write_file(table, study, rows, token)
            held = []
            for index, claim, token in claimed:
                if holds(claim, token):
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
        before the old one goes: a crash in between leaves a row twice (readers keep it once),
        never one lost."""
        runs = self.read("runs", study, run_id=run_id)
        if runs.empty:
            held = sorted(self.read("runs", study).run_id)
            raise ConfigError(
                f"{self.root}: study {study!r} holds no run {run_id!r} (it holds "
                f"{', '.join(held[:5]) or 'none'}{', …' if len(held) > 5 else ''})"
            )

        def of_run(data: pa.Table, _: Path) -> pa.Array:
            return pc.fill_null(pc.equal(data["run_id"], run_id), False)

        def fitted_from_run(data: pa.Table, path: Path) -> pa.Array:
            used = [_fit_runs(listed, path) for listed in data["runs"].to_pylist()]
            return pa.array([run_id in runs for runs in used], type=pa.bool_())

        chosen = {table: of_run for table in ("runs", *RUN_DATA_TABLES, "decisions")}
        chosen["fits"] = fitted_from_run
        # every file read once before any is changed: an unreadable one stops it all
        removed = {t: self._remove_rows(t, study, rows, True) for t, rows in chosen.items()}
        if not dry_run:
            for table, rows in chosen.items():
                self._remove_rows(table, study, rows, False)
            claim = claim_path(self.root, study, runs.content_hash.iloc[0] or run_id)
            for path in [claim, *claim.parent.glob(f"{claim.name}.taken-*")]:
                path.unlink(missing_ok=True)
        return removed

    def _remove_rows(
        self,
        table: str,
        study: str,
        chosen: Callable[[pa.Table, Path], pa.Array],
        dry_run: bool,
    ) -> int:
        """Delete the ``chosen`` rows of a table's files in ``study``; how many there were."""
        removed = 0
        for path in sorted(self._partition(table, study).glob("part-*.parquet")):
            data = part_table(path)  # an unreadable file: nothing removed from it on
            drop = chosen(data, path)
            count = pc.sum(drop).as_py() or 0
            removed += count
            if not count or dry_run:
                continue
            rest = data.filter(pc.invert(drop))
            if len(rest):
                self._write_file(table, study, rest, uuid.uuid4().hex)
            path.unlink()
            fsync_dir(path.parent)
        return removed

    def megatron_flags_path(self, study: str) -> Path:
        """The JSON file caching the flag table of the cluster's Megatron for ``study``."""
        check_study(study)
        return self.root / "_megatron_flags" / f"{study}.json"

    def _partition(self, table: str, study: str) -> Path:
        return self.root / f"table={table}" / f"study={study}"

    def _rows(self, table: str, study: str | None, equals: Mapping[str, Any]) -> pd.DataFrame:
        """The matching rows once each, with the file each came from (``FILE``)."""
        dataset = self._dataset(table, study)
        with self._readable(table):
            data = dataset.to_table(
                columns=[*dataset.schema.names, FILE],
                filter=where(table, dataset.schema, equals),
            )
            frame, dropped = without_duplicates(data.to_pandas())
        check_keys(table, frame)
        key = (table, study)
        self._duplicates[key] = max(self._duplicates.get(key, 0), dropped)
        return frame

    def _dataset(self, table: str, study: str | None) -> ds.Dataset:
        """A dataset over the table's visible files with the union of their schemas: pyarrow
        and pandas otherwise take the first file's schema and drop columns only later ones have.
        """
        schema = table_schema(table)
        if study is not None:
            check_study(study)
        folder = self.root / f"table={table}"
        files = sorted(str(path) for path in folder.glob(f"study={study or '*'}/part-*.parquet"))
        schemas = [schema, PARTITIONING.schema, *map(part_schema, files)]
        with self._readable(table):
            return ds.dataset(
                files,
                schema=pa.unify_schemas(schemas, promote_options="permissive"),
                format="parquet",
                partitioning=PARTITIONING,
                partition_base_dir=str(folder),
            )

    @contextmanager
    def _readable(self, table: str) -> Iterator[None]:
        """Files that pass ``store_files`` alone but not together (a column of another type in
        one of them) are one error naming the table, never a traceback; nothing is changed."""
        try:
            yield
        except (pa.ArrowException, OSError, UnicodeError) as exc:
            raise damaged(self.root / f"table={table}", reason_of(exc), PART_FIX) from None

    def _write_file(self, table: str, study: str, data: pa.Table, file_id: str) -> Path:
        """Write a temporary file, fsync it, then rename it into place in one atomic step."""
        folder = self._partition(table, study)
        temp, final = folder / f".tmp-{file_id}.parquet", folder / f"part-{file_id}.parquet"
        try:
            folder.mkdir(parents=True, exist_ok=True)
            try:
                write_parquet(temp, data)
                os.replace(temp, final)
            except BaseException:
                temp.unlink(missing_ok=True)
                raise
            fsync_dir(folder)
        except OSError as exc:  # a full disk, a path the pre-check could not see through
            raise ConfigError(
                f"{self.root}: cannot write the store ({exc.strerror or exc})"
            ) from None
        return final

    def _stored_alike(
        self, study: str, run_id: str, content_hash: str | None, ours: Mapping[str, Any]
    ) -> bool:
        """Whether the study holds this run (its run_id or content hash) declared as ``ours``;
        a :class:`ConfigError` when it holds it declared otherwise."""
        same = ds.field("run_id") == run_id
        if content_hash is not None:
            same = same | (ds.field("content_hash") == content_hash)
        dataset = self._dataset("runs", study)
        with self._readable("runs"):
            stored = dataset.to_table(filter=same).to_pylist()
        for row in stored:
            theirs = declaration(row)
            if _differs(theirs, ours):
                raise self._contradiction(study, str(row["run_id"]), theirs, ours, None)
        return bool(stored)

    def _contradiction(
        self,
        study: str,
        run_id: str,
        theirs: Mapping[str, Any],
        ours: Mapping[str, Any],
        holder: Mapping[str, Any] | None,
    ) -> ConfigError:
        """One log declared as two runs: one line naming both declarations."""
        differs = [column for column in DECLARATION if theirs.get(column) != ours[column]]
        was = ", ".join(f"{column} {quoted(theirs.get(column))}" for column in differs)
        now = ", ".join(f"{column} {quoted(ours[column])}" for column in differs)
        state = "stored"
        if holder is not None:
            pid, host = quoted(holder.get("pid")), quoted(holder.get("host"))
            state = f"being stored now by another ingest (pid {pid} on {host})"
        return ConfigError(
            f"{self.root}: run {clipped(run_id)} of study {study!r} is {state} declared with "
            f"{was}; this ingest declares it with {now}: a run is its log and its declaration, "
            "so one log is not stored as two runs (give each log the layout and sizes it ran, "
            f"or remove the stored run: python -m ray_layout store rm {clipped(run_id)} --store "
            f"{self.root} --study {study})"
        )

    def _discard(self, study: str, token: str) -> None:
        """Delete the data files one ingest wrote (never its runs file: that makes a run whole)."""
        for table in RUN_DATA_TABLES:
            (self._partition(table, study) / f"part-{token}.parquet").unlink(missing_ok=True)

    def _release(self, claim: Path, study: str, token: str) -> None:
        """After a failed ingest: drop its files and age its claim so a retry need not wait
        (a claim damaged since is left for its own error, not raised over the first)."""
        self._discard(study, token)
        with suppress(MeasurementError):
            if holds(claim, token):
                os.utime(claim, (0, 0))


def _differs(theirs: Mapping[str, Any], ours: Mapping[str, Any]) -> bool:
    return any(theirs.get(column) != ours[column] for column in DECLARATION)


def _fit_runs(listed: str | None, path: Path) -> list[str]:
    """A ``fits`` row's runs: a JSON list of run ids, or damage naming its file."""
    try:
        runs = json.loads(listed or "[]")
    except (ValueError, RecursionError) as exc:
        raise damaged(path, f"a fit's runs are not JSON: {reason_of(exc)}", PART_FIX) from None
    if not isinstance(runs, list) or not all(isinstance(run, str) for run in runs):
        raise damaged(path, f"a fit's runs are not a list of run ids: {quoted(runs)}", PART_FIX)
    return runs


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
