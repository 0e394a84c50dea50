"""The cost store's schemas and the checks every write passes, without a store on disk."""

from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd
import pyarrow.dataset as ds
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ray_layout.errors import ConfigError
from ray_layout.measure.ingest import DECLARED_COLUMNS
from ray_layout.measure.store_schema import (
    COLUMN_TYPES,
    DECLARATION,
    PARTITION_KEY,
    SCHEMA_VERSION,
    TABLE_SCHEMAS,
    TABLES_FILE,
    check_study,
    declaration,
    file_schema,
    first_line,
    frame_of,
    table_of,
    table_schema,
    to_arrow,
    where,
    with_run_id,
)

KEYS = {  # the columns each table may not leave null
    "runs": {"run_id", "study"},
    "timers": {"run_id", "timer"},
    "iterations": {"run_id", "iteration"},
    "memory": {"run_id", "rank"},
    "fits": {"fit_id", "study"},
    "decisions": {"study", "decision_id"},
}


def one_line_error(error: pytest.ExceptionInfo[Exception]) -> str:
    message = str(error.value)
    assert "\n" not in message
    return message


def test_table_of_leaves_only_keys_and_the_version_not_null() -> None:
    schema = table_of({"a"}, {"a": "str", "b": "int"})
    assert schema.names == ["a", "b", "schema_version"]
    assert [field.nullable for field in schema] == [False, True, False]


@pytest.mark.parametrize("table", list(TABLE_SCHEMAS))
def test_every_table_leaves_its_keys_alone_not_null(table: str) -> None:
    """Columns added later must be nullable, or files written before them could not be read."""
    schema = table_schema(table)
    assert {field.name for field in schema if not field.nullable} == KEYS[table] | {
        "schema_version"
    }
    assert schema.names[-1] == "schema_version"


@pytest.mark.parametrize("table", list(TABLE_SCHEMAS))
def test_a_file_holds_every_column_but_the_partitions_study(table: str) -> None:
    names = file_schema(table).names
    assert PARTITION_KEY not in names
    assert names == [name for name in table_schema(table).names if name != PARTITION_KEY]


def test_an_unknown_table_names_the_tables() -> None:
    with pytest.raises(ValueError) as error:
        table_schema("nope")
    assert one_line_error(error) == (
        "unknown table 'nope'; tables are runs, timers, iterations, memory, fits, decisions"
    )


@given(st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,40}", fullmatch=True))
def test_a_study_id_of_letters_digits_dots_underscores_and_dashes_is_taken(study: str) -> None:
    check_study(study)


@pytest.mark.parametrize("study", ["", ".hidden", "_x", "-x", "../up", "a/b", "a b", "é", None, 3])
def test_any_other_study_id_is_a_one_line_config_error(study: object) -> None:
    with pytest.raises(ConfigError, match=r"^study id must be letters, digits") as error:
        check_study(study)  # type: ignore[arg-type]
    assert one_line_error(error).endswith(f"got {study!r}")


def test_rows_become_a_frame_and_a_frame_stays_itself() -> None:
    frame = pd.DataFrame({"run_id": ["r"]})
    assert frame_of(frame) is frame
    rows = frame_of([{"run_id": "r", "pp": 2}, {"run_id": "s"}])
    assert rows["run_id"].tolist() == ["r", "s"] and rows["pp"].isna().tolist() == [False, True]


def test_rows_of_a_run_carry_its_id() -> None:
    assert with_run_id(pd.DataFrame({"ms": [1.0]}), "r1")["run_id"].tolist() == ["r1"]
    assert with_run_id(pd.DataFrame({"run_id": ["r1"]}), "r1")["run_id"].tolist() == ["r1"]
    with pytest.raises(ValueError, match=r"^rows given for run 'r1' name another run_id$"):
        with_run_id(pd.DataFrame({"run_id": ["r1", "r2"]}), "r1")


def test_to_arrow_casts_to_the_file_schema_and_sets_the_version() -> None:
    frame = pd.DataFrame({"run_id": ["r1", "r2"], "pp": [4, 2], "study": ["s", "s"]})
    table = to_arrow("runs", frame, "s")
    assert table.schema == file_schema("runs")
    assert table.column("schema_version").to_pylist() == [SCHEMA_VERSION] * 2
    assert table.column("pp").to_pylist() == [4, 2]
    assert table.column("layout").to_pylist() == [None, None]  # not given: null


