"""Giving back what an attempt holds: when a placement group may be removed (pure), and on the
session's local cluster, groups released while Ray is still placing them, while they wait for
room, and with their actors still being created, each leaving every GPU free."""

from __future__ import annotations

import threading
import time

import pytest

from ray_layout.runtime import release as release_module
from ray_layout.runtime.release import IN_FLIGHT_S, Held, release, removable
from tests.helpers.cluster import GPUS_PER_NODE, NODES

ALL_GPUS = NODES * GPUS_PER_NODE
NODE = {"GPU": GPUS_PER_NODE, "CPU": GPUS_PER_NODE}  # all of one node: one group per node


@pytest.mark.parametrize(
    ("state", "scheduling", "waited_s", "expected"),
    [
        ("CREATED", "FINISHED", 0.0, True),  # placed: its committed bundles go whole
        ("REMOVED", "REMOVED", 0.0, True),
        ("PENDING", "INFEASIBLE", 0.0, True),  # never placeable as the cluster is
        ("PENDING", "NO_RESOURCES", 0.0, False),  # the runs stopped beside it may free room
        ("PENDING", "NO_RESOURCES", 15.0, True),  # ... and had their time to
        ("PENDING", "QUEUED", 15.0, False),  # about to be scheduled
        ("PENDING", "SCHEDULING_STARTED", 15.0, False),  # bundles being prepared
        ("PREPARED", "FINISHED", 15.0, False),  # prepared, not committed: the leak's window
        ("RESCHEDULING", "SCHEDULING_STARTED", 15.0, False),
        ("PREPARED", "FINISHED", IN_FLIGHT_S, True),  # bounded: a stop always ends
    ],
)
def test_a_group_is_removed_only_once_settled(state, scheduling, waited_s, expected):
    assert removable(state, scheduling, waited_s, place_s=15.0) is expected


def free_gpus(ray) -> float:
    return ray.available_resources().get("GPU", 0.0)


def reserved_on_nodes(ray, group) -> list[str]:
    """The group's own resources still on some node (``GPU_group_<id>``, ...)."""
    return [name for name in ray.cluster_resources() if name.endswith(group.id.hex())]


def wait_for_all_gpus(ray, timeout_s: float = 10.0) -> float:
    deadline = time.monotonic() + timeout_s
    while free_gpus(ray) < ALL_GPUS and time.monotonic() < deadline:
        time.sleep(0.1)
    return free_gpus(ray)


def recording_removals(monkeypatch) -> list[str]:
    """Each group's state as ``release`` removes it."""
    states: list[str] = []
    remove = release_module.remove_placement_group

    def recorded(group) -> None:
        states.append(release_module.placement_group_table(group)["state"])
        remove(group)

    monkeypatch.setattr(release_module, "remove_placement_group", recorded)
    return states


def test_groups_released_as_ray_places_them_leave_every_gpu_free(ray_cluster, monkeypatch):
    """The Ctrl-C leak: a group removed 1 to 10 ms after it was created, while its bundles were
    prepared but not committed, read REMOVED and held its node's 4 GPUs for good (2 of 180
    such removals before the fix; removed at once, groups of this loop were PENDING or
    PREPARED)."""
    import ray
    from ray.util.placement_group import placement_group

    removed_in = recording_removals(monkeypatch)
    for attempt in range(40):
        group = placement_group([NODE], strategy="STRICT_SPREAD")
        time.sleep((0.0, 0.001, 0.003, 0.01)[attempt % 4])
        release(Held(group), grace_s=1.0, what=f"race-{attempt}")
        assert reserved_on_nodes(ray, group) == []  # gone from its node before release returns
    assert wait_for_all_gpus(ray) == ALL_GPUS
    assert set(removed_in) == {"CREATED"}  # each waited until placed: there was room


def test_a_group_waiting_for_room_is_removed_once_its_neighbours_free_it(ray_cluster, monkeypatch):
    """Every node is held by a group being released at the same time: the waiting group is
    placed as they go, and removed placed, never while Ray reserves it."""
    import ray
    from ray.util.placement_group import placement_group

    removed_in = recording_removals(monkeypatch)
    holders = [placement_group([NODE], strategy="STRICT_SPREAD") for _ in range(NODES)]
    ray.get([group.ready() for group in holders], timeout=30)
    waiting = placement_group([NODE], strategy="STRICT_SPREAD")
    neighbours = [
        threading.Thread(target=release, args=(Held(group), 1.0, f"holder-{index}"))
        for index, group in enumerate(holders)
    ]
    for thread in neighbours:
        thread.start()
    started = time.monotonic()
    release(Held(waiting), grace_s=1.0, what="waiting")
    for thread in neighbours:
        thread.join(30)
    assert time.monotonic() - started < 1.0 + release_module.PLACE_S
    assert removed_in.count("CREATED") == NODES + 1  # the waiting group too
    assert reserved_on_nodes(ray, waiting) == []
    assert wait_for_all_gpus(ray) == ALL_GPUS


def test_a_group_that_gets_no_room_is_removed_unplaced_after_its_wait(ray_cluster, monkeypatch):
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    monkeypatch.setattr(release_module, "PLACE_S", 0.5)
    removed_in = recording_removals(monkeypatch)
    holders = [placement_group([NODE], strategy="STRICT_SPREAD") for _ in range(NODES)]
    try:
        ray.get([group.ready() for group in holders], timeout=30)
        waiting = placement_group([NODE], strategy="STRICT_SPREAD")
        started = time.monotonic()
        release(Held(waiting), grace_s=0.5, what="waiting")
        assert 1.0 <= time.monotonic() - started < 5.0  # its grace and PLACE_S, not more
        assert removed_in == ["PENDING"]
        assert ray.util.placement_group_table(waiting)["state"] == "REMOVED"
    finally:
        for group in holders:
            remove_placement_group(group)
    assert wait_for_all_gpus(ray) == ALL_GPUS


def test_actors_still_being_created_are_seen_dead_before_their_group_goes(ray_cluster, monkeypatch):
    """ray-project/ray#19131: a group removed under actors pending creation leaked resources.
    Release kills them (never starting them) and removes the group only once none lives."""
    import ray
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from ray_layout.runtime.actor import RankProcess

    group = placement_group([NODE], strategy="STRICT_SPREAD")
    ray.get(group.ready(), timeout=30)
    strategy = PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=0)
    actor_class = ray.remote(RankProcess)
    held = Held(group)
    for slot in range(GPUS_PER_NODE):
        name = f"pending-creation.slot-{slot}"
        held.actors[name] = actor_class.options(
            num_gpus=1, num_cpus=1, name=name, scheduling_strategy=strategy
        ).remote()
    alive_at_removal: list[list[str]] = []
    remove = release_module.remove_placement_group

    def checked(removed) -> None:
        alive_at_removal.append([name for name in held.actors if release_module._alive(name)])
        remove(removed)

    monkeypatch.setattr(release_module, "remove_placement_group", checked)
    release(held, grace_s=1.0, what="pending-creation")
    assert alive_at_removal == [[]]
    assert reserved_on_nodes(ray, group) == []
    assert wait_for_all_gpus(ray) == ALL_GPUS
