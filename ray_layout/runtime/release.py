"""What an attempt holds on the cluster, and how it gives it all back, waiting until it is back.

Every way an attempt ends (finished, failed, timed out, stopped early, cancelled at any moment)
goes through :func:`release`: the rank processes stopped (SIGTERM, the grace, SIGKILL), every
actor killed and seen dead, then the placement group removed and seen gone from its nodes.
Each wait is bounded; the attempt ends only after them, so a driver that leaves the cluster
after its runs (a Ctrl-C, ``ray job stop``) leaves nothing held.

A group is removed only once it is settled.  Ray reserves a group in two phases (its bundles
prepared on their nodes, then committed), and a group removed between the two reads REMOVED
while its node keeps the prepared GPUs for good: a Ctrl-C that started an A/B arm and removed
its group a millisecond later left one node's 4 GPUs held (with Ray 2.60; in a loop, 2 of 180
removals made 1 to 10 ms after creating a group).  So a group is removed when it is placed,
when it can never be placed, or when it still waits for room after the runs stopped beside it
had the time to free their GPUs (:func:`removable`); never while its reservation is in flight.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.util.placement_group import (
    PlacementGroup,
    placement_group_table,
    remove_placement_group,
)

ANSWER_S = 5.0  # past a stopped rank's grace, how long its actor gets to answer
DEAD_S = 10.0  # how long killed actors get to be seen dead
PLACE_S = 10.0  # past the grace: how long a group waiting for room is given to be placed
IN_FLIGHT_S = 30.0  # longest wait for a reservation in flight to land (ms, unless a node died)
GONE_S = 10.0  # how long a removed group's bundles get to leave their nodes
_POLL_S = 0.05

logger = logging.getLogger(__name__)


@dataclass
class Held:
    """What one attempt holds, filled in as it takes it, so that a stop at any moment gives
    back all of it: its group, its actors by name (as created), and whether any rank was sent
    its process."""

    group: PlacementGroup
    actors: dict[str, Any] = field(default_factory=dict)
    launched: bool = False


def removable(state: str, scheduling: str, waited_s: float, place_s: float) -> bool:
    """Whether a group in ``state`` (Ray's: PENDING, PREPARED, CREATED, REMOVED, RESCHEDULING)
    with ``scheduling`` (its last scheduling attempt's: QUEUED, SCHEDULING_STARTED,
    NO_RESOURCES, INFEASIBLE, FINISHED, ...) may be removed after ``waited_s`` of a stop: placed,
    never placeable as the cluster is, or waiting for room for ``place_s``; its reservation in
    flight only after :data:`IN_FLIGHT_S`."""
    if state in ("CREATED", "REMOVED") or (state, scheduling) == ("PENDING", "INFEASIBLE"):
        return True
    if (state, scheduling) == ("PENDING", "NO_RESOURCES"):
        return waited_s >= place_s
    return waited_s >= IN_FLIGHT_S


def release(held: Held, grace_s: float, what: str) -> None:
    """Give back everything ``held`` (the module docstring); ``what`` (the attempt id) names it
    in the warning said when a bounded wait ends with something still held."""
    actors = list(held.actors.values())
    try:
        if held.launched:
            stops = [actor.stop.remote(grace_s) for actor in actors]
            ray.wait(stops, num_returns=len(stops), timeout=grace_s + ANSWER_S)
    finally:
        for actor in actors:
            ray.kill(actor)  # one still being created is cancelled, never started

        def alive() -> list[str]:
            return [name for name in held.actors if _alive(name)]

        if not _until(lambda: not alive(), DEAD_S):
            logger.warning("%s: actors %s still alive %g s after kill", what, alive(), DEAD_S)
        _remove_settled(held.group, grace_s + PLACE_S, what)


def _remove_settled(group: PlacementGroup, place_s: float, what: str) -> None:
    """Remove ``group`` once :func:`removable` says so, then wait until its bundles have left
    their nodes (its resources gone from the cluster's)."""
    started = time.monotonic()
    while True:
        state, scheduling = _state(group)
        if removable(state, scheduling, time.monotonic() - started, place_s):
            break
        time.sleep(_POLL_S)
    if state != "REMOVED":
        remove_placement_group(group)
    if not _until(lambda: _gone(group), GONE_S):
        logger.warning(
            "%s: placement group %s (%s, %s when removed) still reserved on its nodes %g s later",
            what,
            group.id.hex(),
            state,
            scheduling,
            GONE_S,
        )


def _state(group: PlacementGroup) -> tuple[str, str]:
    table = placement_group_table(group)
    return table["state"], table["stats"]["scheduling_state"]


def _gone(group: PlacementGroup) -> bool:
    """Removed, and none of its bundles' resources (``GPU_group_<id>``, ...) left on a node."""
    suffix = group.id.hex()
    if placement_group_table(group)["state"] != "REMOVED":
        return False
    return not any(name.endswith(suffix) for name in ray.cluster_resources())


def _alive(name: str) -> bool:
    """Whether an actor of this name lives (Ray frees a name when its actor is dead)."""
    try:
        ray.get_actor(name)
    except ValueError:
        return False
    return True


def _until(condition: Callable[[], bool], timeout_s: float) -> bool:
    """Poll ``condition`` until it holds (True) or ``timeout_s`` passes (False)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() >= deadline:
            return False
        time.sleep(_POLL_S)
    return True
