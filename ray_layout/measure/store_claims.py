"""Claims: which process stores a run, when processes ingest the same log at once.

A claim is ``<root>/_claims/<study>/<sha256 of the run's content hash, else its run id>``, a
JSON object with the writer's token, host, pid, process start time and the run's declaration
(what its ``runs`` row says it ran: layout, sizes, micro-batches), so that a process that loses
the claim can tell "the same run, being stored" from "this log declared otherwise".  It is
created whole in one step (a fsynced temporary file hard-linked into place, which fails if the
claim exists, like ``O_CREAT | O_EXCL``).

A claim whose writer is gone (same host: its pid is dead, or reused by a newer process) or that
is older than the store's stale timeout (the only test for a writer on another host) is taken
over: of all writers that find it dead, the one that creates its ``.taken-<token>`` marker
first replaces it, so it is taken over once.
"""

from __future__ import annotations

import hashlib
import os
import re
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ray_layout.errors import ConfigError, quoted
from ray_layout.measure.store_files import damaged, fsync_dir, read_json_object, write_json

HOST = socket.gethostname()
TOKEN = re.compile(r"[0-9a-f]{32}")  # uuid4().hex: it names the marker file, so never a path
ATTEMPTS = 50  # reads of a claim another writer is taking over, 10 ms apart
CLAIM_FIX = "if no ingest into this store is running, delete the file and run again"


@dataclass(frozen=True)
class Claimed:
    """The outcome of claiming a run: ``previous`` is set when we own it (the token of the dead
    claim taken over, "" for a new one); otherwise ``holder`` is the live writer's claim (None
    when none could be read: the claim kept changing hands)."""

    previous: str | None
    holder: Mapping[str, Any] | None = None


def claim_path(root: Path, study: str, key: str) -> Path:
    """Hashed, so any content hash or run id makes a safe file name."""
    return root / "_claims" / study / hashlib.sha256(key.encode()).hexdigest()


def read_claim(claim: Path) -> tuple[float, dict[str, Any]] | None:
    """(mtime, content) of a claim, None when there is none; a damaged one is one error."""
    state = read_json_object(claim, CLAIM_FIX)
    if state is not None and not TOKEN.fullmatch(str(state[1].get("token"))):
        raise damaged(claim, f"no writer's token in {quoted(state[1])}", CLAIM_FIX)
    return state


def acquire(claim: Path, token: str, declaration: Mapping[str, Any], stale_s: float) -> Claimed:
    """Own the claim under ``token``, or say who holds it."""
    temp = claim.with_name(f".{claim.name}.{token}.tmp")
    owner = {
        "token": token,
        "host": HOST,
        "pid": os.getpid(),
        "started": process_start(os.getpid()),
        "declaration": dict(declaration),
    }
    try:
        claim.parent.mkdir(parents=True, exist_ok=True)
        write_json(temp, owner)
        for _ in range(ATTEMPTS):
            try:
                os.link(temp, claim)
                fsync_dir(claim.parent)
                return Claimed("")
            except FileExistsError:
                state = read_claim(claim)
            if state is None:
                continue  # removed since (store rm): claim it afresh
            claimed = _take_over(claim, temp, state, stale_s)
            if claimed is not None:
                return claimed
            time.sleep(0.01)  # another writer is taking the dead claim over: read it again
        return Claimed(None)
    except OSError as exc:  # a path the pre-check could not see through, a full disk
        raise ConfigError(
            f"{claim.parent}: cannot write the store ({exc.strerror or exc})"
        ) from None
    finally:
        temp.unlink(missing_ok=True)


def _take_over(
    claim: Path, temp: Path, state: tuple[float, dict[str, Any]], stale_s: float
) -> Claimed | None:
    """Ours when the claim is dead and we are first to take it over; the holder when it is
    alive; None when another writer is taking it over now."""
    modified, owner = state
    if not writer_gone(owner) and time.time() - modified <= stale_s:
        return Claimed(None, owner)
    marker = claim.with_name(f"{claim.name}.taken-{owner['token']}")
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return None
    os.replace(temp, claim)
    fsync_dir(claim.parent)
    return Claimed(owner["token"])


def holds(claim: Path, token: str) -> bool:
    state = read_claim(claim)
    return state is not None and state[1]["token"] == token


def _proc_stat(pid: int) -> list[str] | None:
    """Linux's /proc/<pid>/stat fields from the state on (the name before may hold spaces)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def process_start(pid: int) -> str | None:
    """When a process started (clock ticks since boot), so that a new process that reuses a
    dead writer's pid is not taken for it; None where /proc has no answer."""
    fields = _proc_stat(pid)
    return None if fields is None else fields[19]


def writer_gone(owner: Mapping[str, Any]) -> bool:
    """Whether a claim's writer has exited (a zombie has): known only for a writer on this
    host."""
    pid = owner.get("pid")
    if owner.get("host") != HOST or type(pid) is not int or not 0 < pid < 1 << 22:
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
