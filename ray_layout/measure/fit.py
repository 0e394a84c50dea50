"""Per-unit costs from Megatron's per-rank timers: the profile design and the fit.

Every PP rank's ``forward-compute`` (and ``backward-compute``) timer is the sum, over the
micro-batches it ran, of the units its stage holds; per micro-batch that is one linear equation
``sum_u count[rank, u] * cost[u] = measured[rank]``.  A few runs with different layouts give
enough independent equations to solve for every unit (non-negative least squares); the profile
design picks those runs so that the system is well conditioned, fits in memory and runs fast.

What one layout keeps together cannot be told apart: with MTP always beside the loss only the
sum m + L is identified (and that is all a planner that keeps them together needs); the split
then follows FLOPs, and an MTP-standalone run is needed to measure them apart.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np
from scipy.optimize import minimize_scalar, nnls

from ray_layout.errors import ConfigError
from ray_layout.measure.log_format import P2P_TIMER_OF_CALL
from ray_layout.model.costs import UnitCosts, costs_from_flops
from ray_layout.model.layout import Layout
from ray_layout.model.sizing import LOSS, MTP, WEIGHT_BYTES, stage_sizes, unit_sizes
from ray_layout.model.spec import ModelSpec, ParallelConfig
from search.space import LayoutSpace

if TYPE_CHECKING:
    from ray_layout.measure.logs import MemoryRecord, ParsedLog, TimerRecord

PAIR = "m+L"  # the MTP layers and the loss, fitted as one unit when never measured apart
RESIDUAL_WARNING = 0.05


STEP_WARMUP = 3  # iterations whose step time carries start-up work (allocator, first batch)


@dataclass(frozen=True)
class RunObservation:
    """One profiling run, reduced to what the fit needs: per steady interval and PP rank."""

    name: str
    layout: Layout
    num_microbatches: int
    forward_ms: np.ndarray  # (intervals, PP) forward-compute per iteration, peers averaged
    backward_ms: np.ndarray  # (intervals, PP)
    timers: dict[str, np.ndarray] = field(default_factory=dict)  # other timers, (intervals, PP)
    max_allocated_mb: np.ndarray | None = None  # (PP,) peak allocated memory, NaN where unseen
    step_ms: float | None = None  # mean step time over the steady iterations, when logged


def unit_columns(model: ModelSpec, mtp_apart: bool) -> tuple[str, ...]:
    """The units to solve for: m and L separately only if some run held MTP without the loss
    (``mtp_apart``), else their sum."""
    decoders = tuple(u for u in unit_sizes(model) if u.startswith("t"))
    if not model.mtp_num_layers:
        return ("E", *decoders, LOSS)
    return ("E", *decoders, *((MTP, LOSS) if mtp_apart else (PAIR,)))


def design_rows(model: ModelSpec, layout: Layout, columns: Sequence[str]) -> np.ndarray:
    """(PP, U): how many of each unit every PP rank holds, over all its chunks."""
    space, cuts = LayoutSpace.holding(layout)
    units = [u for u in columns if u != PAIR] + ([MTP, LOSS] if PAIR in columns else [])
    counts = space.unit_counts(cuts[None], units, model.moe_layer_pattern)[0]
    per_rank = counts.reshape(layout.vpp, layout.pp, len(units)).sum(axis=0)
    if PAIR not in columns:
        return per_rank
    m, loss = units.index(MTP), units.index(LOSS)
    pair = np.maximum(per_rank[:, m] / max(model.mtp_num_layers, 1), per_rank[:, loss])
    return np.column_stack([per_rank[:, : len(columns) - 1], pair])


@dataclass(frozen=True)
class FitResult:
    costs: UnitCosts
    columns: tuple[str, ...]
    forward_ms: dict[str, float]
    backward_ms: dict[str, float]
    residuals: dict[str, list[float]]  # run -> relative error of each rank's fitted compute
    warnings: tuple[str, ...]
    p2p_latency_ms: float = 0.0  # added to every transfer so that simulated steps match
    step_errors: dict[str, float] = field(default_factory=dict)  # run -> simulated/measured - 1

    @property
    def max_residual(self) -> float:
        return max((abs(r) for rs in self.residuals.values() for r in rs), default=0.0)


def _solve(rows: np.ndarray, values: np.ndarray, columns: Sequence[str], what: str) -> np.ndarray:
    rank = np.linalg.matrix_rank(rows)
    if rank < len(columns):
        raise ConfigError(
            f"the runs cannot tell apart all of {', '.join(columns)} ({what}: design rank "
            f"{rank} of {len(columns)}); add a run that `profile-layouts` proposes"
        )
    solution, _ = nnls(rows, values)
    return solution


def fit_costs(
    model: ModelSpec,
    parallel: ParallelConfig,
    runs: Sequence[RunObservation],
    base: UnitCosts | None = None,
    gpus_per_node: int | None = None,
) -> FitResult:
    """Unit costs from profiling runs; what the timers cannot say comes from ``base`` (FLOPs by
    default): the split of m + L, and p2p on links no run crossed.  ``gpus_per_node`` is the
    node size the runs had (default: the base's), which says which links crossed nodes."""
    if not runs:
        raise ConfigError("no profiling runs to fit")
    base = base or costs_from_flops(model, parallel)
    if gpus_per_node is not None:
        base = replace(base, gpus_per_node=gpus_per_node)
    columns = unit_columns(model, any(run.layout.mtp_standalone for run in runs))
    rows, forward, backward = [], [], []
    for run in runs:
        design = design_rows(model, run.layout, columns)
        for interval in range(run.forward_ms.shape[0]):
            rows.append(design)
            forward.append(run.forward_ms[interval] / run.num_microbatches)
            backward.append(run.backward_ms[interval] / run.num_microbatches)
    a = np.concatenate(rows)
    fwd = _solve(a, np.concatenate(forward), columns, "forward-compute")
    bwd = _solve(a, np.concatenate(backward), columns, "backward-compute")
    fitted_f, fitted_b = dict(zip(columns, fwd, strict=True)), dict(zip(columns, bwd, strict=True))
    forward_ms = _expand_pair(fitted_f, base.forward_ms)
    backward_ms = _expand_pair(fitted_b, base.backward_ms)

    residuals, warnings = {}, []
    for run in runs:
        design = design_rows(model, run.layout, columns)
        predicted = design @ (fwd + bwd)
        measured = (run.forward_ms + run.backward_ms).mean(axis=0) / run.num_microbatches
        errors = ((predicted - measured) / np.maximum(measured, 1e-9)).tolist()
        residuals[run.name] = errors
        for rank, error in enumerate(errors):
            if abs(error) > RESIDUAL_WARNING:
                warnings.append(
                    f"{run.name}: PP rank {rank} compute is {error:+.1%} off the fitted costs "
                    "(above 5%: noisy runs, or a cost the units do not explain)"
                )
    if PAIR in columns:
        warnings.append(
            "m and L were only measured together: their split follows FLOPs, which matters "
            "only for MTP-standalone layouts (profile one with --standalone-mtp to measure it)"
        )
    costs = replace(
        base,
        forward_ms=forward_ms,
        backward_ms=backward_ms,
        jitter_cv=_jitter(model, runs, columns, fwd + bwd),
        memory_calibration=_memory_calibration(model, parallel, runs, base),
        source="fit",
        model=model.name,
        micro_batch_size=parallel.micro_batch_size,
        seq_length=model.seq_length,
        tp=parallel.tp,
        ep=parallel.ep,
        **_step_tail(model, parallel, runs),
        **_p2p(runs, base, parallel),
    )
    latency, step_errors = _p2p_latency(model, parallel, costs, runs)
    costs = replace(
        costs,
        p2p_intra_node_ms=costs.p2p_intra_node_ms + latency,
        p2p_inter_node_ms=costs.p2p_inter_node_ms + latency,
    )
    return FitResult(costs, columns, fitted_f, fitted_b, residuals, tuple(warnings), latency,
                     step_errors)  # fmt: skip


def simulated_step_ms(
    model: ModelSpec, parallel: ParallelConfig, costs: UnitCosts, run: RunObservation
) -> float:
    """The noise-free step the simulator predicts for a run's layout and micro-batches."""
    from search.planner import PlanOptions, SearchSpec, score_given

    spec = SearchSpec(num_microbatches=run.num_microbatches)
    run_parallel = replace(parallel, pp=run.layout.pp, vpp=run.layout.vpp)
    options = PlanOptions(samples=1)
    return score_given(run.layout, model, run_parallel, costs, spec, options).noise_free_ms


def _p2p_latency(
    model: ModelSpec, parallel: ParallelConfig, costs: UnitCosts, runs: Sequence[RunObservation]
) -> tuple[float, dict[str, float]]:
    """The per-transfer latency (ms, >= 0) that best matches the simulated steps to the measured
    ones, and each run's remaining error.

    The fastest p2p call the timers saw is the bare transfer; a typical call also pays launch
    and synchronisation costs that no timer isolates (the emulator's Python and gloo overhead,
    NCCL's launch latency).  They sit on the critical path once per transfer, so one latency
    added to both link kinds, fitted on the runs' measured step times (least squares on the
    relative error), accounts for them."""
    timed = [run for run in runs if run.step_ms]
    if not timed:
        return 0.0, {}
    measured = np.array([run.step_ms for run in timed])

    def errors(latency: float) -> np.ndarray:
        shifted = replace(costs, p2p_intra_node_ms=costs.p2p_intra_node_ms + latency,
                          p2p_inter_node_ms=costs.p2p_inter_node_ms + latency)  # fmt: skip
        simulated = [simulated_step_ms(model, parallel, shifted, run) for run in timed]
        return np.array(simulated) / measured - 1.0

    upper = float(measured.max()) / max(run.num_microbatches for run in timed)
    best = minimize_scalar(lambda x: float(np.sum(errors(x) ** 2)), bounds=(0.0, upper),
                           method="bounded", options={"xatol": 1e-3})  # fmt: skip
    latency = float(best.x)
    if np.sum(errors(0.0) ** 2) <= best.fun:
        latency = 0.0
    final = errors(latency)
    return latency, {run.name: float(e) for run, e in zip(timed, final, strict=True)}


def _expand_pair(fitted: dict[str, float], flops: dict[str, float]) -> dict[str, float]:
    """Unit costs with m + L split in FLOP proportion when only their sum was measured."""
    costs = {u: float(v) for u, v in fitted.items() if u != PAIR}
    if PAIR in fitted:
        share = flops[MTP] / max(flops[MTP] + flops[LOSS], 1e-12)
        costs[MTP] = float(fitted[PAIR]) * share
        costs[LOSS] = float(fitted[PAIR]) * (1 - share)
    return costs


def _jitter(
    model: ModelSpec, runs: Sequence[RunObservation], columns: Sequence[str], costs: np.ndarray
) -> dict[str, float]:
    """Per-op coefficient of variation per unit from interval-to-interval spread: an interval's
    per-micro-batch time averages M ops, so an op's variance is M times the interval's; a rank's
    op variance is the sum of its units' (cv_u x cost_u)^2."""
    rows, variances = [], []
    for run in runs:
        if run.forward_ms.shape[0] < 2:
            continue
        per_batch = (run.forward_ms + run.backward_ms) / run.num_microbatches
        rows.append(design_rows(model, run.layout, columns))
        variances.append(per_batch.var(axis=0, ddof=1) * run.num_microbatches)
    if not rows:
        return {}
    spread, _ = nnls(np.concatenate(rows) * costs**2, np.concatenate(variances))
    cvs = {u: float(np.sqrt(s)) for u, s in zip(columns, spread, strict=True)}
    if PAIR in cvs:
        cvs[MTP] = cvs[LOSS] = cvs.pop(PAIR)
    return cvs


def _memory_calibration(
    model: ModelSpec, parallel: ParallelConfig, runs: Sequence[RunObservation], base: UnitCosts
) -> dict[str, float]:
    """Per-unit activation factors from the peak allocated memory each rank reported: measured
    minus the exact static state is activations x in-flight micro-batches (+ the logits on the
    last rank), solved by non-negative least squares; units no rank pins down keep 1."""
    from search.cost_model import build_cost_model
    from search.evaluate import _per_rank, _standalone_rank

    rows, values, units = [], [], None
    for run in runs:
        if run.max_allocated_mb is None or not np.isfinite(run.max_allocated_mb).any():
            continue
        layout = run.layout
        sized = replace(parallel, pp=layout.pp, vpp=layout.vpp)
        plain = replace(base, memory_calibration={})
        cost_model = build_cost_model(model, sized, plain, run.num_microbatches)
        units = cost_model.units
        space, cuts = LayoutSpace.holding(layout)
        counts = space.unit_counts(cuts[None], units, model.moe_layer_pattern)
        static = _per_rank(counts @ cost_model.static_bytes, layout.pp)[0]
        static += (
            _standalone_rank(counts, cost_model, layout.pp)[0] * cost_model.standalone_copy_bytes
        )
        chunks = counts[0].reshape(layout.vpp, layout.pp, len(units))
        held = (chunks * cost_model.in_flight.T[:, :, None]).sum(axis=0)  # (PP, U)
        columns = held * cost_model.activation_bytes
        columns[-1, units.index(LOSS)] += cost_model.logits_bytes
        seen = np.isfinite(run.max_allocated_mb)
        rows.append(columns[seen])
        values.append(run.max_allocated_mb[seen] * 2**20 - static[seen])
    if not rows:
        return dict(base.memory_calibration)
    a, y = np.concatenate(rows), np.concatenate(values)
    factors, _ = nnls(a, y)
    pinned = np.abs(a).sum(axis=0) > 0
    return {u: float(np.clip(f, 0.05, 20.0)) if pinned[i] else 1.0
            for i, (u, f) in enumerate(zip(units, factors, strict=True))}  # fmt: skip


def _gparams_per_rank(model: ModelSpec, parallel: ParallelConfig, layout: Layout) -> np.ndarray:
    run = replace(parallel, pp=layout.pp, vpp=layout.vpp)
    return np.array(
        [s.memory.weights / WEIGHT_BYTES / 1e9 for s in stage_sizes(model, run, layout.stages)]
    )


def _step_tail(
    model: ModelSpec, parallel: ParallelConfig, runs: Sequence[RunObservation]
) -> dict[str, float]:
    """Gradient sync and optimizer ms per billion parameters a GPU holds, through the origin."""
    found = {}
    for timer, key in (("all-grads-sync", "grad_sync_ms_per_gparam"),
                       ("optimizer", "optimizer_ms_per_gparam")):  # fmt: skip
        xs, ys = [], []
        for run in runs:
            if timer in run.timers:
                xs.append(_gparams_per_rank(model, parallel, run.layout))
                ys.append(run.timers[timer].mean(axis=0))
        if xs:
            x, y = np.concatenate(xs), np.concatenate(ys)
            found[key] = float(max(0.0, (x @ y) / max(x @ x, 1e-12)))
    return found


def _p2p(
    runs: Sequence[RunObservation], base: UnitCosts, parallel: ParallelConfig
) -> dict[str, float]:
    """Bare transfer times within and across nodes: per link kind, the fastest per-call time of
    any p2p timer on any rank all of whose calls cross only that kind of boundary (a call whose
    partner was already waiting).  A timer whose calls mix kinds (the interleaved schedule's
    combined calls, with one direction off in some) says nothing about either.  A kind no run
    crossed keeps the guess's ratio to the other."""
    from search.cost_model import inter_node_links
    from search.schedule import RECV_NEXT, SEND_NEXT, P2PCall, rank_ops

    fastest = {False: np.inf, True: np.inf}  # by "crosses nodes"
    for run in runs:
        pp = run.layout.pp
        crossing = inter_node_links(replace(parallel, pp=pp), base.gpus_per_node)
        ops = rank_ops(pp, run.layout.vpp, run.num_microbatches)
        for rank, rank_list in enumerate(ops):
            below, above = bool(crossing[(rank - 1) % pp]), bool(crossing[rank])
            calls: dict[str, list[bool]] = {}  # timer -> whether each of its calls crosses
            for op in rank_list:
                if isinstance(op, P2PCall) and op.name in P2P_TIMER_OF_CALL:
                    crosses = any(above if t in (SEND_NEXT, RECV_NEXT) else below
                                  for t in op.transfers)  # fmt: skip
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


def observation_from_log(
    name: str,
    parsed: ParsedLog,
    layout: Layout,
    parallel: ParallelConfig,
    num_microbatches: int,
    warmup_intervals: int = 2,
) -> RunObservation:
    """A run's timers per steady interval and PP rank, from a parsed log."""
    steps = [record.elapsed_ms for record in parsed.iterations]
    return observation_from_records(name, parsed.timers, parsed.memory, layout, parallel,
                                    num_microbatches, warmup_intervals, steps)  # fmt: skip


def observation_from_records(
    name: str,
    timer_records: Iterable[TimerRecord],
    memory_records: Iterable[MemoryRecord],
    layout: Layout,
    parallel: ParallelConfig,
    num_microbatches: int,
    warmup_intervals: int = 2,
    steps_ms: Sequence[float] = (),
) -> RunObservation:
    """A run's timers per steady interval and PP rank, TP/CP/DP peers averaged, and its mean
    step time without the first ``STEP_WARMUP`` iterations (``steps_ms`` in iteration order).

    Megatron's global rank order is tp-cp-ep-dp-pp with PP outermost, so PP rank = rank //
    (world / PP).  The first two logged intervals are dropped: Megatron does not reset the
    timers at the first, so the second still carries the first iteration (see
    ``megatron_logs.steady_intervals``).  Only blocks with ``forward-compute`` count: start-up
    timer blocks carry none.
    """
    per_stage = parallel.world_size // layout.pp
    by_interval: dict[int, dict[str, np.ndarray]] = {}
    counts: dict[int, dict[str, np.ndarray]] = {}
    for record in timer_records:
        if record.rank is None:
            raise ConfigError(
                f"{name}: timers were logged with --timing-log-option max/minmax; the fit needs "
                "every rank's value (--timing-log-option all)"
            )
        pp_rank = record.rank // per_stage
        if pp_rank >= layout.pp:
            raise ConfigError(
                f"{name}: rank {record.rank} is outside a world of {parallel.world_size} "
                f"(TP·CP·DP·PP); check the run's parallel sizes"
            )
        sums = by_interval.setdefault(record.interval, {})
        seen = counts.setdefault(record.interval, {})
        sums.setdefault(record.timer, np.zeros(layout.pp))[pp_rank] += record.ms
        seen.setdefault(record.timer, np.zeros(layout.pp))[pp_rank] += 1
    compute = [i for i in sorted(by_interval) if "forward-compute" in by_interval[i]]
    steady = compute[warmup_intervals:]
    if not steady:
        raise ConfigError(
            f"{name}: no steady timer interval (found {len(compute)} with forward-compute, the "
            f"first {warmup_intervals} dropped); run more iterations with --log-interval 1"
        )

    def table(timer: str) -> np.ndarray:
        rows = []
        for interval in steady:
            total = by_interval[interval].get(timer, np.zeros(layout.pp))
            seen = counts[interval].get(timer, np.zeros(layout.pp))
            rows.append(np.divide(total, seen, out=np.zeros(layout.pp), where=seen > 0))
        return np.array(rows)

    timers = {t: table(t) for t in {t for i in steady for t in by_interval[i]}}
    memory = np.full(layout.pp, np.nan)
    for record in memory_records:
        pp_rank = record.rank // per_stage
        if pp_rank < layout.pp:
            memory[pp_rank] = np.fmax(memory[pp_rank], record.max_allocated_mb)
    return RunObservation(
        name=name,
        layout=layout,
        num_microbatches=num_microbatches,
        forward_ms=timers.pop("forward-compute"),
        backward_ms=timers.pop("backward-compute", np.zeros((len(steady), layout.pp))),
        timers=timers,
        max_allocated_mb=memory,
        step_ms=float(np.mean(steps_ms[STEP_WARMUP:])) if len(steps_ms) > STEP_WARMUP else None,
    )


PROFILE_FLAGS = ("--timing-log-level", "2", "--timing-log-option", "all", "--log-interval", "1",
                 "--eval-iters", "0")  # fmt: skip


@dataclass(frozen=True)
class ProfilePlan:
    """The runs to make, and how well they pin down each unit's cost."""

    layouts: tuple[Layout, ...]
    columns: tuple[str, ...]
    rank: int
    condition: float  # of the stacked design, columns scaled to unit length
    predicted_ms: tuple[float, ...]  # step time of each run under the guessed costs
    peak_memory_gib: tuple[float, ...]

    def megatron_flags(self, layout: Layout, train_iters: int = 20) -> list[str]:
        """What to add to a run's ``pretrain_gpt.py`` command line to profile this layout."""
        return [
            "--pipeline-model-parallel-size", str(layout.pp),
            "--pipeline-model-parallel-layout", str(layout),
            "--train-iters", str(train_iters), *PROFILE_FLAGS,
        ]  # fmt: skip


def _condition(designs: np.ndarray) -> np.ndarray:
    """(n,) condition numbers of stacked designs (n, rows, U), columns scaled to unit length;
    rank-deficient ones are infinite."""
    norms = np.linalg.norm(designs, axis=1, keepdims=True)
    scaled = designs / np.where(norms > 0, norms, 1.0)
    values = np.linalg.svd(scaled, compute_uv=False)
    smallest = values[:, -1]
    return np.where(smallest > 1e-9, values[:, 0] / np.maximum(smallest, 1e-300), np.inf)


def _candidate_cuts(space: LayoutSpace, limit: int, seed: int) -> np.ndarray:
    """Every layout of a small space, or a seeded sample of a large one."""
    if space.count().total <= limit:
        return np.concatenate(list(space.cut_blocks()))
    rng = np.random.default_rng(seed)
    items = space.num_layers + 2 + bool(space.mtp_num_layers)
    raw = np.sort(rng.random((limit * 4, items - 1)).argsort(axis=1)[:, : space.num_stages - 1]
                  + 1, axis=1)  # fmt: skip
    valid = [row for row in raw if _valid_cut_set(space, row)]
    return np.unique(np.array(valid[:limit], dtype=np.int64), axis=0)


def _valid_cut_set(space: LayoutSpace, cuts: np.ndarray) -> bool:
    if space.mtp_num_layers:
        mtp_stage = int((cuts <= space.num_layers + 1).sum())
        if not space.allow_standalone_mtp and mtp_stage != space.num_stages - 1:
            return False
    return True


def profile_design(
    model: ModelSpec,
    parallel: ParallelConfig,
    num_microbatches: int,
    guess: UnitCosts,
    *,
    hbm_gib: float | None = None,
    standalone_mtp: bool = False,
    runs: int = 2,
    candidate_limit: int = 20_000,
    seed: int = 0,
) -> ProfilePlan:
    """The fewest runs (``runs``, at least enough for full rank) whose per-rank timers identify
    every unit: the fastest layout that fits first, then each next run the one that makes the
    stacked design best conditioned (ties to the faster run)."""
    from search.cost_model import build_cost_model
    from search.evaluate import score
    from search.schedule import compile_schedule

    run = replace(parallel, vpp=1)
    space = LayoutSpace(model.num_layers, model.mtp_num_layers, run.pp,
                        allow_standalone_mtp=standalone_mtp)  # fmt: skip
    cuts = _candidate_cuts(space, candidate_limit, seed)
    program = compile_schedule(run.pp, 1, num_microbatches)
    cost_model = build_cost_model(model, run, guess, num_microbatches)
    scores = score(program, cost_model, space.unit_counts(cuts, cost_model.units,
                                                          model.moe_layer_pattern))  # fmt: skip
    fits = np.ones(len(cuts), dtype=bool)
    if hbm_gib is not None:
        fits = scores.peak_memory_bytes <= hbm_gib * 2**30
        if not fits.any():
            raise ConfigError(f"no layout on PP={run.pp} fits in {hbm_gib} GiB for profiling")
    layouts = [Layout(space.stages_from_cuts(tuple(int(c) for c in row)), run.pp) for row in cuts]
    columns = unit_columns(model, standalone_mtp)
    designs = np.array([design_rows(model, layout, columns) for layout in layouts])
    steps = np.where(fits, scores.noise_free_ms, np.inf)
    chosen = [int(np.argmin(steps))]

    def identified() -> bool:
        return bool(np.isfinite(_condition(designs[chosen].reshape(1, -1, len(columns)))[0]))

    while len(chosen) < runs or not identified():
        if len(chosen) >= runs + len(columns):
            raise ConfigError(
                f"no set of layouts on PP={run.pp} identifies all of {', '.join(columns)}"
            )
        stacked = np.concatenate(
            [np.repeat(designs[chosen].reshape(1, -1, len(columns)), len(cuts), axis=0), designs],
            axis=1,
        )
        condition = np.where(fits, _condition(stacked), np.inf)
        condition[chosen] = np.inf
        best = condition.min()
        if not np.isfinite(best) and len(chosen) >= runs:
            raise ConfigError(
                f"no set of layouts on PP={run.pp} identifies all of {', '.join(columns)}"
            )
        near = np.flatnonzero(condition <= best * 1.05)  # well conditioned: take the fastest
        chosen.append(int(near[np.argmin(steps[near])]))
    design = designs[chosen].reshape(-1, len(columns))
    return ProfilePlan(
        layouts=tuple(layouts[i] for i in chosen),
        columns=columns,
        rank=int(np.linalg.matrix_rank(design)),
        condition=float(_condition(design[None])[0]),
        predicted_ms=tuple(float(scores.noise_free_ms[i]) for i in chosen),
        peak_memory_gib=tuple(float(scores.peak_memory_bytes[i]) / 2**30 for i in chosen),
    )
