"""Run one Megatron-style training command as a multi-node job on a Ray cluster.

A thin imperative shell around pure helpers.  Pure: :func:`rank_order` (which placed GPU gets
which global rank), :func:`check_placement`, :func:`megatron_coordinates`, :func:`device_env` and
:func:`classify_exit` (why a run failed).  Shell: :func:`run_on_cluster` places one run, starts
one rank process per GPU, watches it and cleans up on every path; :func:`run_many` runs several
side by side; :func:`start_local_cluster` simulates a multi-node GPU cluster on one machine;
:func:`connected` joins a running cluster, or starts such a local one, for one command.

How a run is placed (``/work/shared/docs/ray.md``): one placement group with one bundle per
node (``{"GPU": g, "CPU": c}``, STRICT_SPREAD; one bundle per GPU with STRICT_SPREAD can never be
placed), one actor per rank on its node's bundle, ``max_restarts=0`` since a restarted rank
cannot rejoin a NCCL communicator.  Ray does not promise which GPU lands where, so every actor
reports (node id, GPU id) and :func:`rank_order` fills ranks node by node: with Megatron's order
tp-cp-ep-dp-pp (PP outermost) TP peers share a node and PP stages are contiguous blocks.

Each rank is a subprocess of its actor (never detached, so it dies with the actor), launched like
torchrun does: RANK, WORLD_SIZE, MASTER_ADDR (rank 0's node IP), MASTER_PORT (a free port found on
rank 0's node), CUDA_VISIBLE_DEVICES listing every GPU of the run on the rank's node and
LOCAL_RANK its own among them: a process that sees only its own GPU cannot use CUDA IPC, so NCCL
falls back from NVLink P2P to shared memory.  Its output goes line by line to
``log_dir/<attempt id>/rank-<r>.log`` on the rank's node (use a shared file system to read them
in one place).  The first attempt's id is the run id, retry n's is ``<run id>-retry<n>``.

Failure classes (:data:`RETRIED` are retried up to ``max_retries`` times):

- ``oom``: a rank printed "CUDA out of memory" or "OutOfMemoryError"; status infeasible.
- ``invalid-config``: a :class:`ConfigError` before launch, a rank exited with 2 or printed an
  argparse ``prog: error:`` line; status error.
- ``infeasible-placement``: the placement group was not placed within ``placement_timeout_s``
  (the cluster is too small, or stayed too busy); status infeasible.
- ``node-lost``: a rank's actor died (its node or worker process went away).
- ``killed``: a rank died of a signal nobody here sent (host OOM killer, preemption).
- ``comm``: a rank printed a NCCL/gloo timeout or a lost connection (a peer died or hung).
- ``hang``: no Megatron iteration line on any rank for ``heartbeat_s`` (counted from launch).
- ``timeout``: the run took longer than ``timeout_s``.
- ``crash``: a rank exited non-zero for any other reason (a bug: not retried).
- ``early-stop``: the caller's watch (an A/B test) stopped the run; status stopped.
- ``cancelled``: the driver was interrupted (Ctrl-C, SIGTERM); status cancelled.

A cluster started by hand (``RAY_AUTH_MODE=disabled`` on every command, or ``RAY_AUTH_MODE=token``
exported for the CLI), here with two simulated 4-GPU workers on one machine; start the workers
one after the other (started at once, one timed out here)::

    RAY_AUTH_MODE=disabled ray start --head --port 6379 --num-cpus 0 --num-gpus 0 \\
        --include-dashboard false --object-store-memory 100000000 --block &
    RAY_AUTH_MODE=disabled ray start --address 127.0.0.1:6379 --num-cpus 4 --num-gpus 4 \\
        --object-store-memory 100000000 --resources '{"worker-1": 1}' --block &
    RAY_AUTH_MODE=disabled ray start --address 127.0.0.1:6379 --num-cpus 4 --num-gpus 4 \\
        --object-store-memory 100000000 --resources '{"worker-2": 1}' --block &

then ``ray.init(address="127.0.0.1:6379")`` in the driver.  With ``--block`` each node stops,
with all its processes, when its ``ray start`` gets SIGTERM: stop workers first, then the head,
by their pids; never ``ray stop``, which kills every Ray process on the host.  On a real cluster
drop ``--num-gpus`` on workers (Ray detects the GPUs) and the custom resources.
"""

