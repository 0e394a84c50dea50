"""Per-unit costs from Megatron's per-rank timers: non-negative least squares over the profiling
runs' design rows, weighted by each rank's timer spread (see ``design``), then the step tail
(``step_fit``), p2p, jitter and memory calibration; every solver call is bounded (``solvers``).

A backward timer holds what the runs' recompute flags re-ran; unit costs hold a backward without
it (every consumer adds its own job's, ``recompute_cost``), so the fit takes it out: forward
first, then each rank's recomputation priced from that forward, subtracted before the backward
is solved for.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from ray_layout.errors import MeasurementError
from ray_layout.measure.declared import runs_parallel, suggest_layout
from ray_layout.measure.design import PAIR, design_rows, timer_spread, unit_columns
from ray_layout.measure.log_format import P2P_TIMER_OF_CALL
from ray_layout.measure.memory_fit import MemoryFit, fit_memory, memory_costs
from ray_layout.measure.observations import RunObservation
from ray_layout.measure.solvers import bounded_nnls, require_finite
from ray_layout.measure.step_fit import step_overheads, step_tail
from ray_layout.model.costs import (
    UnitCosts,
    costs_from_flops,
    provenance,
    stage_units,
    within_bounds,
)
from ray_layout.model.fields import ModelSpec
from ray_layout.model.layout import Layout
from ray_layout.model.memory_settings import PLAIN, MemorySettings
from ray_layout.model.recompute_cost import RecomputeShares, recompute_shares, stage_recompute_ms
from ray_layout.model.sizing import LOSS, MTP
from ray_layout.model.spec import ParallelConfig
from search.cost_model import inter_node_links
from search.pipeline_ops import P2PCall, ScheduleShape, Transfer
from search.schedule import rank_ops

RESIDUAL_WARNING = 0.05
# A PP rank whose compute the fitted unit costs miss by more than this is no noise: the run is
# not what it was declared to be, or the units cannot explain it.  A wrong layout or world
# misses by 25% to orders of magnitude; the emulated cluster on two busy CPU cores, by up to 15%.
RESIDUAL_BOUND = 0.25
RESIDUAL_FLOOR = 0.05  # of the busiest rank's compute: the least a residual is relative to


@dataclass(frozen=True)
class FitResult:
    costs: UnitCosts
    columns: tuple[str, ...]
    forward_ms: dict[str, float]
    backward_ms: dict[str, float]
    residuals: dict[str, list[float]]  # run -> relative error of each rank's fitted compute
    warnings: tuple[str, ...]
    memory: MemoryFit  # what set the memory calibration, with predicted against measured peaks
    p2p_latency_ms: float = 0.0  # added to every transfer so that simulated steps match
    step_errors: dict[str, float] = field(default_factory=dict)  # run -> simulated/measured - 1
    suggested_layouts: dict[str, str] = field(default_factory=dict)  # run -> what its timers show
    # per unit, the forward a backward re-ran under the runs' recompute flags, taken out of the
    # fitted backward (for a block-recomputed layer: one among its chunk's first); none: none
    recompute_ms: dict[str, float] = field(default_factory=dict)

    @property
    def max_residual(self) -> float:
        return max((abs(r) for rs in self.residuals.values() for r in rs), default=0.0)


def _solve(rows: np.ndarray, values: np.ndarray, columns: Sequence[str], what: str) -> np.ndarray:
    require_finite(what, rows, values)
    rank = np.linalg.matrix_rank(rows)
    if rank < len(columns):
        raise MeasurementError(
            f"the runs cannot tell apart all of {', '.join(columns)} ({what}: design rank "
            f"{rank} of {len(columns)}); add a run that `profile-layouts` proposes"
        )
    return bounded_nnls(rows, values, what)


def fit_costs(
    model: ModelSpec,
    parallel: ParallelConfig,
    runs: Sequence[RunObservation],
    base: UnitCosts | None = None,
    gpus_per_node: int | None = None,
    *,
    accept_residuals: bool = False,
    explicit: Collection[str] = (),
    memory: MemorySettings = PLAIN,
) -> FitResult:
    """Unit costs from profiling runs; what the timers cannot say comes from ``base`` (FLOPs by
    default): the split of m + L, and p2p on links no run crossed.  ``gpus_per_node`` is the
    node size the runs had (default: the base's), which says which links crossed nodes.

    A PP rank whose compute the fitted costs miss by more than ``RESIDUAL_BOUND`` means a run
    is not what it was declared to be (layout, sizes) or the units cannot explain it: a
    :class:`MeasurementError` lists each such rank and the layout the run's timers suggest,
    as it does for a run whose timers another layout explains within RESIDUAL_WARNING, unless
    ``accept_residuals`` (then they are warnings).

    The costs are for the sizes the runs ran (``declared.runs_parallel``): where they differ
    from ``parallel`` the runs' are taken with a warning, unless the size is in ``explicit``
    (sizes the user gave), which refuses the fit."""
    if not runs:
        raise MeasurementError("no profiling runs to fit")
    sized = [(run.name, run.parallel) for run in runs if run.parallel is not None]
    parallel, taken = runs_parallel(parallel, sized, explicit)
    base = base or costs_from_flops(model, parallel)
    if gpus_per_node is not None:
        base = replace(base, gpus_per_node=gpus_per_node)
    columns = unit_columns(model, any(run.layout.mtp_standalone for run in runs))
    compute = _fit_compute(model, runs, columns, base, recompute_shares(model, memory))
    fitted_f = dict(zip(columns, compute.forward, strict=True))
    fitted_b = dict(zip(columns, compute.backward, strict=True))
    residuals, suggested, warnings = _judge_residuals(runs, compute, accept_residuals)
    warnings = [*taken, *warnings]
    if sum(run.layout.pp for run in runs) <= len(columns):
        warnings.append(
            f"{len(columns)} unit costs from {sum(run.layout.pp for run in runs)} PP ranks: "
            "they fit any timers exactly, so nothing checks that each run's layout and sizes "
            "are right; add a run that `profile-layouts` proposes"
        )
    if PAIR in columns:
        warnings.append(
            "m and L were only measured together: their split follows FLOPs, which matters "
            "only for MTP-standalone layouts (profile one with --standalone-mtp to measure it)"
        )
    found = fit_memory(model, parallel, runs, base, memory)
    costs = replace(
        base,
        forward_ms=compute.per_unit(compute.forward, base.forward_ms),
        backward_ms=compute.per_unit(compute.backward, base.backward_ms),
        jitter_cv=_jitter(runs, compute),
        **memory_costs(found, base),
        source="fit",
        **provenance(model, parallel),
        **step_tail(model, parallel, runs),
        **_p2p(runs, base, parallel),
    )
    latency, fixed, step_errors, overlapping = step_overheads(model, parallel, costs, runs, memory)
    warnings += overlapping
    costs = replace(
        costs,
        p2p_intra_node_ms=costs.p2p_intra_node_ms + latency,
        p2p_inter_node_ms=costs.p2p_inter_node_ms + latency,
        tail_fixed_ms=fixed,
    )
    costs, clipped = within_bounds(costs)
    warned = (*warnings, *clipped)
    shown = {name: str(layout) for name, layout in suggested.items()}
    return FitResult(
        costs,
        columns,
        fitted_f,
        fitted_b,
        residuals,
        warned,
        found,
        latency,
        step_errors,
        shown,
        compute.recomputed(),
    )


def _judge_residuals(
    runs: Sequence[RunObservation], compute: _Compute, accept: bool
) -> tuple[dict[str, list[float]], dict[str, Layout], list[str]]:
    """Each run's residuals per PP rank, the layouts suspect runs' timers show, and warnings;
    raises when a rank is off by more than RESIDUAL_BOUND, unless ``accept``."""
    residuals = {run.name: _residuals(run, compute) for run in runs}
    off = {
        name: [(rank, e) for rank, e in enumerate(errors) if abs(e) > RESIDUAL_WARNING]
        for name, errors in residuals.items()
    }
    suggested = _suggested_layouts(runs, compute, residuals)
    refused = {n: [(r, e) for r, e in ranks if abs(e) > RESIDUAL_BOUND] for n, ranks in off.items()}
    if any(refused.values()) and not accept:
        raise MeasurementError(_residual_refusal(refused, suggested))
    if suggested and not accept:  # within the bound, but another layout explains the timers
        declared = {run.name: run.layout for run in runs}
        wrong = "; ".join(
            f"{name}: declared as {declared[name]}, but its timers show layout {layout} (the "
            f"declared one misses a PP rank by {max(map(abs, residuals[name])):.1%})"
            for name, layout in suggested.items()
        )
        raise MeasurementError(
            f"{wrong}; give each run the layout it ran, or accept the fit with --accept-residuals"
        )
    warnings = [
        f"{name}: PP rank {rank} compute is {error:+.1%} off the fitted costs (above 5%: noisy "
        "runs, or a cost the units do not explain)"
        for name, ranks in off.items()
        for rank, error in ranks
    ]
    warnings += [f"{name}: its timers suggest layout {lay}" for name, lay in suggested.items()]
    return residuals, suggested, warnings


@dataclass(frozen=True)
class _Compute:
    """Fitted ms per column, the backward without recomputation, and what the runs' backward
    re-ran on top: their recompute ``shares`` of each unit's forward."""

    model: ModelSpec
    columns: tuple[str, ...]
    forward: np.ndarray  # (columns,)
    backward: np.ndarray  # (columns,)
    base: UnitCosts  # what splits m + L where only their sum was measured
    shares: RecomputeShares

    def per_unit(self, fitted: np.ndarray, flops: Mapping[str, float]) -> dict[str, float]:
        return _expand_pair(dict(zip(self.columns, fitted, strict=True)), flops)

    def recompute_ms(self, layout: Layout) -> np.ndarray:
        """(PP,) what one micro-batch's backward re-runs on each rank, over its chunks."""
        forward = self.per_unit(self.forward, self.base.forward_ms)
        units = stage_units(self.model, layout.stages)
        stages = [stage_recompute_ms(stage, forward, self.shares) for stage in units]
        return np.array(stages).reshape(layout.vpp, layout.pp).sum(axis=0)

    def rank_ms(self, layout: Layout) -> np.ndarray:
        """(PP,) forward + backward ms per micro-batch of each rank as its timers measure them,
        recomputation included."""
        rows = design_rows(self.model, layout, self.columns)
        return rows @ (self.forward + self.backward) + self.recompute_ms(layout)

    def every_ms(self, units: Sequence[str]) -> np.ndarray:
        """(units,) what every copy of each unit (or m + L) re-runs, block recompute aside."""
        forward = self.per_unit(self.forward, self.base.forward_ms)
        parts = [(MTP, LOSS) if unit == PAIR else (unit,) for unit in units]
        return np.array([sum(forward[u] * self.shares.every.get(u, 0.0) for u in p) for p in parts])

    def recomputed(self) -> dict[str, float]:
        """Per unit, the forward one recomputed copy re-runs (a block-recomputed layer: one of
        its chunk's first); none where nothing is."""
        forward = self.per_unit(self.forward, self.base.forward_ms)
        block = self.shares.block if self.shares.block_layers else {}
        every = dict(zip(forward, self.every_ms(list(forward)), strict=True))
        found = {u: every[u] + ms * block.get(u, 0.0) for u, ms in forward.items()}
        return {u: ms for u, ms in found.items() if ms > 0}

    def unit_ms(self) -> dict[str, float]:
        """Forward + backward ms per unit, with what every copy of it re-runs."""
        forward = self.per_unit(self.forward, self.base.forward_ms)
        backward = self.per_unit(self.backward, self.base.backward_ms)
        every = dict(zip(forward, self.every_ms(list(forward)), strict=True))
        return {u: forward[u] + backward[u] + every[u] for u in forward}


def _fit_compute(
    model: ModelSpec,
    runs: Sequence[RunObservation],
    columns: Sequence[str],
    base: UnitCosts,
    shares: RecomputeShares,
) -> _Compute:
    """Forward, then backward ms per unit: NNLS over every steady interval and PP rank, each rank
    weighted by the inverse of its timer's spread (``design.timer_spread`` of its mean), as the
    profile design assumes: a unit alone on a light rank is taken from there, not from the
    noise of the heavy ranks it also sits on (1 ms of E beside 40 ms of layers).  Each rank's
    backward timer holds what the runs' recompute flags re-ran (``shares``), priced from the
    fitted forward and taken out before the backward is solved for."""
    none = [np.zeros(run.layout.pp) for run in runs]
    forward = _fit_timer(model, runs, columns, "forward_ms", none)
    compute = _Compute(model, tuple(columns), forward, np.zeros(len(columns)), base, shares)
    recomputed = [compute.recompute_ms(run.layout) for run in runs]
    backward = _fit_timer(model, runs, columns, "backward_ms", recomputed)
    return replace(compute, backward=backward)


def _fit_timer(
    model: ModelSpec,
    runs: Sequence[RunObservation],
    columns: Sequence[str],
    timer: str,
    known: Sequence[np.ndarray],
) -> np.ndarray:
    """One compute timer's ms per column, less what is ``known`` of each run's ranks (PP,)."""
    rows, values = [], []
    for run, taken in zip(runs, known, strict=True):
        per_batch = getattr(run, timer) / run.num_microbatches  # (intervals, PP)
        spread = timer_spread(per_batch.mean(axis=0))
        design = design_rows(model, run.layout, columns) / spread[:, None]
        rows.append(np.tile(design, (per_batch.shape[0], 1)))
        values.append(((per_batch - taken) / spread).ravel())
    what = timer.removesuffix("_ms") + "-compute"
    return _solve(np.concatenate(rows), np.concatenate(values), columns, what)


def _stage_ms(run: RunObservation) -> np.ndarray:
    """(PP,) measured forward + backward ms per micro-batch of each rank."""
    return (run.forward_ms + run.backward_ms).mean(axis=0) / run.num_microbatches


def _residuals(run: RunObservation, compute: _Compute) -> list[float]:
    """Each PP rank's fitted minus measured compute (recomputation in both), relative to the
    measured compute, or to RESIDUAL_FLOOR of the run's busiest rank where less: a rank of
    little more than the embedding computes for microseconds, no yardstick for a fit."""
    predicted = compute.rank_ms(run.layout)
    measured = _stage_ms(run)
    scale = np.maximum(measured, max(RESIDUAL_FLOOR * measured.max(), 1e-9))
    return ((predicted - measured) / scale).tolist()


def _suggested_layouts(
    runs: Sequence[RunObservation], compute: _Compute, residuals: dict[str, list[float]]
) -> dict[str, Layout]:
    """Runs declared as a layout they did not run, and the one their timers show.

    A run is suspect when the fit misses it by more than RESIDUAL_WARNING while the other runs
    agree without it (they identify every unit and stay within RESIDUAL_WARNING); the layout
    its timers show under the others' costs is suggested when it is another and explains the
    run within RESIDUAL_WARNING.  With two runs that disagree either may be the wrong one.  The
    search prices each unit with what every copy of it re-runs; block recomputation, which
    depends on where a chunk starts, is left to the check of the layout found."""
    model, columns, found = compute.model, compute.columns, {}
    for index, run in enumerate(runs):
        others = [*runs[:index], *runs[index + 1 :]]
        if max(map(abs, residuals[run.name])) <= RESIDUAL_WARNING or not others:
            continue
        try:
            theirs = _fit_compute(model, others, columns, compute.base, compute.shares)
        except MeasurementError:
            continue  # the others alone cannot say what the units cost
        rest = [e for other in others for e in _residuals(other, theirs)]
        if max(map(abs, rest)) > RESIDUAL_WARNING:
            continue  # without this run the others still disagree: not (only) this run
        layout = suggest_layout(model, run.layout, _stage_ms(run), theirs.unit_ms())
        if layout is None or layout.stages == run.layout.stages:
            continue
        explained = _residuals(replace(run, layout=layout), theirs)
        if max(map(abs, explained)) <= RESIDUAL_WARNING:
            found[run.name] = layout
    return found


def _residual_refusal(
    refused: dict[str, list[tuple[int, float]]], suggested: dict[str, Layout]
) -> str:
    runs = []
    for name, ranks in refused.items():
        if ranks:
            listed = ", ".join(f"PP rank {rank} {error:+.1%}" for rank, error in ranks)
            hint = f" (its timers suggest layout {suggested[name]})" if name in suggested else ""
            runs.append(f"{name}: {listed}{hint}")
    return (
        f"the fitted costs miss the measured compute by more than {RESIDUAL_BOUND:.0%}: "
        f"{'; '.join(runs)}; check each run's layout and parallel sizes, or accept the fit "
        "with --accept-residuals"
    )


def _expand_pair(fitted: dict[str, float], flops: dict[str, float]) -> dict[str, float]:
    """Unit costs with m + L split in FLOP proportion when only their sum was measured."""
    costs = {u: float(v) for u, v in fitted.items() if u != PAIR}
    if PAIR in fitted:
        share = flops[MTP] / max(flops[MTP] + flops[LOSS], 1e-12)
        costs[MTP] = float(fitted[PAIR]) * share
        costs[LOSS] = float(fitted[PAIR]) * (1 - share)
    return costs


def _jitter(runs: Sequence[RunObservation], compute: _Compute) -> dict[str, float]:
    """Per-op coefficient of variation per unit from interval-to-interval spread: an interval's
    per-micro-batch time averages M ops, so an op's variance is M times the interval's; a rank's
    op variance is the sum of its units' (cv_u x cost_u)^2, the cost with what every copy
    re-runs, as the simulator spreads a recomputing backward."""
    model, columns = compute.model, compute.columns
    costs = compute.forward + compute.backward + compute.every_ms(columns)
    rows, variances = [], []
    for run in runs:
        if run.forward_ms.shape[0] < 2:
            continue
        per_batch = (run.forward_ms + run.backward_ms) / run.num_microbatches
        rows.append(design_rows(model, run.layout, columns))
        variances.append(per_batch.var(axis=0, ddof=1) * run.num_microbatches)
    if not rows:
        return {}
    spread = bounded_nnls(np.concatenate(rows) * costs**2, np.concatenate(variances), "jitter")
    cvs = {u: float(np.sqrt(s)) for u, s in zip(columns, spread, strict=True)}
    if PAIR in cvs:
        cvs[MTP] = cvs[LOSS] = cvs.pop(PAIR)
    return cvs


def _p2p(
    runs: Sequence[RunObservation], base: UnitCosts, parallel: ParallelConfig
) -> dict[str, float]:
    """Bare transfer times within and across nodes: per link kind, the fastest per-call time of
    any p2p timer on any rank all of whose calls cross only that kind of boundary (a call whose
    partner was already waiting).  A timer whose calls mix kinds (the interleaved schedule's
    combined calls, with one direction off in some) says nothing about either.  A run with
    overlapped p2p says nothing at all: its steady calls only post their transfers and its
    blocking ones wait for the fill and the drain.  A kind no run crossed keeps the guess's
    ratio to the other."""
    fastest = {False: np.inf, True: np.inf}  # by "crosses nodes"
    for run in (run for run in runs if not run.overlapped_p2p):
        pp = run.layout.pp
        crossing = inter_node_links(replace(parallel, pp=pp), base.gpus_per_node)
        ops = rank_ops(ScheduleShape(pp, run.layout.vpp, run.num_microbatches))
        for rank, rank_list in enumerate(ops):
            below, above = bool(crossing[(rank - 1) % pp]), bool(crossing[rank])
            calls: dict[str, list[bool]] = {}  # timer -> whether each of its calls crosses
            for op in rank_list:
                if isinstance(op, P2PCall) and op.name in P2P_TIMER_OF_CALL:
                    crosses = any(
                        above if t in (Transfer.SEND_NEXT, Transfer.RECV_NEXT) else below
                        for t in op.transfers
                    )
                    calls.setdefault(P2P_TIMER_OF_CALL[op.name], []).append(crosses)
            for timer, kinds in calls.items():
                if timer not in run.timers or len(set(kinds)) > 1:
                    continue
                per_call = float(run.timers[timer][:, rank].min()) / len(kinds)
                fastest[kinds[0]] = min(fastest[kinds[0]], per_call)
    intra, inter = fastest[False], fastest[True]
    if not np.isfinite(intra) and not np.isfinite(inter):
        return {}
    ratio = max(base.p2p_inter_node_ms / max(base.p2p_intra_node_ms, 1e-12), 1.0)
    if not np.isfinite(inter):
        inter = intra * ratio
    elif not np.isfinite(intra):
        intra = inter / ratio
    return {"p2p_intra_node_ms": intra, "p2p_inter_node_ms": max(inter, intra)}
