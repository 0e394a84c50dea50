"""Runs on the connected Ray cluster: the retry loop, runs side by side, and their record.

:func:`attempts` retries a run's infrastructure failures and yields each attempt as it ends;
:func:`run_on_cluster` records every attempt as a row of the store's ``runs`` table
(:func:`runs_row`) and returns the last; :func:`run_many` runs several at once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

import ray

from ray_layout.measure.ingest import runs_row as shared_runs_row
from ray_layout.measure.store import CostStore
from ray_layout.runtime.attempt import run_attempt
from ray_layout.runtime.failures import RETRIED, FailureClass
from ray_layout.runtime.outputs import write_logs
from ray_layout.runtime.placement import RankEnv, megatron_rank_env
from ray_layout.runtime.run_spec import RunResult, RunSpec, Watch

logger = logging.getLogger(__name__)
# a run that ends otherwise is said as it ends (a job log has no bars to show it)
_SAID_BY_THE_CALLER = frozenset({None, FailureClass.EARLY_STOP, FailureClass.CANCELLED})


@dataclass(frozen=True)
class Attempted:
    """One attempt as it ended, with the wall-clock times the ``runs`` table keeps."""

    result: RunResult
    started_at: float
    finished_at: float


def attempts(
    spec: RunSpec,
    rank_env: RankEnv = megatron_rank_env,
    watch: Watch | None = None,
    cancel: threading.Event | None = None,
) -> Iterator[Attempted]:
    """Every attempt of ``spec`` as it ends: a retried failure class is followed by another
    attempt, up to the policy's ``max_retries``; the last one yielded is the run's result.  With
    a ``log_dir`` the ranks' raw logs, sent back through Ray, are written there first."""
    if not ray.is_initialized():
        raise RuntimeError("connect to a Ray cluster first (ray.init(address=...))")
    cancel, retries = cancel or threading.Event(), spec.policy.max_retries
    for number in range(1, retries + 2):
        started = time.time()
        result = run_attempt(spec, number, rank_env, watch, cancel)
        if spec.log_dir is not None and result.outputs:
            paths = write_logs(spec.log_dir / result.run_id, result.outputs)
            result = replace(result, log_paths=paths)
        yield Attempted(result, started, time.time())
        if result.failure_class not in RETRIED or number > retries:
            if result.failure_class not in _SAID_BY_THE_CALLER:
                logger.warning("%s: %s (%s)", result.run_id, result.failure_class, result.error)
            return
        logger.warning("%s: %s (%s), retrying", result.run_id, result.failure_class, result.error)


def run_on_cluster(
    spec: RunSpec,
    store: CostStore | None = None,
    rank_env: RankEnv = megatron_rank_env,
    watch: Watch | None = None,
    cancel: threading.Event | None = None,
) -> RunResult:
    """Run ``spec`` on the connected Ray cluster, retrying infrastructure failures; every
    attempt becomes a ``runs`` row in ``store`` as soon as it ends.  ``watch`` sees the
    iteration lines as they come and may stop the run early; setting ``cancel`` stops it (class
    "cancelled") within a poll."""
    last = None
    for attempted in attempts(spec, rank_env, watch, cancel):
        if store is not None:
            store.write("runs", [runs_row(spec, attempted)], spec.study)
        last = attempted
    assert last is not None  # attempts yields at least once
    return last.result


def run_many(
    specs: Sequence[RunSpec],
    *,
    store: CostStore | None = None,
    rank_env: RankEnv = megatron_rank_env,
    max_parallel: int | None = None,
    watches: Sequence[Watch | None] | None = None,
    cancel: threading.Event | None = None,
) -> list[RunResult]:
    """Run specs side by side, each waiting for its placement group until the cluster has room;
    results in the order of ``specs``.  An interrupt (Ctrl-C) cancels every run: one not started
    never starts, every other gives back its ranks, actors and placement group, and the
    interrupt propagates once all of them are back (``release``: the caller may then leave the
    cluster)."""
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
            pool.shutdown(wait=True, cancel_futures=True)
            raise


def runs_row(spec: RunSpec, attempted: Attempted) -> dict[str, Any]:
    """The ``runs`` row of one attempt."""
    result = attempted.result
    return shared_runs_row(
        result.run_id,
        spec.study,
        spec.parallel,
        status=result.status,
        started_at=attempted.started_at,
        finished_at=attempted.finished_at,
        **spec.labels,
        failure_class=result.failure_class,
        error=result.error,
    )
