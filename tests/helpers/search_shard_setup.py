"""The handbook-shaped toy problem (16 layers, PP 4) that the ranking, shard and tie tests share,
and its every distinct prediction by the plain simulator, their oracle."""

from __future__ import annotations

import numpy as np

from search.pipeline_ops import ScheduleShape
from search.planner import PlanOptions, ideal_step_ms
from search.ranking import candidates_of
from search.schedule import compile_schedule
from search.space import LayoutSpace
from search.ties import iter_tie_classes
from tests.helpers.planner_fixtures import plain_steps, toy_cost_model


def shard_setup(jitter: float = 0.05, vpp: int = 1, microbatches: int = 8, **costs):
    """(space, program, cost model, options, tie grid) of the toy problem; ``costs``: as
    ``toy_cost_model`` takes them."""
    space = LayoutSpace(16, 1, 4, vpp)
    program = compile_schedule(ScheduleShape(4, vpp, microbatches))
    model = toy_cost_model(4, vpp, microbatches, jitter=jitter, **costs)
    options = PlanOptions(top=6, samples=64)
    grid = ideal_step_ms(model, space, program) * options.tie_tolerance
    return space, program, model, options, grid


def plain_classes(space, program, model):
    """Every distinct prediction of the space, by the plain simulator, with its representative."""
    cuts, steps = plain_steps(space, program, model)
    found = candidates_of(space, program, model, cuts, None, None)
    near = np.array([c.near_bottleneck for c in found])
    peak = np.array([c.peak_memory_gib for c in found]) * 2**30
    return list(iter_tie_classes(steps, near, peak, cuts, space.layout_string)), cuts, steps
