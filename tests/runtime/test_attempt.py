"""One attempt of a run, up to where it needs the cluster: a shape the nodes cannot hold is
refused before any placement group, a cancelled attempt takes none and stops waiting at once.
Placed, launched and watched attempts run end to end in test_runs.py."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator

import pytest
import ray

from ray_layout.model.spec import ParallelConfig
from ray_layout.runtime import attempt as attempt_module
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


def test_a_cancelled_attempt_takes_nothing() -> None:
    """A run that waited its turn when the driver was interrupted never asks for a group (one
    asked for here would need Ray: the fixture fails the test)."""
    cancel = threading.Event()
    cancel.set()
    result = run_attempt(spec(ParallelConfig(dp=4)), 1, megatron_rank_env, None, cancel)
    assert (result.status, result.failure_class) == ("cancelled", "cancelled")
    assert result.returncodes == [None] * 4 and result.outputs == ()


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

    assert _placed(Group(), timeout_s=60.0, cancel=cancel, what="run: 4 GPUs") is False


def test_a_long_wait_for_placement_is_said_with_the_free_gpus(monkeypatch, caplog) -> None:
    """A job log has no bar: a run that waits for its GPUs says so, then gives up at the
    timeout."""

    def never_ready(refs: list, timeout: float) -> tuple[list, list]:
        time.sleep(timeout)
        return [], refs

    monkeypatch.setattr(attempt_module.ray, "wait", never_ready)
    monkeypatch.setattr(attempt_module.ray, "available_resources", lambda: {"GPU": 2.0})
    monkeypatch.setattr(attempt_module, "_PLACEMENT_NOTE_S", (0.05, 0.1))
    monkeypatch.setattr(attempt_module, "_POLL_S", 0.01)

    class Group:
        def ready(self) -> str:
            return "ready ref"

    with caplog.at_level(logging.WARNING):
        assert _placed(Group(), 0.5, threading.Event(), "run-x: 4 GPUs on 1 nodes") is False
    said = [r.getMessage() for r in caplog.records]
    assert 2 <= len(said) <= 5
    assert said[0].startswith("run-x: 4 GPUs on 1 nodes: still waiting for them after 0 s")
    assert all(line.endswith("(2 GPUs free on the cluster now)") for line in said)
