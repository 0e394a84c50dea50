"""The planner's shards as Ray tasks: ``search.planner.plan(..., map_shards=ray_map_shards)``.

The search core maps a pure function over its shard tasks and never imports Ray; this is the one
place that knows how to run that map on a cluster.  Ray must already be initialised (the
command starts or joins a session); each shard is one task of one CPU, and the results come back
in the order of the tasks, so merging them gives the same top as one process.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

Task = TypeVar("Task")
Result = TypeVar("Result")


def ray_map_shards(function: Callable[[Task], Result], tasks: Sequence[Task]) -> list[Result]:
    """``[function(task) for task in tasks]``, each call a Ray task."""
    import ray

    remote = ray.remote(num_cpus=1)(function)
    return ray.get([remote.remote(task) for task in tasks])