@pytest.mark.parametrize(
    ("table", "rows", "message"),
    [
        ("runs", {"run_id": ["r"], "zeta": [1], "bogus": [2]}, "has no column(s) bogus, zeta"),
        ("runs", {"run_id": []}, "no rows to write to table 'runs'"),
        ("runs", {"run_id": ["r"], "study": ["t"]}, "rows for study 's' name another study"),
        ("runs", {"pp": [4]}, "'runs' column 'run_id' must not be null"),
        ("timers", {"run_id": ["r"], "timer": [None]}, "'timers' column 'timer' must not be null"),
    ],
)
def test_rows_that_do_not_fit_the_table_are_a_one_line_value_error(
    table: str, rows: dict[str, list[object]], message: str
) -> None:
    with pytest.raises(ValueError) as error:
        to_arrow(table, pd.DataFrame(rows), "s")
    assert not isinstance(error.value, ConfigError)
    assert one_line_error(error).endswith(message)


def test_a_value_of_the_wrong_type_names_its_column() -> None:
    with pytest.raises(ValueError, match=r"^table 'runs' column 'pp': ") as error:
        to_arrow("runs", pd.DataFrame({"run_id": ["r"], "pp": ["four"]}), "s")
    one_line_error(error)


def test_a_bad_study_is_refused_before_the_rows_are_looked_at() -> None:
    with pytest.raises(ConfigError, match="study id"):
        to_arrow("runs", pd.DataFrame({"bogus": []}), "../up")


def test_filters_match_equal_values_and_null_for_none() -> None:
    schema = file_schema("runs")
    rows = pd.DataFrame({"run_id": ["a", "b", "c"], "pp": [4, 2, 4], "layout": ["x", None, None]})
    data = ds.dataset(to_arrow("runs", rows, "s"))

    def run_ids(**equals: object) -> list[str]:
        return data.to_table(filter=where("runs", schema, equals)).column("run_id").to_pylist()

    assert run_ids(pp=4) == ["a", "c"]
    assert run_ids(pp=4, layout=None) == ["c"]
    assert run_ids(pp=4.0) == ["a", "c"]  # cast to the column's type
    assert where("runs", schema, {}) is None


def test_a_filter_on_no_column_or_of_the_wrong_type_is_one_line() -> None:
    schema = file_schema("runs")
    with pytest.raises(ValueError, match=r"^table 'runs' has no column 'bogus'$"):
        where("runs", schema, {"bogus": 1})
    with pytest.raises(ValueError, match=r"^filter pp='four': ") as error:
        where("runs", schema, {"pp": "four"})
    one_line_error(error)


def test_first_line_of_an_error() -> None:
    assert first_line(ValueError("one\ntwo")) == "one"
    assert first_line(KeyError()) == "KeyError"


def test_the_docs_list_each_tables_columns_as_the_store_declares_them() -> None:
    """docs/measure.md's table of tables names every column of ``store_tables.toml``, in its
    order (``study``, the partition, is said once for all)."""
    text = (TABLES_FILE.parents[2] / "docs/measure.md").read_text()
    for table, schema in TABLE_SCHEMAS.items():
        row = re.search(rf"^\| `{table}` \| (.*) \|$", text, re.M)
        assert row is not None, table
        listed = [re.sub(r"[*`]| \(.*", "", cell).strip() for cell in _cells(row[1])]
        assert listed == [n for n in schema.names if n not in ("study", "schema_version")]
    assert set(COLUMN_TYPES) == {"str", "int", "float"}


def _cells(row: str) -> list[str]:
    """The comma-separated names of a docs row, commas inside parentheses kept."""
    cells, depth, current = [], 0, ""
    for char in row:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            cells.append(current)
            current = ""
        else:
            current += char
    return [*cells, current]


def test_a_declaration_compares_equal_however_it_was_read():
    """A row to write, a row read back through pandas (ints with a null become floats, a null a
    NaN) and a claim's JSON give one declaration; it is what ingest refuses a log declared
    otherwise by."""
    written = {"model": "m", "layout": "Et*2|tL", "pp": 2, "vpp": 1, "tp": 1, "cp": 1, "ep": 1,
               "etp": 1, "dp": 1, "micro_batch_size": 1, "num_microbatches": None}  # fmt: skip
    read = {**written, "pp": np.float64(2.0), "num_microbatches": float("nan"), "other": 1}
    assert declaration(read) == declaration(json.loads(json.dumps(written))) == written
    assert declaration({**read, "pp": 2.5})["pp"] == 2.5
    assert set(DECLARATION) == set(DECLARED_COLUMNS)
