"""The flag table of the Megatron the cluster runs: ``pretrain_gpt.py --help`` on one worker,
parsed (``ray_layout.model.megatron_help_table``) and cached in the store once per study.

The checkout is on the workers, not necessarily on the driver, so the help is read by a Ray task.
Megatron's ``--help`` imports torch and megatron-core before printing, which takes tens of seconds
on a cold node; no GPU is needed.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launchers.megatron import ARGUMENTS_SOURCE
from ray_layout.errors import RunFailure, exception_line
from ray_layout.measure.store import CostStore
from ray_layout.measure.store_files import damaged, fsync_dir, reason_of, write_json
from ray_layout.model.megatron_args import FlagTable, check_arguments, megatron_flag_table
from ray_layout.model.megatron_help_table import merge_with_bundled, parse_help
from ray_layout.runtime.layout_runs import Backend

HELP_TIMEOUT_S = 300.0
BUNDLED = "the bundled megatron-core 0.16.1 table"


@dataclass(frozen=True)
class ClusterFlags:
    """option string -> argparse entry of the Megatron the runs use, and where it came from."""

    flags: FlagTable
    source: str  # "the flag table of <python> <megatron-path>/pretrain_gpt.py", or BUNDLED
    note: str | None = None  # why the bundled table stands in, for the user

    def check(self, argvs: Sequence[Sequence[str]]) -> None:
        """Each argument list against this table: one line for a flag it does not know."""
        for argv in argvs:
            check_arguments(argv, f"{ARGUMENTS_SOURCE} ({self.source})", self.flags)


def cluster_flag_table(backend: Backend, store: CostStore, study: str) -> ClusterFlags:
    """The cluster's table: from the store when this study cached it for the same checkout, else
    read on a worker and cached.  When no worker can print the help, the bundled table with a
    note: the runs would tell the same story later, this only loses the early check."""
    path = store.megatron_flags_path(study)
    where = f"{backend.python} {backend.megatron_path}/pretrain_gpt.py"
    source = f"the flag table of {where}"
    cached = _read_cache(path)
    if cached is not None and cached.get("command") == where:
        return ClusterFlags(merge_with_bundled(cached["entries"], megatron_flag_table()), source)
    try:
        entries = parse_help(help_text(backend))
        if not entries:
            raise RunFailure("its --help lists no flags")
    except RunFailure as exc:
        note = f"cannot read the flags of {where} ({exc}); checking against {BUNDLED}"
        return ClusterFlags(megatron_flag_table(), BUNDLED, note)
    write_cache(path, {"command": where, "entries": entries})
    return ClusterFlags(merge_with_bundled(entries, megatron_flag_table()), source)


def write_cache(path: Path, content: dict[str, Any]) -> None:
    """Keep the table in the store as its other parts are kept: a synced temporary file renamed
    over the old one, the folder synced; what stands in the way is one line naming it."""
    temp = path.with_suffix(f".{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json(temp, content)
        temp.replace(path)
        fsync_dir(path.parent)
    except OSError as exc:
        temp.unlink(missing_ok=True)
        fix = "remove it: the next tune reads the cluster's flags again"
        raise damaged(path, exc.strerror or reason_of(exc), fix) from None


def help_text(backend: Backend) -> str:
    """``pretrain_gpt.py --help`` as printed on one worker; :class:`RunFailure` when it fails."""
    import ray

    task = ray.remote(num_cpus=1, max_retries=0)(_run_help)
    command = [backend.python, f"{backend.megatron_path}/pretrain_gpt.py", "--help"]
    try:
        text, error = ray.get(task.remote(command, HELP_TIMEOUT_S), timeout=HELP_TIMEOUT_S + 60)
    except Exception as exc:
        text, error = None, exception_line(exc)
    if text is None:
        raise RunFailure(error)
    return text


def _run_help(command: list[str], timeout_s: float) -> tuple[str | None, str]:
    """Runs on a worker: (the help, "") or (None, why not).  A wide terminal keeps every option
    on a line of its own."""
    environment = {**os.environ, "COLUMNS": "1000"}
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout_s, env=environment, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, exception_line(exc)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return None, f"exit {done.returncode}: {last[:300]}"
    return done.stdout, ""


def _read_cache(path: Path) -> dict[str, Any] | None:
    try:
        cached = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return cached if isinstance(cached, dict) else None
