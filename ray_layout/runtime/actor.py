"""One rank's process, owned by a Ray actor on the rank's GPU so that it dies with the actor.

The process is a child of its actor (never detached), started with the actor's environment plus
the rank's variables and unbuffered Python output (for timely heartbeats), at its node launcher's
niceness: Ray starts workers at nice 15, and a rank left there loses its cores to any nice-0
process on the node (its kernel launches and communication threads included), which a rank that
``torchrun`` started never would.  The actor keeps its
output in memory, never in a file: while it runs, the lines the driver asks about (the tail, the
first line of each failure class, Megatron's iteration lines for live watching); at the end, the
whole log parsed on this node (:meth:`RankProcess.finish`), returned through Ray, so the driver
needs no shared file system.
"""

from __future__ import annotations

import collections
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping

import ray

from ray_layout.errors import ConfigError
from ray_layout.measure.logs import ITERATION_LINE_START
from ray_layout.runtime.failures import MAX_LINE, RankStatus, failure_mark
from ray_layout.runtime.outputs import RankOutput, rank_output

_TAIL_LINES = 50


class RankProcess:
    """One rank's subprocess, owned by the actor it runs in so that it dies with it."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[str] | None = None
        self._lock = threading.Lock()
        self._tail: collections.deque[str] = collections.deque(maxlen=_TAIL_LINES)
        self._marks: dict[str, str] = {}
        self._iteration_lines: list[str] = []
        self._lines: list[str] = []
        self._name = "rank"
        self._started = self._last_beat = 0.0
        self._exited: float | None = None
        self._reader: threading.Thread | None = None

    def where(self) -> tuple[str, list[int], str]:
        """(node id, sorted GPU ids, node IP): node ids, since simulated nodes share an IP."""
        context = ray.get_runtime_context()
        return context.get_node_id(), sorted(ray.get_gpu_ids()), ray.util.get_node_ip_address()

    def free_port(self) -> int:
        """A port free on this node now, for rank 0's rendezvous."""
        with socket.socket() as sock:
            sock.bind(("", 0))
            return sock.getsockname()[1]

    def start(self, argv: list[str], env: Mapping[str, str], name: str) -> int:
        """Launch the rank with this worker's environment updated by ``env`` (and unbuffered
        Python output, for timely heartbeats); ``name`` (``<attempt>/rank-<r>``) names its log
        in parse errors.  Returns its pid."""
        self._name = name
        try:
            self._proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1", **env},
                text=True,
                errors="replace",
            )
        except OSError as exc:
            raise ConfigError(f"cannot launch {argv[0]!r}: {exc.strerror}") from None
        kept = take_niceness(self._proc.pid, launcher_niceness())
        if kept:
            print(f"{name}: {kept}", file=sys.stderr)
        self._started = self._last_beat = time.monotonic()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        threading.Thread(target=self._wait, daemon=True).start()
        return self._proc.pid

    def poll(self) -> RankStatus:
        assert self._proc is not None
        with self._lock:
            now = time.monotonic()
            return RankStatus(
                pid=self._proc.pid,
                returncode=self._proc.returncode if self._exited is not None else None,
                exit_after_s=None if self._exited is None else self._exited - self._started,
                idle_s=now - self._last_beat,
                marks=dict(self._marks),
                tail=tuple(self._tail),
            )

    def iteration_lines(self, start: int) -> list[str]:
        """Megatron's iteration lines this rank printed, from the ``start``-th on."""
        with self._lock:
            return self._iteration_lines[start:]

    def stop(self, grace_s: float) -> RankStatus | None:
        """SIGTERM, ``grace_s`` to exit, then SIGKILL; the rank's final status (None if it
        never started)."""
        if self._proc is None:
            return None
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        assert self._reader is not None
        self._reader.join(timeout=2.0)  # a grandchild may hold the pipe open
        with self._lock:
            self._exited = self._exited or time.monotonic()
        return self.poll()

    def finish(self, grace_s: float) -> RankOutput | None:
        """Stop the rank (as :meth:`stop`) and return everything it printed, parsed here, on
        its own node: a rank that died mid-run still returns what it logged before."""
        if self.stop(grace_s) is None:
            return None
        with self._lock:
            text = "".join(self._lines)
        return rank_output(text, self._name)

    def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            with self._lock:
                self._lines.append(line)
            self._see(line.rstrip("\n")[:MAX_LINE])

    def _see(self, line: str) -> None:
        mark = failure_mark(line)
        with self._lock:
            self._tail.append(line)
            if ITERATION_LINE_START.search(line):
                self._last_beat = time.monotonic()
                self._iteration_lines.append(line)
            if mark and mark not in self._marks:
                self._marks[mark] = line

    def _wait(self) -> None:
        assert self._proc is not None
        self._proc.wait()
        with self._lock:
            self._exited = self._exited or time.monotonic()


def launcher_niceness() -> int:
    """The niceness of the process that started this worker (the node's raylet), which is what
    a rank started by hand on the node would have."""
    try:
        return os.getpriority(os.PRIO_PROCESS, os.getppid())
    except OSError:
        return 0


def take_niceness(pid: int, niceness: int) -> str | None:
    """Lower process ``pid``'s niceness to ``niceness`` (a higher one is left alone); why not,
    when the process may not (raising a priority needs CAP_SYS_NICE)."""
    current = os.getpriority(os.PRIO_PROCESS, pid)
    if current <= niceness:
        return None
    try:
        os.setpriority(os.PRIO_PROCESS, pid, niceness)
    except PermissionError:
        return (
            f"runs at nice {current} (Ray's worker niceness), not {niceness} as started by hand: "
            "raising a priority needs CAP_SYS_NICE, so other processes on the node come first"
        )
    return None
