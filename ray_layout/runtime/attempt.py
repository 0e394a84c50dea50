"""One attempt of a run on the connected Ray cluster: place, launch, watch, release.

One placement group per attempt (a bundle per node, STRICT_SPREAD), one actor per rank on its
node's bundle with ``max_restarts=0``, since a restarted rank cannot rejoin a NCCL communicator.
The driver polls every rank; the attempt ends when all ranks exit 0, when one fails (its peers
get a moment to print why they fail too), at the run's timeout or heartbeat, when the caller's
watch stops it, or when the caller cancels it.  Then every rank's output, parsed on its node,
comes back with the result through Ray (``RunResult.outputs``).  Every path gives back what the
attempt took, and waits until it is back, through ``release.release`` (rank processes stopped,
actors dead, the group removed once settled and gone from its nodes).  A cancelled attempt takes
nothing more: no group once it is cancelled, no actor once it is cancelled while being placed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError
from ray.util.placement_group import PlacementGroup, placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from ray_layout.errors import ConfigError
from ray_layout.runtime.actor import RankProcess
from ray_layout.runtime.failures import (
    CANCELLED_ERROR,
    FailureClass,
    RankStatus,
    classify_exit,
    one_line,
    run_status,
)
from ray_layout.runtime.outputs import RankOutput
from ray_layout.runtime.placement import (
    RankEnv,
    check_placement,
    launch_env,
    node_bundles,
    rank_order,
)
from ray_layout.runtime.release import Held, release
from ray_layout.runtime.run_spec import RunResult, RunSpec, Watch, attempt_id

_POLL_S = 0.25  # how often the driver asks every rank for its progress
_RPC_TIMEOUT_S = 30.0  # longest wait for one answer of a live actor
_SETTLE_S = 2.0  # after a rank fails, how long its peers get to print why they fail too
_PLACEMENT_NOTE_S = (120.0, 300.0)  # say a run still waits for its GPUs after this, then every

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Attempt:
    """One attempt of a run: its id, what watches it and how to report its end."""

    spec: RunSpec
    number: int
    watch: Watch | None
    cancel: threading.Event

    @property
    def run_id(self) -> str:
        return attempt_id(self.spec.run_id, self.number)

    def result(
        self,
        failure_class: FailureClass | None,
        error: str | None,
        statuses: Sequence[RankStatus] | None = None,
    ) -> RunResult:
        world = self.spec.parallel.world_size
        return RunResult(
            run_id=self.run_id,
            status=run_status(failure_class),
            failure_class=failure_class,
            returncodes=[s.returncode for s in statuses] if statuses else [None] * world,
            log_paths=[],
            attempts=self.number,
            error=error,
        )


def run_attempt(
    spec: RunSpec,
    number: int,
    rank_env: RankEnv,
    watch: Watch | None,
    cancel: threading.Event,
) -> RunResult:
    """Attempt ``number`` of ``spec``: place it, launch every rank, watch until it ends; every
    failure becomes the result's class, and every path gives back what it took."""
    attempt = _Attempt(spec, number, watch, cancel)
    bundles = node_bundles(spec.parallel.world_size, spec.gpus_per_node)
    try:
        check_placement(spec.parallel, {str(i): gpus for i, gpus in enumerate(bundles)})
    except ConfigError as exc:
        return attempt.result(FailureClass.INVALID_CONFIG, str(exc))
    if cancel.is_set():  # a run that has not started takes nothing
        return attempt.result(FailureClass.CANCELLED, CANCELLED_ERROR)
    held = Held(
        placement_group(
            [{"GPU": gpus, "CPU": gpus * spec.cpus_per_rank} for gpus in bundles],
            strategy="STRICT_SPREAD",
            name=attempt.run_id,
        )
    )
    try:
        wait = spec.policy.placement_timeout_s
        shape = f"{'+'.join(map(str, bundles))} GPUs on {len(bundles)} nodes"
        placed = _placed(held.group, wait, attempt.cancel, f"{attempt.run_id}: {shape}")
        if attempt.cancel.is_set():  # placed as it was cancelled too: no actor is created
            return attempt.result(FailureClass.CANCELLED, CANCELLED_ERROR)
        if not placed:
            error = f"{shape} not placed within {wait:g} s"
            return attempt.result(FailureClass.INFEASIBLE_PLACEMENT, error)
        _create_actors(attempt, held, bundles)
        return _launch_and_watch(attempt, held, rank_env)
    except _Cancelled:
        return attempt.result(FailureClass.CANCELLED, CANCELLED_ERROR)
    except ConfigError as exc:  # also raised in an actor: the command cannot be launched
        return attempt.result(FailureClass.INVALID_CONFIG, one_line(str(exc)))
    except RayActorError as exc:
        return attempt.result(FailureClass.NODE_LOST, one_line(f"a rank's actor died: {exc}"))
    except GetTimeoutError:
        return attempt.result(
            FailureClass.NODE_LOST, f"a rank's actor did not answer in {_RPC_TIMEOUT_S:g} s"
        )
    finally:
        release(held, spec.policy.stop_grace_s, attempt.run_id)


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


