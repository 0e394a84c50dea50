"""Rank layouts by simulated step time: enumerate small spaces, search large ones exactly.

Spaces up to ``SearchSpec.enumerate_limit`` layouts are scored whole; larger ones go to the
branch and bound of ``search.exact``, which proves the optimum under the cost model or reports
how far from it the pick can be.  Either way the work can be split into shards
(``search.shards``) that a caller's ``map_shards`` runs (Ray lives in
``ray_layout.runtime.sharding``, never here); the ranking is in ``search.ranking``.  The
baselines are always scored, whatever the search does: the config's current layout (where its
split states one), Megatron's default split shaped by its split flags, and the count-based rule.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from ray_layout.errors import ConfigError
from ray_layout.model.baselines import BaselineName, count_based
from ray_layout.model.costs import UnitCosts
from ray_layout.model.fields import ModelSpec
from ray_layout.model.job_flags import NO_EP_OVERLAP, EpOverlap
from ray_layout.model.layout import Layout
from ray_layout.model.memory_settings import MemorySettings
from ray_layout.model.spec import ParallelConfig, Recipe
from ray_layout.model.split import (
    PipelineSplit,
    current_layout,
    default_layout,
    virtual_pipeline_size,
)
from search.cost_model import CostModel, build_cost_model
from search.evaluate import hidden_ms, monte_carlo, stage_times, standard_normals, tail_ms
from search.pipeline_ops import ONE_F_ONE_B, ScheduleShape
from search.ranking import Candidate, PlanOptions, ShardResult, candidates_of, merge
from search.schedule import Program, compile_schedule
from search.shards import ENUMERATION, EXACT, ShardTask, run_shard
from search.simulator import Event, simulate, timeline
from search.space import LayoutSpace

EMPTY_STAGES_LIMIT = 5_000_000  # the exact search covers non-empty stages; these are enumerated
MapShards = Callable[[Callable[[ShardTask], ShardResult], list[ShardTask]], list[ShardResult]]


def _no_layout_reason(space: LayoutSpace) -> str:
    """Why a space holds no layout at all, said before any search: a plan of nothing is an
    error, not an empty table."""
    stages = f"PP={space.pp} x VPP={space.vpp} = {space.num_stages} stages"
    units = space.num_layers + (1 if space.mtp_num_layers else 0) + 2  # E, L and the MTP block
    if not space.allow_empty_stages and units < space.num_stages:
        return (
            f"no layout fills {stages} with {units} units (E, {space.num_layers} decoder layers,"
            f"{' the MTP block,' if space.mtp_num_layers else ''} L) when every stage holds one: "
            "lower VPP or PP, or allow empty stages (--allow-empty-stages)"
        )
    return f"no layout of this model fits {stages} under Megatron's rules"


def ideal_step_ms(cost_model: CostModel, space: LayoutSpace, program: Program) -> float:
    """All compute spread evenly over the ranks with no bubble: the grid unit of ties."""
    whole = space.item_counts(cost_model.units, cost_model.moe_pattern).sum(axis=0)
    per_microbatch = (cost_model.forward_ms + cost_model.backward_ms) @ whole
    return float(program.shape.num_microbatches * per_microbatch / space.pp)


def _layout_counts(
    layout: Layout, cost_model: CostModel
) -> tuple[LayoutSpace, np.ndarray, np.ndarray]:
    """(space, cuts, counts) of one given layout, in the search's own representation."""
    space, cuts = LayoutSpace.holding(layout)
    items = cuts[None]
    return space, items, space.unit_counts(items, cost_model.units, cost_model.moe_pattern)


def score_layout(
    layout: Layout, program: Program, cost_model: CostModel, options: PlanOptions
) -> Candidate:
    """Score one given layout (a baseline) exactly as the search scores its candidates."""
    space, items, counts = _layout_counts(layout, cost_model)
    steps = None
    if cost_model.has_jitter:
        steps = monte_carlo(
            program, cost_model, counts, standard_normals(program, options.samples, options.seed)
        )
    return candidates_of(space, program, cost_model, items, steps, options.hbm_gib)[0]


