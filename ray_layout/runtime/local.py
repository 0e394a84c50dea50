"""A Ray cluster for one command: join a running one, or simulate a multi-node GPU cluster here.

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
drop ``--num-gpus`` on workers (Ray detects the GPUs) and the custom resources.  Two clusters on
one host need a ``--temp-dir`` each: Ray hands a job submitted to either the address of the
newest (from the host's shared ``/tmp/ray``), and the tune would join that one.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import ray
from ray.cluster_utils import Cluster

from ray_layout.errors import ConfigError, RunFailure, exception_line
from ray_layout.options.ray_head import ray_head_problem

_LOCAL_CLUSTER_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}


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
    logging.getLogger("ray").setLevel(logging.ERROR)  # as join's ray.init does: no INFO lines
    store_bytes = object_store_mb * 2**20
    with _sigterm_kept():  # every node started here puts in Ray's
        cluster = Cluster(
            initialize_head=True,
            head_node_args={
                "num_cpus": 0,
                "include_dashboard": False,
                "object_store_memory": store_bytes,
            },
        )
        try:
            for _ in range(nodes):
                cluster.add_node(
                    num_cpus=gpus_per_node if cpus_per_node is None else cpus_per_node,
                    num_gpus=gpus_per_node,
                    object_store_memory=store_bytes,
                )
            cluster.wait_for_nodes()
            join(address=cluster.address)
        except BaseException as exc:  # a bare Exception when a raylet is late; an interrupt
            cluster.shutdown()
            if not isinstance(exc, Exception):
                raise
            raise RunFailure(
                f"the embedded Ray cluster did not start ({exception_line(exc)}); on a loaded "
                "machine run again, or join a running cluster with --ray-address"
            ) from None
    return cluster


@contextmanager
def connected(
    address: str | None, nodes: int, gpus_per_node: int | None
) -> Iterator[tuple[int, str]]:
    """Join ``address`` (or $RAY_ADDRESS, as in a Ray job), else start an embedded local cluster
    of ``nodes`` simulated GPU nodes; yields the GPUs per node a run may take and a line saying
    which; always disconnects."""
    given_by = "--ray-address" if address else "$RAY_ADDRESS"
    address = address or os.environ.get("RAY_ADDRESS")
    cluster = None
    if address:
        check_reachable(address, given_by)
        try:
            join(address=address)
        except ConnectionError as exc:  # something answers there, but not a Ray head
            raise ConfigError(
                f"cannot join a Ray cluster at {address} ({given_by}): {exc}"
            ) from None
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


def join(**init_args: Any) -> None:
    """``ray.init`` for a driver: quiet but for errors (no INFO lines on stderr), keeping the
    process's own SIGTERM handler."""
    with _sigterm_kept():
        ray.init(logging_level="ERROR", **init_args)


@contextmanager
def _sigterm_kept() -> Iterator[None]:
    """Keep the SIGTERM handler the process set (the command line's: every run stopped, one
    line, 130) over Ray's: ``ray.init`` puts in ``sys.exit(15)`` (after Ray's C++ handler prints
    a stack dump), a node started here kills its processes and exits 1. Where the process set
    none, Ray's stays (it cleans up what Ray started)."""
    handler = signal.getsignal(signal.SIGTERM)
    try:
        yield
    finally:
        if callable(handler) and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, handler)


def check_reachable(address: str, given_by: str) -> None:
    """A one-line error, within seconds, when no Ray head answers at a cluster address
    (:func:`ray_head_problem`): ``ray.init`` would retry for minutes where nothing listens, and
    hang deaf to SIGTERM where something else (a web server) does, printing Ray's warnings."""
    problem = ray_head_problem(address)
    if problem is not None:
        advice = "unset RAY_ADDRESS for an embedded local cluster" if given_by[0] == "$" else ""
        raise ConfigError(
            f"{given_by} {address}: {problem}; start it or fix the address"
            + (f", or {advice}" if advice else "")
        )