def _placed(pg: PlacementGroup, timeout_s: float, cancel: threading.Event, what: str) -> bool:
    """Wait for the group to be placed, giving up at the timeout or when cancelled; a long wait
    is said (``what`` names the run and its GPUs), with the cluster's free GPUs."""
    ready = pg.ready()
    started = time.monotonic()
    deadline, note_at = started + timeout_s, started + _PLACEMENT_NOTE_S[0]
    while not cancel.is_set():
        now = time.monotonic()
        if now >= deadline:
            return False
        if now >= note_at:
            note_at = now + _PLACEMENT_NOTE_S[1]
            free = ray.available_resources().get("GPU", 0.0)
            logger.warning(
                "%s: still waiting for them after %.0f s (%g GPUs free on the cluster now)",
                what,
                now - started,
                free,
            )
        done, _ = ray.wait([ready], timeout=min(deadline - now, _POLL_S * 4))
        if done:
            return True
    return False


def _create_actors(attempt: _Attempt, held: Held, bundles: list[int]) -> None:
    """One actor per GPU slot, on its node's bundle, each held as soon as it is created; none
    after the attempt is cancelled."""
    spec, actor_class = attempt.spec, ray.remote(RankProcess)
    bundle_of_slot = [index for index, gpus in enumerate(bundles) for _ in range(gpus)]
    for slot, index in enumerate(bundle_of_slot):
        if attempt.cancel.is_set():
            raise _Cancelled
        name = f"{attempt.run_id}.slot-{slot}"
        held.actors[name] = actor_class.options(
            num_gpus=1,
            num_cpus=spec.cpus_per_rank,
            max_restarts=0,
            name=name,
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                held.group, placement_group_bundle_index=index
            ),
        ).remote()


def _launch_and_watch(attempt: _Attempt, held: Held, rank_env: RankEnv) -> RunResult:
    """Order the slots into ranks, launch every rank, then poll until the run ends."""
    policy = attempt.spec.policy
    deadline = time.monotonic() + policy.timeout_s
    slots = list(held.actors.values())
    try:
        places = _get([slot.where.remote() for slot in slots], policy.timeout_s, attempt.cancel)
    except GetTimeoutError:
        return attempt.result(
            FailureClass.TIMEOUT, f"rank actors did not start in {policy.timeout_s:g} s"
        )
    held.launched = True  # from here a rank's process may run: it is stopped before its actor
    ranks = _launch(attempt, slots, places, rank_env)
    result = _watch(attempt, ranks, deadline)
    return replace(result, outputs=_outputs(ranks, policy.stop_grace_s))


def _outputs(ranks: list[Any], grace_s: float) -> tuple[RankOutput | None, ...]:
    """Stop every rank and take back what it printed, parsed on its node (None for a rank
    whose actor is gone or does not answer)."""
    refs = [actor.finish.remote(grace_s) for actor in ranks]
    ray.wait(refs, num_returns=len(refs), timeout=grace_s + _RPC_TIMEOUT_S)
    outputs = []
    for ref in refs:
        try:
            outputs.append(ray.get(ref, timeout=0))
        except (RayActorError, GetTimeoutError):
            outputs.append(None)
    return tuple(outputs)


def _launch(
    attempt: _Attempt,
    slots: list[Any],
    places: list[tuple[str, list[int], str]],
    rank_env: RankEnv,
) -> list[Any]:
    """Start every rank's process with torchrun's variables; the actors in global rank order."""
    spec = attempt.spec
    world = spec.parallel.world_size
    slot_of = {(node, gpus[0]): slot for slot, (node, gpus, _) in enumerate(places)}
    ordered = rank_order(list(slot_of), spec.parallel)
    ranks = [slots[slot_of[device]] for device in ordered]
    master_addr = places[slot_of[ordered[0]]][2]
    master_port = _get([ranks[0].free_port.remote()], _RPC_TIMEOUT_S, attempt.cancel)[0]
    launches = []
    for rank in range(world):
        env = {**spec.env, **launch_env(rank_env, ordered, rank, master_addr, master_port)}
        launches.append(
            ranks[rank].start.remote(spec.command, env, f"{attempt.run_id}/rank-{rank}")
        )
    _get(launches, _RPC_TIMEOUT_S, attempt.cancel)
    return ranks


def _watch(attempt: _Attempt, ranks: list[Any], deadline: float) -> RunResult:
    """Poll every rank until the run ends one way or another."""
    policy = attempt.spec.policy
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
                return attempt.result(FailureClass.EARLY_STOP, reason, statuses)
        if attempt.cancel.is_set():
            return attempt.result(FailureClass.CANCELLED, CANCELLED_ERROR, statuses)
        if all(code == 0 for code in codes):
            return attempt.result(None, None, statuses)
        if any(code not in (None, 0) for code in codes):
            failed_at = failed_at or now
            if None not in codes or now - failed_at >= _SETTLE_S:
                return attempt.result(*classify_exit(statuses), statuses)
        elif now >= deadline:
            return attempt.result(
                FailureClass.TIMEOUT, f"still running after {policy.timeout_s:g} s", statuses
            )
        elif min(status.idle_s for status in statuses) >= policy.heartbeat_s:
            error = f"no iteration line on any rank for {policy.heartbeat_s:g} s"
            return attempt.result(FailureClass.HANG, error, statuses)