from __future__ import annotations

import collections
import logging
import os
import re
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray
from ray.cluster_utils import Cluster
from ray.exceptions import GetTimeoutError, RayActorError
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from ray_layout.errors import ConfigError
from ray_layout.measure.store import CostStore
from ray_layout.model.spec import ParallelConfig

logger = logging.getLogger(__name__)

Device = tuple[str, int]  # (Ray node id, GPU id on that node)
RankEnv = Callable[[int, int, str, int, list[int]], Mapping[str, str]]
# Called at every poll with the attempt id and the iteration lines the last rank printed since
# the previous call; a returned text stops the run early (class "early-stop") with it as reason.
Watch = Callable[[str, list[str]], str | None]

FINISHED, FAILED, INFEASIBLE, ERROR = "finished", "failed", "infeasible", "error"
STOPPED, CANCELLED = "stopped", "cancelled"
RETRIED = frozenset({"node-lost", "killed", "comm", "hang", "timeout"})
# The runs columns a caller may fill in for the store; the shell sets the others it knows.
LABEL_COLUMNS = frozenset({"model", "model_hash", "layout", "backend", "hardware", "source"})
_STATUS_OF = {
    "oom": INFEASIBLE,
    "infeasible-placement": INFEASIBLE,
    "invalid-config": ERROR,
    "early-stop": STOPPED,
    "cancelled": CANCELLED,
}

_POLL_S = 0.25  # how often the driver asks every rank for its progress
_RPC_TIMEOUT_S = 30.0  # longest wait for one answer of a live actor
_SETTLE_S = 2.0  # after a rank fails, how long its peers get to print why they fail too
_TAIL_LINES = 50
_MAX_LINE = 500  # characters kept of one line in errors and tails

