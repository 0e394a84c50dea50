"""What the store's readers take of the rows they read: each row once, and measurements only from
rows that can be used, a row that cannot named with its file, run and the ``store rm`` that
removes it.

A row can be stored twice: ``store rm`` renames a file rewritten without the removed run's rows
in before it deletes the old one, so a crash in between leaves the other runs' rows in both.  A
row the same in every column is never two measurements (each holds its run, iteration, rank
and timer), so readers keep the first.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from ray_layout.errors import MeasurementError, clipped
from ray_layout.measure.store_files import PART_FIX, damaged
from ray_layout.measure.store_schema import DECLARATION, REQUIRED, file_schema

FILE = "__filename"  # pyarrow's name for the file a dataset row came from
# Work every rank does every step: 0 ms is no measurement (Megatron prints a rank's timer only
# when it is above 0), so a stored 0 (written before ingest refused them) cannot be fitted.
TIMED_WORK = ("forward-compute", "backward-compute")


def without_duplicates(frame: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """The rows once each (whatever file holds them), and how many copies were dropped."""
    columns = [column for column in frame.columns if column != FILE]
    kept = frame.drop_duplicates(subset=columns) if columns else frame
    return kept.reset_index(drop=True), len(frame) - len(kept)


def check_keys(table: str, rows: pd.DataFrame) -> None:
    """A row without a column every write sets (its keys, its schema version) is damage in the
    file that holds it: no run can be named to remove."""
    for field in file_schema(table):
        if not field.nullable and field.name in rows:
            missing = rows[rows[field.name].isna()]
            if len(missing):
                reason = f"a {table} row holds no {field.name}, which every row has"
                raise damaged(missing.iloc[0][FILE], reason, PART_FIX)


def check_run_data(table: str, rows: pd.DataFrame, runs: pd.DataFrame, root: Path) -> None:
    """Refuse, in one line, the first row of a run's timers, iterations or memory that no
    reader can use: timers of a run that does not declare what it ran (the layout and sizes
    that place each rank), a null required column in a row of a run that does, a step or
    compute timer of 0 ms or less."""
    if table == "timers":
        _check_declared(runs[runs.run_id.isin(set(rows.run_id))], root)
    declared = runs[runs[list(DECLARATION)].notna().all(axis=1)]
    of_declared = rows.set_index(["study", "run_id"]).index.isin(
        declared.set_index(["study", "run_id"]).index
    )
    for column in REQUIRED[table]:
        missing = rows[of_declared & rows[column].isna().to_numpy()]
        if len(missing):
            raise _unusable(root, missing.iloc[0], f"a {table} row holds no {column} (null)")
    if table == "timers":
        work = rows[rows.timer.isin(TIMED_WORK) & (rows.ms <= 0)]
        if len(work):
            row = work.iloc[0]
            rank = "" if pd.isna(row["rank"]) else f" of rank {int(row['rank'])}"
            raise _unusable(
                root,
                row,
                f"{_when(row)} timer {row.timer}{rank} is {float(row.ms)!r} ms (a rank's compute "
                "takes time; stored before ingest refused such timers)",
            )
    if table == "iterations":
        steps = rows[rows.elapsed_ms <= 0]
        if len(steps):
            row = steps.iloc[0]
            raise _unusable(
                root,
                row,
                f"iteration {int(row.iteration)}'s step is {float(row.elapsed_ms)!r} ms (no "
                "step takes no time; stored before ingest refused such steps)",
            )


def _check_declared(runs: pd.DataFrame, root: Path) -> None:
    for row in runs.to_dict("records"):
        missing = [column for column in DECLARATION if pd.isna(row[column])]
        if missing:
            raise _unusable(
                root,
                row,
                f"its runs row declares no {', '.join(missing)} (null), so no reader can tell "
                "which stage each rank's timers are",
            )


def _when(row: pd.Series) -> str:
    if pd.isna(row.iteration):
        return f"in timer block {int(row.interval)},"
    return f"at iteration {int(row.iteration)},"


def _unusable(root: Path, row: pd.Series | dict, problem: str) -> MeasurementError:
    run_id, study = clipped(str(row["run_id"])), clipped(str(row["study"]))
    return MeasurementError(
        f"{row[FILE]}: run {run_id} of study {study!r}: {problem}; remove the run with "
        f"python -m ray_layout store rm {run_id} --store {root} --study {study} (and ingest "
        "its log again)"
    )
