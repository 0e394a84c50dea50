"""A plan's search split into shards: pure functions of their task, so any map can run them (in
this process, or as Ray tasks by ``ray_layout.runtime.sharding``).

Enumeration shards take blocks ``shard, shard + num_shards, ...`` of the space; exact-search
shards take the subtrees whose first two boundaries sum to ``shard`` modulo ``num_shards``.
Every score is a pure function of the layout (common random numbers), so merging shard results
(``search.ranking.merge``) gives the same top for any number of shards.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from ray_layout.model.sizing import GIB
from search.cost_model import CostModel
from search.evaluate import score
from search.exact import ExactResult, exact_search
from search.progress import ProgressClock
from search.ranking import PlanOptions, ShardResult, best_of
from search.schedule import Program
from search.space import LayoutSpace
from search.ties import TieClass, critical_ranks, iter_tie_classes, prediction_key

ENUMERATION, EXACT = "enumeration", "exact search"


@dataclass(frozen=True)
class ShardTask:
    """Everything one shard needs; results depend on nothing else."""

    space: LayoutSpace
    program: Program
    cost_model: CostModel
    options: PlanOptions
    grid_ms: float
    method: str  # ENUMERATION or EXACT
    shard: int = 0
    num_shards: int = 1
    time_limit_s: float = float("inf")  # exact search: stop and report the proven gap
    node_limit: int = 50_000_000


def run_shard(task: ShardTask, progress: Callable[[str], None] | None = None) -> ShardResult:
    """The shard's ranked candidates (the function a ``map_shards`` maps over tasks)."""
    if task.method == ENUMERATION:
        return evaluate_shard(
            task.space,
            task.program,
            task.cost_model,
            task.options,
            task.grid_ms,
            task.shard,
            task.num_shards,
            progress,
        )
    return exact_shard(task, progress)


def evaluate_shard(
    space: LayoutSpace,
    program: Program,
    cost_model: CostModel,
    options: PlanOptions,
    grid_ms: float,
    shard: int = 0,
    num_shards: int = 1,
    progress: Callable[[str], None] | None = None,
) -> ShardResult:
    """Score every layout of blocks ``shard, shard + num_shards, ...`` and rank the best."""
    clock = ProgressClock(progress)
    kept: list[tuple[np.ndarray, ...]] = []
    scored = rejected = 0
    smallest_peak = float("inf")
    total = space.count().total
    blocks = itertools.islice(space.cut_blocks(options.block_size), shard, None, num_shards)
    for cuts in blocks:
        scores = score(
            program, cost_model, space.unit_counts(cuts, cost_model.units, cost_model.moe_pattern)
        )
        scored += len(cuts)
        if len(cuts):
            smallest_peak = min(smallest_peak, float(scores.peak_memory_bytes.min()) / GIB)
        fits = np.ones(len(cuts), dtype=bool)
        if options.hbm_gib is not None:
            fits = scores.peak_memory_bytes <= options.hbm_gib * GIB
            rejected += int((~fits).sum())
        kept.append(
            (
                scores.noise_free_ms[fits],
                critical_ranks(scores.rank_load_ms[fits]),
                scores.peak_memory_bytes[fits],
                cuts[fits],
            )
        )
        done = scored
        clock.tick(lambda done=done: f"enumeration, {done:,} of {total:,} layouts simulated")
    if not kept or not sum(len(part[0]) for part in kept):
        return ShardResult((), scored, 0, rejected, smallest_peak_gib=smallest_peak)
    steps, critical, peak, cuts = (np.concatenate(column) for column in zip(*kept, strict=True))
    classes = iter_tie_classes(steps, critical, peak, cuts, space.layout_string)
    result = best_of(space, program, cost_model, options, classes, grid_ms)
    return replace(result, scored=scored, rejected_memory=rejected, smallest_peak_gib=smallest_peak)


def exact_shard(task: ShardTask, progress: Callable[[str], None] | None = None) -> ShardResult:
    """Prove the optimum first (top 1, every layout that ties it), then spend what is left of
    the time on the rest of the top; what the second pass leaves unproven is reported."""
    started = time.monotonic()

    def search(top: int, time_limit_s: float, relaxation=None) -> ExactResult:
        return exact_search(
            task.space,
            task.program,
            cost_model=task.cost_model,
            top=top,
            hbm_gib=task.options.hbm_gib,
            node_limit=task.node_limit,
            time_limit_s=time_limit_s,
            shard=task.shard,
            num_shards=task.num_shards,
            progress=progress,
            relaxation=relaxation,
        )

    passes = [search(1, task.time_limit_s)]
    remaining = task.time_limit_s - (time.monotonic() - started)
    if task.options.top > 1 and passes[0].complete and remaining > 0:
        passes.append(search(task.options.top, remaining, passes[0].relaxation))
    classes: dict[float, TieClass] = {}
    for found in passes:  # a pass cut short may have counted fewer of a class's layouts
        for tie in found.classes:
            if tie.step_ms not in classes or tie.count > classes[tie.step_ms].count:
                classes[tie.step_ms] = tie
    ranked = [classes[value] for value in sorted(classes)]
    result = best_of(task.space, task.program, task.cost_model, task.options, ranked, task.grid_ms)
    sampled = {float(prediction_key(c.noise_free_ms)) for c in result.candidates}
    unlisted = [tie.step_ms for tie in ranked if tie.step_ms not in sampled]
    proving = max(passes, key=lambda found: found.proven_bound_ms)
    bound = min([proving.proven_bound_ms, *unlisted])
    return replace(
        result,
        scored=sum(found.simulated for found in passes),
        rejected_memory=max(found.rejected_memory for found in passes),
        bound_ms=bound,
        nodes=sum(found.nodes for found in passes),
        complete=passes[-1].complete and (len(passes) == 2 or task.options.top == 1),
        bound_reason=proving.bound_reason if bound == proving.proven_bound_ms else "",
        smallest_peak_gib=min(found.smallest_peak_gib for found in passes),
    )