@dataclass(frozen=True)
class Baseline:
    name: BaselineName
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
    complete: bool = True  # False: the exact search ran out of its time (or node) budget
    ties: tuple[int, ...] = ()  # per candidate: layouts predicting exactly its step (itself too)
    bound_reason: str = ""  # exact search with a gap: which bound binds and why it stays open
    smallest_peak_gib: float = float("inf")  # lowest peak memory of any layout the search scored
    schedule: str = ONE_F_ONE_B  # the pipeline schedule simulated (ScheduleShape.name)

    def speedup(self, candidate: Candidate, baseline: BaselineName) -> float | None:
        """The baseline's mean step over the candidate's (None: no such baseline scored)."""
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
    shards: int = 1  # pieces of work for ``map_shards`` (run in this process without one)
    enumerate_limit: int = 100_000  # larger spaces go to the exact search
    node_limit: int = 50_000_000  # the exact search's budget of search-tree nodes
    time_limit_s: float = 7.0  # and of time (the plan ends within 10 s); unfinished: the gap


@dataclass(frozen=True)
class Problem:
    """Everything a step prediction depends on, travelling together: the model and its parallel
    sizes, the unit costs, the space and schedule to search (``spec``), how candidates are
    scored and kept (``options``), and the config's own split (its baselines)."""

    model: ModelSpec
    parallel: ParallelConfig
    costs: UnitCosts
    spec: SearchSpec
    options: PlanOptions
    split: PipelineSplit = field(default_factory=PipelineSplit)
    memory: MemorySettings = field(default_factory=MemorySettings)  # the job's memory flags
    p2p_overlap: bool = False  # the job's overlap_p2p_comm: interleaved p2p posted, waited later
    ep_overlap: EpOverlap = NO_EP_OVERLAP  # the job's EP all-to-all overlap (combined 1F1B)

    @classmethod
    def of(
        cls, recipe: Recipe, costs: UnitCosts, spec: SearchSpec, options: PlanOptions
    ) -> Problem:
        """A recipe's problem: its model, parallel sizes, split, memory and p2p flags, so no
        caller drops one."""
        flags = recipe.flags
        return cls(
            recipe.model,
            recipe.parallel,
            costs,
            spec,
            options,
            recipe.split,
            flags.memory,
            flags.p2p_overlap,
            flags.ep_overlap,
        )

    def tagged(self, candidate: Candidate) -> Candidate:
        """``candidate`` naming the recompute flags it was simulated with."""
        return replace(candidate, recompute=self.memory.recompute_flags())

    def schedule(self, parallel: ParallelConfig) -> tuple[Program, CostModel]:
        """The job's compiled schedule and cost model at ``parallel``'s sizes (its PP and VPP)."""
        spec = self.spec
        shape = ScheduleShape(
            parallel.pp,
            parallel.vpp,
            spec.num_microbatches,
            spec.group_size,
            self.p2p_overlap,
            self.ep_overlap.on,
        )
        program = compile_schedule(shape)
        cost_model = build_cost_model(
            self.model,
            parallel,
            self.costs,
            spec.num_microbatches,
            spec.group_size,
            self.memory,
            self.ep_overlap,
        )
        return program, cost_model


def plan(
    problem: Problem,
    progress: Callable[[str], None] | None = None,
    map_shards: MapShards | None = None,
) -> Plan:
    """Rank every valid layout (or search the space exactly) and score the two baselines.

    ``progress`` receives a line every 2 s of a search that takes longer; ``map_shards(function,
    tasks)`` returns ``[function(task) for task in tasks]`` in order, wherever it runs them
    (None: here, one after another).
    """
    model, parallel, spec, options = problem.model, problem.parallel, problem.spec, problem.options
    space = LayoutSpace.of(
        model,
        parallel,
        allow_empty_stages=spec.allow_empty_stages,
        allow_standalone_mtp=spec.allow_standalone_mtp,
    )
    program, cost_model = problem.schedule(parallel)
    grid_ms = ideal_step_ms(cost_model, space, program) * options.tie_tolerance
    counted = space.count()
    if counted.total == 0:
        raise ConfigError(_no_layout_reason(space))
    if spec.allow_empty_stages and counted.total > EMPTY_STAGES_LIMIT:
        raise ConfigError(
            f"with empty stages allowed the planner enumerates every layout, and this space has "
            f"{counted.total:,} (more than {EMPTY_STAGES_LIMIT:,}): leave empty stages out"
        )
    small = counted.total <= spec.enumerate_limit or spec.allow_empty_stages
    method = ENUMERATION if small or space.num_stages < 2 else EXACT
    shards = max(spec.shards, 1)
    common = (space, program, cost_model, options, grid_ms, method)
    limits = (spec.time_limit_s, spec.node_limit)
    tasks = [ShardTask(*common, shard, shards, *limits) for shard in range(shards)]
    if map_shards is None:
        results = [run_shard(task, progress) for task in tasks]
    else:
        results = map_shards(run_shard, tasks)
    result = merge(results, options.top)
    return Plan(
        candidates=tuple(problem.tagged(c) for c in result.candidates),
        baselines=baselines(problem),
        method=method,
        valid_layouts=counted.valid,
        space_size=counted.total,
        scored=result.scored,
        sampled=result.sampled,
        rejected_memory=result.rejected_memory,
        proven_bound_ms=result.bound_ms,
        nodes=result.nodes,
        complete=result.complete,
        ties=result.ties,
        bound_reason=result.bound_reason,
        smallest_peak_gib=result.smallest_peak_gib,
        schedule=program.shape.name,
    )


