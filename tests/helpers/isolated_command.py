"""Run one command line as a user would meet it, but cheaply: in a child forked from a process
that has imported the commands once, under a memory limit and a time limit, in an empty folder.

The child is what ``python -m ray_layout`` would be: an uncaught exception prints its traceback
and exits 1; a run-away allocation meets ``RLIMIT_AS`` (a ``MemoryError``, so a traceback)
instead of the machine's OOM killer; a hang meets ``SIGALRM``. What the child wrote to stdout and
stderr, and any file it left in its working folder, come back to the test. No cluster is ever
started: where a command would start or join one (its settings all passed), the child stops
with ``REACHED_CLUSTER`` instead.
"""

from __future__ import annotations

import multiprocessing
import os
import resource
import signal
import sys
import tempfile
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ray_layout.model.sizing import GIB

Entry = Literal["main", "tune"]
MEMORY_BYTES = 2 * GIB  # on top of what the imported commands already map
SECONDS = 30
REACHED_CLUSTER = 86  # exit status: every check passed, the command went for a cluster
_PRELOAD = ["ray_layout.commands.main", "ray_layout.commands.tune", "ray_layout.runtime.local"]


@dataclass(frozen=True)
class Outcome:
    exit_code: int | None  # None: killed by a signal (the time limit)
    stdout: str
    stderr: str
    files_left: tuple[str, ...]  # what the command wrote into its (empty) working folder

    @property
    def stderr_lines(self) -> list[str]:
        """Lines as a terminal shows them: cut at newlines only (``str.splitlines`` also cuts
        at characters such as U+2028 that a user's value may hold)."""
        return self.stderr.removesuffix("\n").split("\n") if self.stderr else []

    @property
    def reached_cluster(self) -> bool:
        return self.exit_code == REACHED_CLUSTER


class _ClusterWouldStart(Exception):
    pass


def _no_cluster(*args: object, **kwargs: object) -> None:
    raise _ClusterWouldStart


def _forbid_clusters() -> None:
    """Every place a command starts or joins Ray (``plan --shards``, ``profile``, the tune)."""
    import ray_layout.commands.plan
    import ray_layout.commands.tune
    import ray_layout.runtime.local

    ray_layout.commands.plan._start_ray = _no_cluster
    ray_layout.commands.tune.connected = _no_cluster
    ray_layout.runtime.local.connected = _no_cluster


def _context() -> multiprocessing.context.BaseContext:
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(_PRELOAD)
    return context


def _virtual_memory_bytes() -> int:
    pages = int(Path("/proc/self/statm").read_text().split()[0])
    return pages * os.sysconf("SC_PAGE_SIZE")


def _child(entry: Entry, argv: list[str], workdir: str, out: str, err: str, limits: tuple) -> None:
    memory_bytes, seconds = limits
    os.chdir(workdir)
    for fd, path in ((1, out), (2, err)):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
    sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115 (the child ends with os._exit)
    sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
    address_space = _virtual_memory_bytes() + memory_bytes
    resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    signal.alarm(seconds)
    _forbid_clusters()
    try:
        if entry == "tune":
            from ray_layout.commands.tune import main
        else:
            from ray_layout.commands.main import main
        code = main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except _ClusterWouldStart:
        code = REACHED_CLUSTER
    except BaseException:  # as the interpreter does with an uncaught exception
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run_isolated(
    argv: Sequence[str],
    *,
    entry: Entry = "main",
    memory_bytes: int = MEMORY_BYTES,
    seconds: int = SECONDS,
) -> Outcome:
    """``python -m ray_layout ARGV`` (or ``python -m ray_layout.tune`` for ``entry="tune"``) in
    a fresh empty working folder; paths in ``argv`` should be absolute."""
    with tempfile.TemporaryDirectory() as scratch:
        workdir, out, err = (os.path.join(scratch, name) for name in ("cwd", "out", "err"))
        os.mkdir(workdir)
        child = _context().Process(
            target=_child, args=(entry, list(argv), workdir, out, err, (memory_bytes, seconds))
        )
        child.start()
        child.join(seconds + 10)
        if child.is_alive():
            child.kill()
            child.join()
        code = child.exitcode if child.exitcode is not None and child.exitcode >= 0 else None
        return Outcome(
            exit_code=code,
            stdout=Path(out).read_text(errors="replace") if os.path.exists(out) else "",
            stderr=Path(err).read_text(errors="replace") if os.path.exists(err) else "",
            files_left=tuple(sorted(os.listdir(workdir))),
        )
