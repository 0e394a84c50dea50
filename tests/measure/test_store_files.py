"""The one reader of the store's files: a part or claim cut short, garbage, empty, a folder or a
FIFO is one line naming the file and its fix, never a traceback or a read that blocks; a good one
reads back whole; every write is fsynced before its rename."""

from __future__ import annotations

import os
from pathlib import Path
from unittest import mock

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ray_layout.errors import MeasurementError
from ray_layout.measure.store_files import (
    PART_FIX,
    part_schema,
    part_table,
    read_json_object,
    write_json,
    write_parquet,
)

TABLE = pa.table({"run_id": ["r1", "r2"], "ms": [1.5, 2.5]})


def _good_part(folder: Path) -> Path:
    path = folder / "part-x.parquet"
    write_parquet(path, TABLE)
    return path


def test_a_good_part_reads_back_whole(tmp_path):
    path = _good_part(tmp_path)
    assert part_table(path).equals(TABLE)
    assert part_schema(path) == TABLE.schema


@pytest.mark.parametrize("damage", ["empty", "garbage", "truncated", "folder", "fifo", "missing"])
def test_a_damaged_part_is_one_line_naming_it_and_the_fix(tmp_path, damage):
    path = _good_part(tmp_path)
    good = path.read_bytes()
    path.unlink()
    if damage == "empty":
        path.write_bytes(b"")
    elif damage == "garbage":
        path.write_bytes(b'{"a": 1}\xff')
    elif damage == "truncated":
        path.write_bytes(good[: len(good) // 2])
    elif damage == "folder":
        path.mkdir()
    elif damage == "fifo":
        os.mkfifo(path)
    for read in (part_schema, part_table):
        with pytest.raises(MeasurementError) as error:
            read(path)
        message = str(error.value)
        assert message.startswith(f"{path}: the store cannot read it (")
        assert message.endswith(PART_FIX) and "\n" not in message


def test_a_json_object_reads_back_with_its_mtime_and_a_missing_one_is_none(tmp_path):
    path = tmp_path / "claim"
    assert read_json_object(path, "fix") is None
    write_json(path, {"token": "t", "n": 1})
    mtime, content = read_json_object(path, "fix")
    assert content == {"token": "t", "n": 1} and mtime == path.stat().st_mtime


def test_every_write_is_fsynced_before_it_is_renamed(tmp_path):
    synced = []
    real = os.fsync

    def fsync(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    with mock.patch.object(os, "fsync", fsync):
        write_json(tmp_path / ".a.tmp", {"a": 1})
        write_parquet(tmp_path / ".b.tmp", TABLE)
    assert synced == [str(tmp_path / ".a.tmp"), str(tmp_path / ".b.tmp")]


ANY_BYTES = st.one_of(
    st.binary(max_size=300),
    st.builds(lambda text: text.encode(), st.text(max_size=200)),
    st.sampled_from([b"null", b"{}", b'{"token": 1}', b"1e999", b'"x"', b"[" * 5000]),
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(content=ANY_BYTES)
def test_any_bytes_as_a_json_object_read_right_or_one_line(tmp_path, content):
    path = tmp_path / "claim"
    path.write_bytes(content)
    try:
        _, read = read_json_object(path, "the fix")
    except MeasurementError as error:
        message = str(error)
        assert message.startswith(f"{path}: ") and message.endswith("the fix")
        assert "\n" not in message
    else:
        assert isinstance(read, dict)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_any_spoiling_of_a_part_reads_right_or_is_one_line(tmp_path, data):
    """Cut short, bytes overwritten or appended: the rows come back whole, or one line."""
    path = _good_part(tmp_path)
    good = path.read_bytes()
    at = data.draw(st.integers(0, len(good)))
    how = data.draw(st.sampled_from(["cut", "overwrite", "append"]))
    noise = data.draw(st.binary(min_size=1, max_size=16))
    spoiled = {
        "cut": good[:at],
        "overwrite": good[:at] + noise + good[at + len(noise) :],
        "append": good + noise,
    }[how]
    path.write_bytes(spoiled)
    try:
        table = part_table(path)
    except MeasurementError as error:
        assert str(error).startswith(f"{path}: ") and "\n" not in str(error)
    else:
        assert table.num_columns <= 2
