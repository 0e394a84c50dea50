"""Claims: created whole and durable, held by a live writer with its declaration, taken over from
a dead one once, and a damaged one is one line naming it and the fix."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from unittest import mock

import pytest

from ray_layout.errors import MeasurementError
from ray_layout.measure import store_claims, store_files
from ray_layout.measure.store_claims import (
    CLAIM_FIX,
    HOST,
    acquire,
    claim_path,
    holds,
    read_claim,
    writer_gone,
)

DECLARED = {"layout": "Et*2|tL", "pp": 2}


def _claim(tmp_path: Path) -> Path:
    return claim_path(tmp_path, "s", "content-hash")


def _dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_a_new_claim_is_ours_and_holds_our_declaration(tmp_path):
    claim, token = _claim(tmp_path), uuid.uuid4().hex
    assert acquire(claim, token, DECLARED, 600.0).previous == ""
    _, owner = read_claim(claim)
    assert owner["token"] == token and owner["declaration"] == DECLARED
    assert owner["host"] == HOST and owner["pid"] == os.getpid()
    assert holds(claim, token) and not holds(claim, uuid.uuid4().hex)
    assert [p.name for p in claim.parent.iterdir()] == [claim.name]  # no temporary file left


def test_a_live_writers_claim_is_lost_with_its_declaration(tmp_path):
    claim = _claim(tmp_path)
    acquire(claim, uuid.uuid4().hex, DECLARED, 600.0)
    lost = acquire(claim, uuid.uuid4().hex, {"layout": "Et|t*2L", "pp": 2}, 600.0)
    assert lost.previous is None and lost.holder["declaration"] == DECLARED


def test_a_dead_writers_claim_is_taken_over_once(tmp_path):
    claim, first = _claim(tmp_path), uuid.uuid4().hex
    acquire(claim, first, DECLARED, 600.0)
    owner = json.loads(claim.read_text())
    claim.write_text(json.dumps(owner | {"pid": _dead_pid()}))
    second = uuid.uuid4().hex
    assert acquire(claim, second, DECLARED, 600.0).previous == first
    assert holds(claim, second)
    assert (claim.parent / f"{claim.name}.taken-{first}").exists()


def test_the_claim_is_fsynced_before_it_is_linked_and_its_folder_after(tmp_path):
    claim, events = _claim(tmp_path), []
    real_fsync, real_link = os.fsync, os.link

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def link(source, target):
        events.append(("link", str(target)))
        real_link(source, target)

    with mock.patch.object(os, "fsync", fsync), mock.patch.object(os, "link", link):
        acquire(claim, uuid.uuid4().hex, DECLARED, 600.0)
    kinds = [(kind, Path(path).name if kind == "link" else path) for kind, path in events]
    assert kinds[0][0] == "fsync" and kinds[0][1].endswith(".tmp")  # the whole file first
    assert kinds[1] == ("link", claim.name)
    assert kinds[2] == ("fsync", str(claim.parent))  # then the new name itself


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (b"", "empty"),
        (b'{"token": "ab', "not JSON"),
        (b"\xff\xfe garbage", "not JSON"),
        (b"[1, 2]", "not a JSON object"),
        (b'{"host": "h"}', "no writer's token"),
        (b'{"token": "../../table=runs/x"}', "no writer's token"),
        (b"[" * 20_000 + b"]" * 20_000, "not JSON"),
        (b" " * (store_files.CLAIM_LIMIT + 1), "over 65,536 bytes"),
        ("folder", "a folder"),
        ("fifo", "not a regular file"),
    ],
)
def test_a_damaged_claim_is_one_line_naming_it_and_the_fix(tmp_path, damage, reason):
    claim = _claim(tmp_path)
    claim.parent.mkdir(parents=True)
    if damage == "folder":
        claim.mkdir()
    elif damage == "fifo":
        os.mkfifo(claim)
    else:
        claim.write_bytes(damage)
    for attempt in (
        lambda: acquire(claim, uuid.uuid4().hex, DECLARED, 600.0),
        lambda: holds(claim, "0" * 32),
    ):
        with pytest.raises(MeasurementError) as error:
            attempt()
        message = str(error.value)
        assert message.startswith(f"{claim}: the store cannot read it ({reason}")
        assert message.endswith(CLAIM_FIX) and "\n" not in message


@pytest.mark.parametrize("pid", [0, -1, 1 << 40, "12", None, True])
def test_a_claims_odd_pid_is_no_writer_known_gone(pid):
    """Nothing is signalled for a pid that is no process's (0 and -1 name process groups)."""
    with mock.patch.object(os, "kill", side_effect=AssertionError("signalled")):
        assert writer_gone({"host": HOST, "pid": pid}) is False


def test_a_writer_on_another_host_is_never_known_gone():
    assert writer_gone({"host": "elsewhere", "pid": _dead_pid()}) is False
    assert writer_gone({"host": HOST, "pid": _dead_pid()}) is True
    assert store_claims.process_start(os.getpid()) is not None
