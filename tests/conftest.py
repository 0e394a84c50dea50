"""Shared fixtures: one simulated multi-node Ray cluster for the whole test session.

Every test that needs that cluster, or starts its own Ray head or emulated Megatron ranks, is an
end-to-end test and is marked ``slow``: ``pytest -m "not slow"`` is the quick loop (about 2
minutes), ``make test`` runs everything.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.helpers.cluster import GPUS_PER_NODE, NODES

# Fixtures that start real processes: a test using one is end-to-end.
END_TO_END_FIXTURES = frozenset({"ray_cluster", "ray_head", "ranks"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if END_TO_END_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[object]:
    """3 nodes x 4 fake GPUs (about 7 s to start, 1.4 GB), shared by every test that needs Ray;
    removed node by node at the end, never with ``ray stop``."""
    if os.environ.get("RAY_LAYOUT_SKIP_RAY") == "1":
        pytest.skip("Ray disabled")
    import ray

    from ray_layout.runtime.local import start_local_cluster

    if ray.is_initialized():
        pytest.fail("a Ray connection is already open; the cluster fixture needs its own")
    cluster = start_local_cluster(nodes=NODES, gpus_per_node=GPUS_PER_NODE)
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()
