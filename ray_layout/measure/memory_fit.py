"""Memory calibration from the profiling runs' memory lines: per-unit activation factors and a
fixed amount every rank allocates beyond the model, fitted to each rank's peak allocated memory
over the exact static state (weights, gradients, optimizer), with predicted against measured
per stage before and after, so that a user sees how far the prior was and the fit is."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ray_layout.measure.observations import RunObservation
from ray_layout.measure.solvers import bounded_nnls
from ray_layout.model.costs import UnitCosts
from ray_layout.model.fields import ModelSpec
from ray_layout.model.memory_settings import PLAIN, MemorySettings
from ray_layout.model.sizing import GIB, LOSS
from ray_layout.model.spec import ParallelConfig
from search.cost_model import CostModel, build_cost_model
from search.evaluate import memory
from search.space import LayoutSpace

FACTOR_RANGE = (0.05, 20.0)  # a factor outside says more about the run than about activations


@dataclass(frozen=True)
class StagePeak:
    """One PP rank of one run: its measured max allocated and what the model predicts."""

    run: str
    pp_rank: int
    measured_gib: float
    prior_gib: float  # uncalibrated: every factor 1, nothing allocated beyond the model
    fitted_gib: float

    @property
    def prior_error(self) -> float:
        return self.prior_gib / self.measured_gib - 1

    @property
    def fitted_error(self) -> float:
        return self.fitted_gib / self.measured_gib - 1


@dataclass(frozen=True)
class MemoryFit:
    factors: dict[str, float]  # per-unit activation factors (1 where no rank pins one down)
    allocated_gib: float  # fitted fixed allocation on every rank (0 where the runs cannot say)
    stages: tuple[StagePeak, ...] = ()


@dataclass(frozen=True)
class _Rows:
    """One run's ranks with a memory line: static bytes, per-unit columns, measured bytes."""

    run: str
    ranks: np.ndarray  # (k,) PP ranks seen
    static: np.ndarray  # (k,)
    columns: np.ndarray  # (k, U) bytes per unit of factor
    measured: np.ndarray  # (k,)


def _rows(
    model: ModelSpec,
    parallel: ParallelConfig,
    run: RunObservation,
    base: UnitCosts,
    settings: MemorySettings,
) -> tuple[_Rows, tuple[str, ...]]:
    layout = run.layout
    sized = replace(parallel, pp=layout.pp, vpp=layout.vpp)
    plain = replace(base, memory_calibration={})
    cost_model = build_cost_model(model, sized, plain, run.num_microbatches, settings=settings)
    units = cost_model.units
    space, cuts = LayoutSpace.holding(layout)
    counts = space.unit_counts(cuts[None], units, model.moe_layer_pattern)
    static = memory(_only(cost_model, None), counts, layout.pp)[0]
    columns = np.stack([memory(_only(cost_model, u), counts, layout.pp)[0] for u in units], axis=1)
    seen = np.isfinite(run.max_allocated_mb)
    measured = run.max_allocated_mb[seen] * 2**20
    ranks = np.flatnonzero(seen)
    return _Rows(run.name, ranks, static[seen], columns[seen], measured), units


def _only(cost_model: CostModel, unit: str | None) -> CostModel:
    """The cost model with the activations (and their block-recompute savings) of ``unit``
    alone, no capacity overhead; ``None``: the static state alone (weights, gradients,
    optimizer, a standalone MTP rank's embedding copy, what one backward recomputes)."""
    keep = np.array([u == unit for u in cost_model.units], dtype=float)
    saving = cost_model.block_saving_bytes
    return replace(
        cost_model,
        activation_bytes=cost_model.activation_bytes * keep,
        block_saving_bytes=None if saving is None else saving * keep,
        logits_bytes=cost_model.logits_bytes if unit == LOSS else 0.0,
        overhead_bytes=0.0,
        recompute_bytes=cost_model.recompute_bytes if unit is None else 0.0,
        static_bytes=cost_model.static_bytes * (unit is None),
        standalone_copy_bytes=cost_model.standalone_copy_bytes * (unit is None),
    )


def fit_memory(
    model: ModelSpec,
    parallel: ParallelConfig,
    runs: Sequence[RunObservation],
    base: UnitCosts,
    settings: MemorySettings = PLAIN,
) -> MemoryFit:
    """Per-unit activation factors and a fixed allocation from the peak allocated memory each
    rank reported: measured minus the exact static state is activations x in-flight
    micro-batches (+ the logits on the last rank) + the fixed amount, solved by non-negative
    least squares.  The fixed amount is fitted only where the ranks outnumber the unknowns and
    tell it apart from the factors; units no rank pins down keep 1."""
    found = [
        _rows(model, parallel, run, base, settings)
        for run in runs
        if run.max_allocated_mb is not None and np.isfinite(run.max_allocated_mb).any()
    ]
    if not found:
        return MemoryFit(dict(base.memory_calibration), 0.0)
    rows, units = [r for r, _ in found], found[0][1]
    a = np.concatenate([r.columns for r in rows])
    y = np.concatenate([r.measured - r.static for r in rows])
    pinned = np.abs(a).sum(axis=0) > 0
    with_fixed = np.column_stack([a[:, pinned], np.full(len(y), GIB)])
    unknowns = int(pinned.sum()) + 1
    if len(y) > unknowns and np.linalg.matrix_rank(with_fixed) == unknowns:
        solution = bounded_nnls(with_fixed, y, "the memory calibration")
        fixed = float(solution[-1])
    else:
        solution = bounded_nnls(a[:, pinned], y, "the memory calibration")
        fixed = 0.0
    factors = dict.fromkeys(units, 1.0)
    for unit, value in zip(np.array(units)[pinned], solution, strict=False):
        factors[str(unit)] = float(np.clip(value, *FACTOR_RANGE))
    scale = np.array([factors[u] for u in units])
    stages = tuple(
        StagePeak(r.run, int(rank), m / GIB, (s + c.sum()) / GIB, (s + c @ scale) / GIB + fixed)
        for r in rows
        for rank, s, c, m in zip(r.ranks, r.static, r.columns, r.measured, strict=True)
    )
    return MemoryFit(factors, fixed, stages)


def memory_calibration(
    model: ModelSpec, parallel: ParallelConfig, runs: Sequence[RunObservation], base: UnitCosts
) -> dict[str, float]:
    """The per-unit activation factors alone (the base's where no run printed memory)."""
    return fit_memory(model, parallel, runs, base).factors


def memory_costs(found: MemoryFit, base: UnitCosts) -> dict[str, Any]:
    """The ``UnitCosts`` fields the fit sets: the factors, and the base's capacity overhead
    (what max allocated does not see) plus the fixed allocation the ranks showed."""
    return {
        "memory_calibration": found.factors,
        "memory_overhead_gib": base.memory_overhead_gib + found.allocated_gib,
    }
