"""The cost store's tables: their Parquet schemas, and rows cast to them (the checks every write
passes: known columns, no null keys, one study per file)."""

from __future__ import annotations

import functools
import operator
import re
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds

from ray_layout.errors import ConfigError

SCHEMA_VERSION = 2  # 2: ``study`` only in the partition path, no longer a file column
RUN_DATA_TABLES = ("timers", "iterations", "memory")

Rows = pd.DataFrame | Sequence[Mapping[str, Any]]

PARTITION_KEY = "study"
STR, INT, FLOAT = pa.string(), pa.int64(), pa.float64()
STUDY_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
PARTITIONING = ds.partitioning(pa.schema([(PARTITION_KEY, STR)]), flavor="hive")


COLUMN_TYPES = {"str": STR, "int": INT, "float": FLOAT}
TABLES_FILE = Path(__file__).with_name("store_tables.toml")


def table_of(keys: set[str], columns: Mapping[str, str]) -> pa.Schema:
    """Keys may not be null; every other column may, so files of older versions stay readable."""
    fields = [
        pa.field(name, COLUMN_TYPES[kind], nullable=name not in keys)
        for name, kind in columns.items()
    ]
    return pa.schema([*fields, pa.field("schema_version", INT, nullable=False)])


def _tables(path: Path) -> dict[str, Any]:
    """The tables declared in ``store_tables.toml`` (data, so each column keeps its note)."""
    with path.open("rb") as file:
        return tomllib.load(file)


_DECLARED = _tables(TABLES_FILE)
TABLE_SCHEMAS: dict[str, pa.Schema] = {
    name: table_of(set(t["keys"]), t["columns"]) for name, t in _DECLARED.items()
}
# Columns every row of a run that declares what it ran must hold, beyond the keys (which no
# write lets be null): an ingested run is read whole or not at all.
REQUIRED: dict[str, tuple[str, ...]] = {
    name: tuple(t.get("required", ())) for name, t in _DECLARED.items()
}
DECLARATION: tuple[str, ...] = tuple(_DECLARED["runs"]["declaration"])


def declaration(row: Mapping[str, Any]) -> dict[str, Any]:
    """What a ``runs`` row declares its run ran, as plain values (a null is None, a whole float
    an int), so a row read back, a row to write and a claim's JSON compare equal."""
    return {column: plain(row.get(column)) for column in DECLARATION}


def plain(value: Any) -> Any:
    if hasattr(value, "item"):  # a numpy scalar
        value = value.item()
    if isinstance(value, float):
        return None if value != value else int(value) if value.is_integer() else value
    return value


def table_schema(table: str) -> pa.Schema:
    if table not in TABLE_SCHEMAS:
        raise ValueError(f"unknown table {table!r}; tables are {', '.join(TABLE_SCHEMAS)}")
    return TABLE_SCHEMAS[table]


def check_study(study: str) -> None:
    if not isinstance(study, str) or not STUDY_ID.fullmatch(study):
        raise ConfigError(
            f"study id must be letters, digits, '.', '_' or '-', not starting with '.', '_' "
            f"or '-', got {study!r}"
        )


def frame_of(rows: Rows) -> pd.DataFrame:
    return rows if isinstance(rows, pd.DataFrame) else pd.DataFrame([dict(row) for row in rows])


def with_run_id(frame: pd.DataFrame, run_id: str) -> pd.DataFrame:
    if "run_id" in frame and not (frame["run_id"] == run_id).all():
        raise ValueError(f"rows given for run {run_id!r} name another run_id")
    return frame.assign(run_id=run_id)


def file_schema(table: str) -> pa.Schema:
    """The columns a table's files hold: its schema less ``study``, which the partition holds."""
    schema = table_schema(table)
    index = schema.get_field_index(PARTITION_KEY)
    return schema if index < 0 else schema.remove(index)


def to_arrow(table: str, frame: pd.DataFrame, study: str) -> pa.Table:
    """Rows cast to the table's file schema; ``schema_version`` is set here, and a ``study``
    column in the rows, which every table accepts, must name the partition's study."""
    schema = file_schema(table)
    check_study(study)
    unknown = sorted(set(frame.columns) - set(schema.names) - {"study"})
    if unknown:
        raise ValueError(f"table {table!r} has no column(s) {', '.join(map(str, unknown))}")
    if len(frame) == 0:
        raise ValueError(f"no rows to write to table {table!r}")
    if "study" in frame and not (frame["study"] == study).all():
        raise ValueError(f"rows for study {study!r} name another study")
    arrays = [column_array(table, field, column_values(field.name, frame)) for field in schema]
    return pa.Table.from_arrays(arrays, schema=schema)


def column_values(name: str, frame: pd.DataFrame) -> Any:
    """One column's values: set by the store, given in the rows, or null."""
    if name == "schema_version":
        return [SCHEMA_VERSION] * len(frame)
    return frame[name] if name in frame else [None] * len(frame)


def column_array(table: str, field: pa.Field, values: Any) -> pa.Array:
    try:
        array = pa.array(values, type=field.type, from_pandas=True)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise ValueError(f"table {table!r} column {field.name!r}: {first_line(exc)}") from None
    if not field.nullable and array.null_count:
        raise ValueError(f"table {table!r} column {field.name!r} must not be null")
    return array


def where(table: str, schema: pa.Schema, equals: Mapping[str, Any]) -> ds.Expression | None:
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
            raise ValueError(f"filter {name}={value!r}: {first_line(exc)}") from None
    return functools.reduce(operator.and_, conditions) if conditions else None


def first_line(exc: Exception) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
