"""``--shards N`` on Ray: the shards of a plan as Ray tasks give the same top as one process."""

from __future__ import annotations

import os
from dataclasses import replace

import pytest

from ray_layout.model.costs import load_costs
from ray_layout.model.spec import load_recipe_file
from search.planner import PlanOptions, Problem, SearchSpec, plan

HANDBOOK = load_recipe_file("configs/handbook_7b_a1b.yaml")
COSTS = load_costs("configs/costs/handbook_h200_example.json")

pytestmark = pytest.mark.skipif(os.environ.get("RAY_LAYOUT_SKIP_RAY") == "1", reason="no Ray")


@pytest.fixture(scope="module")
def local_ray():
    import ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    started = not ray.is_initialized()
    if started:
        ray.init(address="local", num_cpus=2, include_dashboard=False,
                 object_store_memory=100 * 2**20,
                 logging_level="ERROR")  # fmt: skip
    yield
    if started:
        ray.shutdown()


@pytest.mark.parametrize("enumerate_limit", [5_000_000, 0], ids=["enumeration", "exact"])
def test_ray_shards_give_the_same_plan_as_one_process(local_ray, enumerate_limit):
    from ray_layout.runtime.sharding import ray_map_shards

    spec = SearchSpec(num_microbatches=16, enumerate_limit=enumerate_limit)
    options = PlanOptions(top=5, samples=32, block_size=200)
    local = plan(Problem.of(HANDBOOK, COSTS, spec, options))
    sharded = plan(
        Problem.of(HANDBOOK, COSTS, replace(spec, shards=3), options),
        map_shards=ray_map_shards,
    )
    assert [c.layout for c in sharded.candidates] == [c.layout for c in local.candidates]
    assert sharded.candidates == local.candidates and sharded.ties == local.ties
    if enumerate_limit:
        assert sharded.scored == local.scored
