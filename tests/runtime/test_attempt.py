"""One attempt of a run, up to where it needs the cluster: a shape the nodes cannot hold is
refused before any placement group, and a cancelled attempt stops waiting at once.  Placed,
launched and watched attempts run end to end in test_runs.py."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import ray

from ray_layout.model.spec import ParallelConfig
from ray_layout.runtime.attempt import _Attempt, _Cancelled, _get, _placed, run_attempt
from ray_layout.runtime.failures import RankStatus
from ray_layout.runtime.placement import megatron_rank_env
from ray_layout.runtime.run_spec import RunSpec


def spec(parallel: ParallelConfig, gpus_per_node: int = 4) -> RunSpec:
    return RunSpec("run", "s", ["python", "rank.py"], parallel, gpus_per_node)


@pytest.fixture(autouse=True)
def no_ray() -> Iterator[None]:
    """These tests must never start Ray (a Ray API call would start a local one)."""
    assert not ray.is_initialized()
    yield
    assert not ray.is_initialized()


def test_groups_the_nodes_cannot_hold_are_refused_before_placement() -> None:
    result = run_attempt(spec(ParallelConfig(tp=8)), 3, megatron_rank_env, None, threading.Event())
    assert (result.run_id, result.attempts) == ("run-retry2", 3)
    assert (result.status, result.failure_class) == ("error", "invalid-config")
    assert result.error == (
        "TP=8 groups do not fit in nodes: node 0 has 4 GPUs of this run, not a multiple of 8"
    )
    assert result.returncodes == [None] * 8 and result.outputs == () and result.log_paths == []


def test_a_result_holds_each_ranks_return_code() -> None:
    attempt = _Attempt(spec(ParallelConfig(dp=2)), 1, None, threading.Event())
    statuses = [RankStatus(1, 0, 1.0, 0.0, {}, ()), RankStatus(2, None, None, 0.0, {}, ())]
    result = attempt.result(None, None, statuses)
    assert (result.run_id, result.status, result.returncodes) == ("run", "finished", [0, None])


def test_a_cancelled_attempt_stops_waiting_for_actors_and_placement() -> None:
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(_Cancelled):
        _get(["never looked at"], timeout_s=60.0, cancel=cancel)

    class Group:
        def ready(self) -> None:
            return None

    assert _placed(Group(), timeout_s=60.0, cancel=cancel) is False
