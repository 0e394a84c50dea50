"""The one reader and writer of the cost store's files: Parquet parts and JSON claims.

Every read of a store file goes through here, so a part that is cut short, holds garbage or is
a folder, a FIFO or a device in place of a file is one :class:`MeasurementError` naming the file
and what repairs it, never a traceback (and never a read that blocks on a FIFO).  Every write is
a temporary file fsynced before it is renamed or linked into place, and the folder fsynced
after, so a crash leaves a whole file or none.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import pyarrow as pa
import pyarrow.parquet as pq

from ray_layout.errors import MeasurementError, clipped, quoted

PART_FIX = (
    "move the damaged file out of the store and run again (its rows are lost, the rest is kept)"
)
CLAIM_LIMIT = 1 << 16  # bytes: a claim is one short JSON object


def damaged(path: str | Path, reason: str, fix: str) -> MeasurementError:
    """The one-line error for a store file that cannot be used: the file, why, and the fix."""
    return MeasurementError(f"{path}: the store cannot read it ({clipped(reason, 200)}); {fix}")


def reason_of(exc: BaseException) -> str:
    text = str(exc)
    return text.splitlines()[0] if text.strip() else type(exc).__name__


def _regular(path: str | Path, fix: str) -> os.stat_result:
    """The file's status, refused unless it is a regular file (stat never blocks on a FIFO)."""
    try:
        status = os.stat(path)
    except OSError as exc:
        raise damaged(path, exc.strerror or reason_of(exc), fix) from None
    if not stat.S_ISREG(status.st_mode):
        raise damaged(path, _kind(status), fix)
    return status


def _kind(status: os.stat_result) -> str:
    return "a folder" if stat.S_ISDIR(status.st_mode) else "not a regular file"


def part_schema(path: str | Path) -> pa.Schema:
    """A Parquet part's schema, read from its footer alone."""
    _regular(path, PART_FIX)
    try:
        return pq.read_schema(path)
    except (OSError, pa.ArrowException) as exc:
        raise damaged(path, reason_of(exc), PART_FIX) from None


def part_table(path: str | Path) -> pa.Table:
    """A Parquet part's rows as written, without the study its folder names."""
    _regular(path, PART_FIX)
    try:
        return pq.read_table(path, partitioning=None)
    except (OSError, pa.ArrowException) as exc:
        raise damaged(path, reason_of(exc), PART_FIX) from None


def read_json_object(path: Path, fix: str) -> tuple[float, dict[str, Any]] | None:
    """(mtime, content) of a small JSON object file through one handle, so both describe the
    same file; None when there is no file.  Anything else in its place is damage."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO opens without a writer
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise damaged(path, exc.strerror or reason_of(exc), fix) from None
    try:
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode):
            raise damaged(path, _kind(status), fix)
        data = os.read(fd, CLAIM_LIMIT + 1)
    except OSError as exc:
        raise damaged(path, exc.strerror or reason_of(exc), fix) from None
    finally:
        os.close(fd)
    if len(data) > CLAIM_LIMIT:
        raise damaged(path, f"over {CLAIM_LIMIT:,} bytes", fix)
    try:
        content = json.loads(data.decode())
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise damaged(path, f"not JSON: {reason_of(exc)}" if data else "empty", fix) from None
    if not isinstance(content, dict):
        raise damaged(path, f"not a JSON object: {quoted(content)}", fix)
    return status.st_mtime, content


def write_synced(path: Path, write: Callable[[IO[bytes]], None]) -> None:
    """Write a (temporary) file and fsync it, so a rename or link of it never names a file whose
    blocks a crash could lose."""
    with open(path, "wb") as file:
        write(file)
        file.flush()
        os.fsync(file.fileno())


def write_json(path: Path, content: dict[str, Any]) -> None:
    write_synced(path, lambda file: file.write(json.dumps(content).encode()))


def write_parquet(path: Path, data: pa.Table) -> None:
    write_synced(path, lambda file: pq.write_table(data, file))


def fsync_dir(folder: Path) -> None:
    """Make a rename durable: the new directory entry lives in the folder's own blocks."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