# Megatron's iteration line (docs/megatron.md section 4), as ray_layout.measure.logs reads it.
_ITERATION_LINE = re.compile(r"\biteration\s+\d+\s*/\s*\d+\s*\|")
_MARKS = (
    ("oom", re.compile(r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory")),
    ("invalid-config", re.compile(r"^\S+: error: |\bConfigError\b")),
    (
        "comm",
        re.compile(
            r"Watchdog caught collective operation timeout|Connection closed by peer"
            r"|Connection reset by peer|NCCL error|NCCL communicator was aborted"
            r"|ncclRemoteError|ncclSystemError|DistNetworkError|DistBackendError"
            r"|gloo.*Timed out|Timed out waiting.*for (send|recv)"
        ),
    ),
)
_CANCELLED = "cancelled: the driver was interrupted"
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_LOCAL_CLUSTER_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}


# ---------------------------------------------------------------------------------------------
# Pure helpers


def check_placement(parallel: ParallelConfig, gpus_per_node: Mapping[str, int]) -> None:
    """Raise :class:`ConfigError` unless ranks filled node by node keep every TP (and expert TP)
    group inside one node: each node's GPU count must be a multiple of TP and ETP.

    ``gpus_per_node`` maps each node (any key) to the GPUs the run has there.  CP, EP, DP and PP
    groups may span nodes: Megatron runs them over the network in practice.
    """
    p = parallel
    world = p.world_size
    if min(p.tp, p.pp, p.cp, p.dp, p.ep, p.etp) < 1:
        raise ConfigError(f"parallel sizes must be >= 1, got {p}")
    if world % (p.etp * p.ep * p.pp):
        raise ConfigError(f"world size {world} is not divisible by ETP x EP x PP")
    placed = sum(gpus_per_node.values())
    if placed != world:
        raise ConfigError(f"the run has {placed} GPUs for a world size of {world}")
    for node, gpus in gpus_per_node.items():
        for name, size in (("TP", p.tp), ("ETP", p.etp)):
            if gpus % size:
                raise ConfigError(
                    f"{name}={size} groups do not fit in nodes: node {node} has {gpus} GPUs of "
                    f"this run, not a multiple of {size}"
                )


def rank_order(devices: Sequence[Device], parallel: ParallelConfig) -> list[Device]:
    """The placed devices in global rank order: sorted by (node, GPU), so ranks fill node by
    node and, since Megatron's order is tp-cp-ep-dp-pp, TP peers share a node and PP stages
    are contiguous blocks of nodes.  Raises :class:`ConfigError` when that cannot hold."""
    if len(set(devices)) != len(devices):
        raise ConfigError(f"a GPU is placed twice: {sorted(devices)}")
    check_placement(parallel, collections.Counter(node for node, _ in devices))
    return sorted(devices)


def megatron_coordinates(rank: int, parallel: ParallelConfig) -> dict[str, int]:
    """Where a global rank sits in Megatron's groups (order tp-cp-ep-dp-pp): its tp, cp, dp and
    pp ranks, and in the expert layers its etp, ep and edp (expert data-parallel) ranks."""
    p = parallel
    if not 0 <= rank < p.world_size:
        raise ConfigError(f"rank {rank} is outside the world of {p.world_size}")
    if p.world_size % (p.etp * p.ep * p.pp):
        raise ConfigError(f"world size {p.world_size} is not divisible by ETP x EP x PP")
    tp, rest = rank % p.tp, rank // p.tp
    cp, rest = rest % p.cp, rest // p.cp
    dp, pp = rest % p.dp, rest // p.dp
    etp, rest = rank % p.etp, rank // p.etp
    ep, edp = rest % p.ep, (rest // p.ep) % p.expert_dp
    return {"tp": tp, "cp": cp, "dp": dp, "pp": pp, "etp": etp, "ep": ep, "edp": edp}


def device_env(ordered: Sequence[Device], rank: int) -> dict[str, str]:
    """torchrun's device variables for one rank: every GPU of the run on its node visible (so
    NCCL can use CUDA IPC between them), LOCAL_RANK its own position among them."""
    node, gpu = ordered[rank]
    local = sorted(g for n, g in ordered if n == node)
    return {
        "CUDA_VISIBLE_DEVICES": ",".join(map(str, local)),
        "LOCAL_RANK": str(local.index(gpu)),
        "LOCAL_WORLD_SIZE": str(len(local)),
    }


def megatron_rank_env(
    rank: int, world: int, master_addr: str, master_port: int, gpu_ids: list[int]
) -> dict[str, str]:
    """The default per-rank variables: what torchrun gives ``pretrain_gpt.py`` besides the
    device ones (``gpu_ids``, the rank's own GPUs, are already in CUDA_VISIBLE_DEVICES)."""
    return {
        "RANK": str(rank),
        "WORLD_SIZE": str(world),
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
    }


def failure_mark(line: str) -> str | None:
    """The failure class one output line proves, if any."""
    return next((name for name, pattern in _MARKS if pattern.search(line)), None)


@dataclass(frozen=True)
class RankStatus:
    """One rank process as its actor sees it."""

    pid: int
    returncode: int | None  # None while it runs
    exit_after_s: float | None  # seconds from launch to exit
    idle_s: float  # seconds since launch or its last iteration line
    marks: Mapping[str, str]  # failure class -> first line that showed it
    tail: tuple[str, ...]  # its last lines


def classify_exit(statuses: Sequence[RankStatus]) -> tuple[str, str]:
    """Failure class and one-line error of a run in which some rank exited non-zero.

    What a rank printed wins over how it exited: an OOM or a configuration error anywhere is the
    cause, whatever its peers did next.  Then a rank killed by a signal without a communication
    error of its own (its peers' lost connections follow from it), then any communication error,
    else the first rank that failed crashed.
    """
    for name in ("oom", "invalid-config"):
        for rank, status in enumerate(statuses):
            if name in status.marks:
                return name, _one_line(f"rank {rank}: {status.marks[name]}")
    failed = [(r, s) for r, s in enumerate(statuses) if s.returncode not in (None, 0)]
    for rank, status in failed:
        if status.returncode == 2:
            return "invalid-config", _one_line(f"rank {rank} exited 2: {_last(status)}")
    for rank, status in failed:
        if status.returncode < 0 and "comm" not in status.marks:
            name = signal.Signals(-status.returncode).name
            return "killed", _one_line(f"rank {rank} killed by {name}: {_last(status)}")
    for rank, status in failed:
        if "comm" in status.marks:
            return "comm", _one_line(f"rank {rank}: {status.marks['comm']}")
    rank, status = min(failed, key=lambda item: (item[1].exit_after_s or 0.0, item[0]))
    return "crash", _one_line(f"rank {rank} exited {status.returncode}: {_last(status)}")


def attempt_id(run_id: str, attempt: int) -> str:
    """The id (and log folder) of one attempt: the run id first, then ``-retry<n>``."""
    return run_id if attempt == 1 else f"{run_id}-retry{attempt - 1}"


def _last(status: RankStatus) -> str:
    return status.tail[-1] if status.tail else "(no output)"


def _one_line(text: str) -> str:
    return " ".join(text.split())[:_MAX_LINE]


def _node_bundles(world: int, gpus_per_node: int) -> list[int]:
    """GPUs per node bundle: full nodes, the rest on one more node."""
    full, rest = divmod(world, gpus_per_node)
    return [gpus_per_node] * full + ([rest] if rest else [])


# ---------------------------------------------------------------------------------------------
# The rank process, run inside one actor per rank


class RankProcess:
    """One rank's subprocess, owned by the actor it runs in so that it dies with it."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[str] | None = None
        self._lock = threading.Lock()
        self._tail: collections.deque[str] = collections.deque(maxlen=_TAIL_LINES)
        self._marks: dict[str, str] = {}
        self._iteration_lines: list[str] = []
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

    def start(self, argv: list[str], env: Mapping[str, str], log_path: str) -> int:
        """Launch the rank with this worker's environment updated by ``env`` (and unbuffered
        Python output, for timely heartbeats); its output streams to ``log_path``.  Returns its
        pid."""
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        log = open(log_path, "w", encoding="utf-8")  # noqa: SIM115 - the reader thread closes it
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
            log.close()
            raise ConfigError(f"cannot launch {argv[0]!r}: {exc.strerror}") from None
        self._started = self._last_beat = time.monotonic()
        self._reader = threading.Thread(target=self._read, args=(log,), daemon=True)
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

    def _read(self, log: Any) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        with log:
            for line in self._proc.stdout:
                log.write(line)
                log.flush()
                self._see(line.rstrip("\n")[:_MAX_LINE])

    def _see(self, line: str) -> None:
        mark = failure_mark(line)
        with self._lock:
            self._tail.append(line)
            if _ITERATION_LINE.search(line):
                self._last_beat = time.monotonic()
                self._iteration_lines.append(line)
            if mark and mark not in self._marks:
                self._marks[mark] = line

    def _wait(self) -> None:
        assert self._proc is not None
        self._proc.wait()
        with self._lock:
            self._exited = self._exited or time.monotonic()


# ---------------------------------------------------------------------------------------------
# The shell


@dataclass(frozen=True)
class RunSpec:
    """One profiling run: the same argv on every rank (python executable and script included).

    ``gpus_per_node`` GPUs of each node are used; a world that is not a multiple takes the rest
    on one more node.  ``heartbeat_s`` counts from launch, so it must cover start-up and the
    first iteration.  ``placement_timeout_s`` also covers waiting for other runs to free the
    cluster.  ``labels`` fill :data:`LABEL_COLUMNS` of each attempt's ``runs`` row.
    """

    run_id: str
    study: str
    command: list[str]
    parallel: ParallelConfig
    gpus_per_node: int
    log_dir: Path
    env: Mapping[str, str] = field(default_factory=dict)
    timeout_s: float = 3600.0
    heartbeat_s: float = 900.0
    max_retries: int = 2
    placement_timeout_s: float = 600.0
    cpus_per_rank: float = 1.0
    stop_grace_s: float = 5.0
    labels: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, value in (("run id", self.run_id), ("study", self.study)):
            if not _ID.fullmatch(value):
                raise ConfigError(f"{name} must be letters, digits, '.', '_' or '-': {value!r}")
        if not self.command or not all(isinstance(arg, str) for arg in self.command):
            raise ConfigError(f"command must be a non-empty list of strings: {self.command!r}")
        if self.gpus_per_node < 1 or self.max_retries < 0 or self.cpus_per_rank <= 0:
            raise ConfigError("gpus_per_node >= 1, max_retries >= 0 and cpus_per_rank > 0")
        if min(self.timeout_s, self.heartbeat_s, self.placement_timeout_s) <= 0:
            raise ConfigError("timeout_s, heartbeat_s and placement_timeout_s must be > 0")
        if set(self.labels) - LABEL_COLUMNS:
            raise ConfigError(
                f"labels may set {', '.join(sorted(LABEL_COLUMNS))} of the runs table, not "
                f"{', '.join(sorted(set(self.labels) - LABEL_COLUMNS))}"
            )


@dataclass(frozen=True)
class RunResult:
    """How a run ended, after its retries.  Lists are by global rank, of the last attempt; a
    return code is None for a rank still running when the run was stopped, or never launched."""

    run_id: str  # the last attempt's id
    status: str  # finished, failed, infeasible or error
    failure_class: str | None
    returncodes: list[int | None]
    log_paths: list[Path]
    attempts: int
    error: str | None


def run_on_cluster(
    spec: RunSpec,
    store: CostStore | None = None,
    rank_env: RankEnv = megatron_rank_env,
    watch: Watch | None = None,
    cancel: threading.Event | None = None,
) -> RunResult:
    """Run ``spec`` on the connected Ray cluster, retrying infrastructure failures; every
    attempt becomes a ``runs`` row in ``store``.  ``watch`` sees the iteration lines as they come
    and may stop the run early; setting ``cancel`` stops it (class "cancelled") within a poll."""
    if not ray.is_initialized():
        raise ConfigError("connect to a Ray cluster first (ray.init(address=...))")
    attempt = 0
    while True:
        attempt += 1
        started = time.time()
        result = _attempt(_Attempt(spec, attempt, watch, cancel or threading.Event()), rank_env)
        if store is not None:
            store.write("runs", [_attempt_row(spec, result, started, time.time())], spec.study)
        if result.failure_class not in RETRIED or attempt > spec.max_retries:
            return result
        logger.warning("%s: %s (%s), retrying", result.run_id, result.failure_class, result.error)


def run_many(
    specs: Sequence[RunSpec],
    store: CostStore | None = None,
    rank_env: RankEnv = megatron_rank_env,
    max_parallel: int | None = None,
    watches: Sequence[Watch | None] | None = None,
    cancel: threading.Event | None = None,
) -> list[RunResult]:
    """Run specs side by side, each waiting for its placement group until the cluster has room;
    results in the order of ``specs``.  An interrupt (Ctrl-C) cancels every run, waits until
    each has released its ranks and placement group, then propagates."""
    if not specs:
        return []
    cancel = cancel or threading.Event()
    watches = watches or [None] * len(specs)
    with ThreadPoolExecutor(max_workers=max_parallel or len(specs)) as pool:
        futures = [
            pool.submit(run_on_cluster, spec, store, rank_env, watch, cancel)
            for spec, watch in zip(specs, watches, strict=True)
        ]
        try:
            return [future.result() for future in futures]
        except BaseException:
            cancel.set()
            raise


def start_local_cluster(
    nodes: int = 3,
    gpus_per_node: int = 4,
    cpus_per_node: int | None = None,
    object_store_mb: int = 100,
) -> Cluster:
    """A simulated multi-node GPU cluster on this machine, with this driver connected: a head
    without CPUs (so nothing runs there) and ``nodes`` workers declaring fake GPUs.

    Sets RAY_AUTH_MODE=disabled and RAY_USAGE_STATS_ENABLED=0 in this process's environment.
    Shut down with ``ray.shutdown()`` then ``cluster.shutdown()``, never ``ray stop``.
    """
    os.environ.update(_LOCAL_CLUSTER_ENV)
    store_bytes = object_store_mb * 2**20
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 0,
            "include_dashboard": False,
            "object_store_memory": store_bytes,
        },
    )
    for _ in range(nodes):
        cluster.add_node(
            num_cpus=gpus_per_node if cpus_per_node is None else cpus_per_node,
            num_gpus=gpus_per_node,
            object_store_memory=store_bytes,
        )
    cluster.wait_for_nodes()
    cluster.connect()
    return cluster


@contextmanager
def connected(
    address: str | None, nodes: int, gpus_per_node: int | None
) -> Iterator[tuple[int, str]]:
    """Join ``address`` (or $RAY_ADDRESS, as in a Ray job), else start an embedded local cluster
    of ``nodes`` simulated GPU nodes; yields the GPUs per node a run may take and a line saying
    which; always disconnects."""
    address = address or os.environ.get("RAY_ADDRESS")
    cluster = None
    if address:
        ray.init(address=address, logging_level="ERROR")
        per_node = [int(n["Resources"].get("GPU", 0)) for n in ray.nodes() if n["Alive"]]
        found = max(per_node, default=0)
        if found == 0:
            ray.shutdown()
            raise ConfigError(f"the Ray cluster at {address} has no GPUs")
        gpus_per_node = gpus_per_node or found
        where = f"joined {address}: {sum(per_node)} GPUs on {len(per_node)} nodes"
    else:
        gpus_per_node = gpus_per_node or 4
        cluster = start_local_cluster(nodes=nodes, gpus_per_node=gpus_per_node)
        where = f"started an embedded local cluster: {nodes} nodes x {gpus_per_node} GPUs"
    try:
        yield gpus_per_node, where
    finally:
        ray.shutdown()
        if cluster is not None:
            cluster.shutdown()


def _attempt_row(
    spec: RunSpec, result: RunResult, started_at: float, finished_at: float
) -> dict[str, Any]:
    """The ``runs`` row of one attempt."""
    p = spec.parallel
    return {
        **spec.labels,
        "run_id": result.run_id, "study": spec.study, "pp": p.pp, "vpp": p.vpp, "tp": p.tp,
        "cp": p.cp, "ep": p.ep, "etp": p.etp, "dp": p.dp, "micro_batch_size": p.micro_batch_size,
        "global_batch_size": p.global_batch_size or None,
        "num_microbatches": p.num_microbatches_or_none, "status": result.status,
        "failure_class": result.failure_class, "error": result.error, "started_at": started_at,
        "finished_at": finished_at,
    }  # fmt: skip


@dataclass(frozen=True)
class _Attempt:
    """One attempt of a run: its id, its log files and how to report its end."""

    spec: RunSpec
    number: int
    watch: Watch | None = None
    cancel: threading.Event = field(default_factory=threading.Event)

    @property
    def run_id(self) -> str:
        return attempt_id(self.spec.run_id, self.number)

    @property
    def log_paths(self) -> list[Path]:
        folder = self.spec.log_dir / self.run_id
        return [folder / f"rank-{rank}.log" for rank in range(self.spec.parallel.world_size)]

    def result(
        self,
        failure_class: str | None,
        error: str | None,
        statuses: Sequence[RankStatus] | None = None,
    ) -> RunResult:
        world = self.spec.parallel.world_size
        return RunResult(
            run_id=self.run_id,
            status=FINISHED if failure_class is None else _STATUS_OF.get(failure_class, FAILED),
            failure_class=failure_class,
            returncodes=[s.returncode for s in statuses] if statuses else [None] * world,
            log_paths=self.log_paths,
            attempts=self.number,
            error=error,
        )


def _attempt(attempt: _Attempt, rank_env: RankEnv) -> RunResult:
    """One placement, launch and watch; cleans up on every path."""
    spec = attempt.spec
    bundles = _node_bundles(spec.parallel.world_size, spec.gpus_per_node)
    try:
        check_placement(spec.parallel, {f"node {i}": gpus for i, gpus in enumerate(bundles)})
    except ConfigError as exc:
        return attempt.result("invalid-config", str(exc))
    pg = placement_group(
        [{"GPU": gpus, "CPU": gpus * spec.cpus_per_rank} for gpus in bundles],
        strategy="STRICT_SPREAD",
        name=attempt.run_id,
    )
    actors: list[Any] = []
    try:
        if not _placed(pg, spec.placement_timeout_s, attempt.cancel):
            if attempt.cancel.is_set():
                return attempt.result("cancelled", _CANCELLED)
            shape = "+".join(map(str, bundles))
            wait = spec.placement_timeout_s
            error = f"{shape} GPUs on {len(bundles)} nodes not placed within {wait:g} s"
            return attempt.result("infeasible-placement", error)
        actors = _create_actors(spec, pg, bundles, attempt.run_id)
        return _launch_and_watch(attempt, actors, rank_env)
    except _Cancelled:
        return attempt.result("cancelled", _CANCELLED)
    except ConfigError as exc:  # also raised in an actor: the command cannot be launched
        return attempt.result("invalid-config", _one_line(str(exc)))
    except RayActorError as exc:
        return attempt.result("node-lost", _one_line(f"a rank's actor died: {exc}"))
    except GetTimeoutError:
        return attempt.result("node-lost", f"a rank's actor did not answer in {_RPC_TIMEOUT_S:g} s")
    finally:
        _release(actors, pg, spec.stop_grace_s)


class _Cancelled(Exception):
    """The run was cancelled while the shell waited on its actors."""


def _get(refs: list[Any], timeout_s: float, cancel: threading.Event) -> list[Any]:
    """``ray.get`` that gives up at the timeout (GetTimeoutError) or as soon as the run is
    cancelled (_Cancelled): actors of a busy cluster may take long to start."""
    deadline = time.monotonic() + timeout_s
    while not cancel.is_set():
        left = deadline - time.monotonic()
        if left <= 0:
            raise GetTimeoutError(f"no answer in {timeout_s:g} s")
        done, _ = ray.wait(refs, num_returns=len(refs), timeout=min(left, _POLL_S * 4))
        if len(done) == len(refs):
            return ray.get(refs)
    raise _Cancelled


def _placed(pg: PlacementGroup, timeout_s: float, cancel: threading.Event) -> bool:
    """Wait for the group to be placed, giving up at the timeout or when cancelled."""
    ready = pg.ready()
    deadline = time.monotonic() + timeout_s
    while not cancel.is_set():
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        done, _ = ray.wait([ready], timeout=min(left, _POLL_S * 4))
        if done:
            return True
    return False


def _release(actors: list[Any], pg: PlacementGroup, grace_s: float) -> None:
    """Stop every rank process (SIGTERM, ``grace_s``, SIGKILL), kill every actor and remove the
    placement group, even when an actor is dead or an earlier step fails."""
    try:
        stops = [actor.stop.remote(grace_s) for actor in actors]
        ray.wait(stops, num_returns=len(stops), timeout=grace_s + 5.0)
    finally:
        for actor in actors:
            ray.kill(actor)
        remove_placement_group(pg)


def _create_actors(spec: RunSpec, pg: PlacementGroup, bundles: list[int], run_id: str) -> list:
    """One actor per GPU slot, on its node's bundle."""
    actor_class = ray.remote(RankProcess)
    bundle_of_slot = [index for index, gpus in enumerate(bundles) for _ in range(gpus)]
    return [
        actor_class.options(
            num_gpus=1,
            num_cpus=spec.cpus_per_rank,
            max_restarts=0,
            name=f"{run_id}.slot-{slot}",
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                pg, placement_group_bundle_index=index
            ),
        ).remote()
        for slot, index in enumerate(bundle_of_slot)
    ]