def score_given(layout: Layout, problem: Problem) -> Candidate:
    """Score one layout under its own schedule (its VPP comes from the layout)."""
    program, cost_model = _schedule_for(layout, problem)
    return problem.tagged(score_layout(layout, program, cost_model, problem.options))


def _schedule_for(layout: Layout, problem: Problem) -> tuple[Program, CostModel]:
    return problem.schedule(replace(problem.parallel, vpp=layout.vpp))


@dataclass(frozen=True)
class LayoutSimulation:
    """One layout's noise-free step in detail, for ``simulate`` and the report."""

    candidate: Candidate
    events: tuple[Event, ...]
    busy_ms: tuple[float, ...]
    idle_ms: tuple[float, ...]
    tail_ms: tuple[float, ...]
    bubble_fraction: float


def simulate_given(layout: Layout, problem: Problem) -> LayoutSimulation:
    program, cost_model = _schedule_for(layout, problem)
    _, _, counts = _layout_counts(layout, cost_model)
    forward, backward = stage_times(cost_model, counts)
    tail = tail_ms(cost_model, counts, program.shape.pp)
    hidden = hidden_ms(program, cost_model, counts)
    times = simulate(
        program,
        forward.T,
        backward.T,
        cost_model.p2p_ms,
        tail.T,
        keep_events=True,
        hidden_ms=hidden,
    )
    return LayoutSimulation(
        candidate=problem.tagged(score_layout(layout, program, cost_model, problem.options)),
        events=tuple(timeline(program, times)),
        busy_ms=tuple(times.busy[:, 0].tolist()),
        idle_ms=tuple(times.idle[:, 0].tolist()),
        tail_ms=tuple(times.tail[:, 0].tolist()),
        bubble_fraction=float(times.bubble_fraction[0]),
    )


def current_of(model: ModelSpec, parallel: ParallelConfig, split: PipelineSplit) -> Layout | None:
    """The layout the config runs today (None: its split states none), at the VPP its split
    flags give, else the run's: a VPP sweep or a ``--vpp`` override still compares with what the
    config runs.  A :class:`LayoutError` where Megatron would refuse the split."""
    if not split.given:
        return None
    vpp = virtual_pipeline_size(split, model.num_layers, parallel.pp) or parallel.vpp
    return current_layout(
        model.num_layers,
        model.mtp_num_layers,
        parallel.pp,
        vpp,
        split,
        tied_embeddings=model.tied_embeddings,
    )


def baselines(problem: Problem) -> tuple[Baseline, ...]:
    """The config's current layout (only where its split states one), Megatron's default shaped
    by the split flags and the count-based rule (both with the run's VPP), in that order; each
    under its own name even where two give the same layout, so every speedup can be read."""
    model, parallel, split = problem.model, problem.parallel, problem.split
    shape = (model.num_layers, model.mtp_num_layers, parallel.pp)
    makers: tuple[tuple[BaselineName, Callable[[], Layout | None]], ...] = (
        (BaselineName.CURRENT, lambda: current_of(model, parallel, split)),
        (BaselineName.DEFAULT, lambda: default_layout(*shape, parallel.vpp, split)),
        (BaselineName.COUNT_BASED, lambda: count_based(*shape, parallel.vpp)),
    )
    found = []
    for name, make in makers:
        try:
            layout = make()
            schedule = None if layout is None else _schedule_for(layout, problem)
        except ValueError as exc:  # a LayoutError: Megatron refuses it; else this step cannot
            found.append(Baseline(name, None, str(exc)))  # schedule its VPP (the current's own)
            continue
        if layout is not None and schedule is not None:
            scored = score_layout(layout, *schedule, problem.options)
            found.append(Baseline(name, problem.tagged(scored)))
    return tuple(found)
