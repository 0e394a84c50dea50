"""Rank layouts by simulated step time: enumerate (sharded over Ray when large) or search exactly.

Ranking: mean Monte Carlo step time, ties (within ``tie_tolerance`` of the ideal step, on a fixed
grid so that ties are the same for every shard) broken by fewer ranks near the bottleneck, then
more memory headroom, then the layout string.  Monte Carlo is only run where it can change the
top: step time is a max of sums of op times, a convex function, so with mean-one noise the mean
is never below the noise-free step (Jensen); a layout whose noise-free step is already worse than
the k-th best mean cannot enter the top k.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from ray_layout.errors import LayoutError
from ray_layout.model.baselines import count_based, megatron_default
from ray_layout.model.costs import UnitCosts
from ray_layout.model.layout import Layout, format_stages
from ray_layout.model.spec import ModelSpec, ParallelConfig
from search.cost_model import CostModel, build_cost_model
from search.evaluate import Scores, monte_carlo, score, stage_times, standard_normals, tail_ms
from search.exact import exact_search
from search.schedule import Event, Program, compile_schedule, simulate, timeline
from search.space import LayoutSpace

GIB = 2**30


@dataclass(frozen=True)
class PlanOptions:
    top: int = 10
    samples: int = 256  # Monte Carlo samples per layout (unused without jitter)
    seed: int = 0
    hbm_gib: float | None = None
    tie_tolerance: float = 0.0025
    block_size: int = 4096
    monte_carlo_batch: int = 32


@dataclass(frozen=True)
class Candidate:
    """A scored layout, as every report shows it."""

    layout: str
    stages: tuple[str, ...]
    pp: int
    mean_ms: float
    p90_ms: float
    noise_free_ms: float
    bottleneck_rank: int
    near_bottleneck: int
    memory_gib: tuple[float, ...]
    fits: bool
    mtp_standalone: bool

    @property
    def peak_memory_gib(self) -> float:
        return max(self.memory_gib)


@dataclass(frozen=True)
class ShardResult:
    """What one shard returns: its best candidates and how much it looked at."""

    candidates: tuple[Candidate, ...]
    scored: int  # layouts simulated without noise
    sampled: int  # layouts simulated with Monte Carlo noise
    rejected_memory: int  # layouts over the HBM limit
    keys: tuple[tuple, ...] = field(default=(), repr=False)


def ideal_step_ms(model: CostModel, space: LayoutSpace, program: Program) -> float:
    """All compute spread evenly over the ranks with no bubble: the grid unit of ties."""
    whole = space.item_counts(model.units, model.moe_pattern).sum(axis=0)
    per_microbatch = (model.forward_ms + model.backward_ms) @ whole
    return float(program.num_microbatches * per_microbatch / space.pp)


def rank_key(candidate: Candidate, grid_ms: float, hbm_gib: float | None) -> tuple:
    headroom = (hbm_gib or 0.0) - candidate.peak_memory_gib
    return (
        int(candidate.mean_ms // grid_ms),
        candidate.near_bottleneck,
        -round(headroom, 6),
        candidate.mean_ms,
        candidate.layout,
    )


def _candidate(
    space: LayoutSpace,
    cuts: np.ndarray,
    scores: Scores,
    index: int,
    steps: np.ndarray | None,
    hbm_gib: float | None,
) -> Candidate:
    stages = space.stages_from_cuts(tuple(int(c) for c in cuts))
    memory = tuple(float(x) / GIB for x in scores.memory_bytes[index])
    noise_free = float(scores.noise_free_ms[index])
    return Candidate(
        layout=format_stages(stages),
        stages=stages,
        pp=space.pp,
        mean_ms=float(steps.mean()) if steps is not None else noise_free,
        p90_ms=float(np.quantile(steps, 0.9)) if steps is not None else noise_free,
        noise_free_ms=noise_free,
        bottleneck_rank=int(scores.bottleneck_rank[index]),
        near_bottleneck=int(scores.near_bottleneck[index]),
        memory_gib=memory,
        fits=hbm_gib is None or max(memory) <= hbm_gib,
        mtp_standalone=bool(scores.standalone[index]),
    )


def _take(scores: Scores, mask: np.ndarray) -> Scores:
    return Scores(
        noise_free_ms=scores.noise_free_ms[mask],
        rank_load_ms=scores.rank_load_ms[mask],
        memory_bytes=scores.memory_bytes[mask],
        standalone=scores.standalone[mask],
    )


def _concat(parts: list[Scores]) -> Scores:
    return Scores(
        noise_free_ms=np.concatenate([p.noise_free_ms for p in parts]),
        rank_load_ms=np.concatenate([p.rank_load_ms for p in parts]),
        memory_bytes=np.concatenate([p.memory_bytes for p in parts]),
        standalone=np.concatenate([p.standalone for p in parts]),
    )


def best_of(
    space: LayoutSpace,
    program: Program,
    model: CostModel,
    options: PlanOptions,
    cuts: np.ndarray,
    scores: Scores,
    grid_ms: float,
) -> tuple[list[Candidate], int]:
    """The top ``options.top`` of scored layouts, Monte Carlo run in noise-free order until no
    remaining layout can enter the top (Jensen's bound). Returns (top, layouts sampled)."""
    order = np.argsort(scores.noise_free_ms, kind="stable")
    top: list[Candidate] = []
    keys: list[tuple] = []
    sampled = 0
    normals = standard_normals(program, options.samples, options.seed) if model.has_jitter else None
    position = 0
    while position < len(order):
        if len(top) >= options.top:
            worst_mean = max(c.mean_ms for c in top)
            if scores.noise_free_ms[order[position]] > worst_mean + grid_ms:
                break
        batch = order[position : position + options.monte_carlo_batch]
        position += len(batch)
        steps = None
        if normals is not None:
            counts = space.unit_counts(cuts[batch], model.units, model.moe_pattern)
            steps = monte_carlo(program, model, counts, normals)
            sampled += len(batch)
        for row, index in enumerate(batch):
            candidate = _candidate(
                space,
                cuts[index],
                scores,
                int(index),
                None if steps is None else steps[row],
                options.hbm_gib,
            )
            top.append(candidate)
            keys.append(rank_key(candidate, grid_ms, options.hbm_gib))
        ranked = sorted(zip(keys, top, strict=True), key=lambda pair: pair[0])[: options.top]
        keys, top = [k for k, _ in ranked], [c for _, c in ranked]
    return top, sampled


def evaluate_shard(
    space: LayoutSpace,
    program: Program,
    model: CostModel,
    options: PlanOptions,
    grid_ms: float,
    shard: int = 0,
    num_shards: int = 1,
) -> ShardResult:
    """Score every layout of blocks ``shard, shard + num_shards, ...`` and keep the best.

    Shards differ only in which blocks they take, and every score is a pure function of the
    layout (common random numbers), so merging shard tops gives the same top for any sharding.
    """
    kept_cuts, kept_scores = [], []
    scored = rejected = 0
    for block_index, cuts in enumerate(space.cut_blocks(options.block_size)):
        if block_index % num_shards != shard:
            continue
        counts = space.unit_counts(cuts, model.units, model.moe_pattern)
        scores = score(program, model, counts)
        scored += len(cuts)
        fits = np.ones(len(cuts), dtype=bool)
        if options.hbm_gib is not None:
            fits = scores.peak_memory_bytes <= options.hbm_gib * GIB
            rejected += int((~fits).sum())
        kept_cuts.append(cuts[fits])
        kept_scores.append(_take(scores, fits))
    if not kept_cuts or not sum(len(c) for c in kept_cuts):
        return ShardResult((), scored, 0, rejected)
    cuts = np.concatenate(kept_cuts)
    top, sampled = best_of(space, program, model, options, cuts, _concat(kept_scores), grid_ms)
    keys = tuple(rank_key(c, grid_ms, options.hbm_gib) for c in top)
    return ShardResult(tuple(top), scored, sampled, rejected, keys)


def merge(results: list[ShardResult], top: int) -> ShardResult:
    """Shard tops into the overall top, by the same key every shard ranked with."""
    pairs = sorted(
        ((key, c) for r in results for key, c in zip(r.keys, r.candidates, strict=True)),
        key=lambda pair: pair[0],
    )[:top]
    return ShardResult(
        candidates=tuple(c for _, c in pairs),
        scored=sum(r.scored for r in results),
        sampled=sum(r.sampled for r in results),
        rejected_memory=sum(r.rejected_memory for r in results),
        keys=tuple(k for k, _ in pairs),
    )


def _layout_counts(layout: Layout, model: CostModel) -> tuple[LayoutSpace, np.ndarray, np.ndarray]:
    """(space, cuts, counts) of one given layout, in the search's own representation."""
    space, cuts = LayoutSpace.holding(layout)
    items = cuts[None]
    return space, items, space.unit_counts(items, model.units, model.moe_pattern)


def score_layout(
    layout: Layout, program: Program, model: CostModel, options: PlanOptions
) -> Candidate:
    """Score one given layout (a baseline) exactly as the search scores its candidates."""
    space, items, counts = _layout_counts(layout, model)
    scores = score(program, model, counts)
    steps = None
    if model.has_jitter:
        steps = monte_carlo(
            program, model, counts, standard_normals(program, options.samples, options.seed)
        )[0]
    return _candidate(space, items[0], scores, 0, steps, options.hbm_gib)


@dataclass(frozen=True)
class Baseline:
    name: str
    candidate: Candidate | None
    reason: str = ""  # why there is no candidate (Megatron has no default split here, ...)


@dataclass(frozen=True)
class Plan:
    """The ranked layouts of a search, its baselines, and what the search did."""

    candidates: tuple[Candidate, ...]
    baselines: tuple[Baseline, ...]
    method: str  # "enumeration" or "exact search"
    valid_layouts: int  # Megatron-valid layouts under the stage rules
    space_size: int  # of which the search considered (standalone MTP left out unless asked)
    scored: int
    sampled: int
    rejected_memory: int
    proven_bound_ms: float | None = None  # exact search: nothing it skipped is faster
    nodes: int = 0
    complete: bool = True  # False: the exact search ran out of its node budget

    def speedup(self, candidate: Candidate, baseline: str) -> float | None:
        for b in self.baselines:
            if b.name == baseline and b.candidate is not None:
                return b.candidate.mean_ms / candidate.mean_ms
        return None


@dataclass(frozen=True)
class SearchSpec:
    """What to search: the space's rules, the schedule, and how to split the work."""

    num_microbatches: int
    group_size: int | None = None
    allow_standalone_mtp: bool = False
    allow_empty_stages: bool = False
    shards: int = 1  # Ray tasks; 1 runs in this process
    enumerate_limit: int = 5_000_000  # larger spaces go to the exact search
    node_limit: int = 2_000_000  # the exact search's budget of search-tree nodes
    time_limit_s: float = 20.0  # and of time; an unfinished search reports its proven gap


def plan(
    model: ModelSpec,
    parallel: ParallelConfig,
    costs: UnitCosts,
    spec: SearchSpec,
    options: PlanOptions,
) -> Plan:
    """Rank every valid layout (or search the space exactly) and score the two baselines."""
    space = LayoutSpace(
        model.num_layers,
        model.mtp_num_layers,
        parallel.pp,
        parallel.vpp,
        allow_empty_stages=spec.allow_empty_stages,
        allow_standalone_mtp=spec.allow_standalone_mtp,
    )
    program = compile_schedule(parallel.pp, parallel.vpp, spec.num_microbatches, spec.group_size)
    cost_model = build_cost_model(model, parallel, costs, spec.num_microbatches, spec.group_size)
    grid_ms = ideal_step_ms(cost_model, space, program) * options.tie_tolerance
    counted = space.count()
    if counted.total <= spec.enumerate_limit:
        if spec.shards > 1:
            result = _sharded(space, program, cost_model, options, grid_ms, spec.shards)
        else:
            result = evaluate_shard(space, program, cost_model, options, grid_ms)
        bound, nodes, complete, method = None, 0, True, "enumeration"
    else:
        found = exact_search(
            space, program, cost_model, options.top, options.hbm_gib,
            node_limit=spec.node_limit, time_limit_s=spec.time_limit_s,
        )  # fmt: skip
        counts = space.unit_counts(found.cuts, cost_model.units, cost_model.moe_pattern)
        scores = score(program, cost_model, counts)
        top, sampled = best_of(space, program, cost_model, options, found.cuts, scores, grid_ms)
        result = ShardResult(tuple(top), found.simulated, sampled, found.rejected_memory)
        bound, nodes, complete = found.proven_bound_ms, found.nodes, found.complete
        method = "exact search"
    return Plan(
        candidates=result.candidates,
        baselines=baselines(model, parallel, costs, spec, options),
        method=method,
        valid_layouts=counted.valid,
        space_size=counted.total,
        scored=result.scored,
        sampled=result.sampled,
        rejected_memory=result.rejected_memory,
        proven_bound_ms=bound,
        nodes=nodes,
        complete=complete,
    )


def _sharded(
    space: LayoutSpace,
    program: Program,
    model: CostModel,
    options: PlanOptions,
    grid_ms: float,
    shards: int,
) -> ShardResult:
    """The same top as one process, computed by ``shards`` Ray tasks (Ray must be running)."""
    import ray

    remote = ray.remote(evaluate_shard)
    shared = [ray.put(x) for x in (space, program, model, options)]
    refs = [remote.remote(*shared, grid_ms, shard, shards) for shard in range(shards)]
    return merge(ray.get(refs), options.top)


def score_given(
    layout: Layout,
    model: ModelSpec,
    parallel: ParallelConfig,
    costs: UnitCosts,
    spec: SearchSpec,
    options: PlanOptions,
) -> Candidate:
    """Score one layout under its own schedule (its VPP comes from the layout)."""
    program, cost_model = _schedule_for(layout, model, parallel, costs, spec)
    return score_layout(layout, program, cost_model, options)


def _schedule_for(
    layout: Layout, model: ModelSpec, parallel: ParallelConfig, costs: UnitCosts, spec: SearchSpec
) -> tuple[Program, CostModel]:
    run = replace(parallel, vpp=layout.vpp)
    program = compile_schedule(run.pp, run.vpp, spec.num_microbatches, spec.group_size)
    return program, build_cost_model(model, run, costs, spec.num_microbatches, spec.group_size)


@dataclass(frozen=True)
class LayoutSimulation:
    """One layout's noise-free step in detail, for ``simulate`` and the report."""

    candidate: Candidate
    events: tuple[Event, ...]
    busy_ms: tuple[float, ...]
    idle_ms: tuple[float, ...]
    tail_ms: tuple[float, ...]
    bubble_fraction: float


def simulate_given(
    layout: Layout,
    model: ModelSpec,
    parallel: ParallelConfig,
    costs: UnitCosts,
    spec: SearchSpec,
    options: PlanOptions,
) -> LayoutSimulation:
    program, cost_model = _schedule_for(layout, model, parallel, costs, spec)
    _, _, counts = _layout_counts(layout, cost_model)
    forward, backward = stage_times(cost_model, counts)
    tail = tail_ms(cost_model, counts, program.pp)
    times = simulate(program, forward.T, backward.T, cost_model.p2p_ms, tail.T, keep_events=True)
    return LayoutSimulation(
        candidate=score_layout(layout, program, cost_model, options),
        events=tuple(timeline(program, times)),
        busy_ms=tuple(times.busy[:, 0].tolist()),
        idle_ms=tuple(times.idle[:, 0].tolist()),
        tail_ms=tuple(times.tail[:, 0].tolist()),
        bubble_fraction=float(times.bubble_fraction[0]),
    )


def baselines(
    model: ModelSpec,
    parallel: ParallelConfig,
    costs: UnitCosts,
    spec: SearchSpec,
    options: PlanOptions,
) -> tuple[Baseline, ...]:
    """Megatron's default split (with the run's VPP) and the count-based rule (no VPP)."""
    found = []
    makers = (
        ("Megatron default", lambda: megatron_default(
            model.num_layers, model.mtp_num_layers, parallel.pp, parallel.vpp)),
        ("count-based rule", lambda: count_based(
            model.num_layers, model.mtp_num_layers, parallel.pp)),
    )  # fmt: skip
    for name, make in makers:
        try:
            layout = make()
        except LayoutError as exc:
            found.append(Baseline(name, None, str(exc)))
            continue
        found.append(Baseline(name, score_given(layout, model, parallel, costs, spec, options)))
    return tuple(found)