def _launch_and_watch(attempt: _Attempt, slots: list[Any], rank_env: RankEnv) -> RunResult:
    """Order the slots into ranks, launch every rank, then poll until the run ends."""
    spec = attempt.spec
    world = spec.parallel.world_size
    deadline = time.monotonic() + spec.timeout_s
    try:
        places = _get([slot.where.remote() for slot in slots], spec.timeout_s, attempt.cancel)
    except GetTimeoutError:
        return attempt.result("timeout", f"rank actors did not start in {spec.timeout_s:g} s")
    slot_of = {(node, gpus[0]): slot for slot, (node, gpus, _) in enumerate(places)}
    ordered = rank_order(list(slot_of), spec.parallel)
    ranks = [slots[slot_of[device]] for device in ordered]
    master_addr = places[slot_of[ordered[0]]][2]
    master_port = _get([ranks[0].free_port.remote()], _RPC_TIMEOUT_S, attempt.cancel)[0]
    launches = []
    for rank, (actor, log_path) in enumerate(zip(ranks, attempt.log_paths, strict=True)):
        gpu_ids = places[slot_of[ordered[rank]]][1]
        env = {
            **spec.env,
            **rank_env(rank, world, master_addr, master_port, gpu_ids),
            **device_env(ordered, rank),
        }
        launches.append(actor.start.remote(spec.command, env, str(log_path)))
    _get(launches, _RPC_TIMEOUT_S, attempt.cancel)
    failed_at: float | None = None
    lines_seen = 0
    while True:
        attempt.cancel.wait(_POLL_S)
        statuses = ray.get([actor.poll.remote() for actor in ranks], timeout=_RPC_TIMEOUT_S)
        now = time.monotonic()
        codes = [status.returncode for status in statuses]
        if attempt.watch is not None:
            lines = ray.get(ranks[-1].iteration_lines.remote(lines_seen), timeout=_RPC_TIMEOUT_S)
            lines_seen += len(lines)
            reason = attempt.watch(attempt.run_id, lines)
            if reason is not None and not all(code == 0 for code in codes):
                return attempt.result("early-stop", reason, statuses)
        if attempt.cancel.is_set():
            return attempt.result("cancelled", _CANCELLED, statuses)
        if all(code == 0 for code in codes):
            return attempt.result(None, None, statuses)
        if any(code not in (None, 0) for code in codes):
            failed_at = failed_at or now
            if None not in codes or now - failed_at >= _SETTLE_S:
                return attempt.result(*classify_exit(statuses), statuses)
        elif now >= deadline:
            return attempt.result("timeout", f"still running after {spec.timeout_s:g} s", statuses)
        elif min(status.idle_s for status in statuses) >= spec.heartbeat_s:
            error = f"no iteration line on any rank for {spec.heartbeat_s:g} s"
            return attempt.result("hang", error, statuses)
