"""Memory calibration from the profiling runs: per-unit activation factors fitted to the peak
memory each rank reported, over the exact static state (weights, gradients, optimizer)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np
from scipy.optimize import nnls

from ray_layout.measure.observations import RunObservation
from ray_layout.model.costs import UnitCosts
from ray_layout.model.sizing import LOSS
from ray_layout.model.spec import ModelSpec, ParallelConfig
from search.cost_model import CostModel, build_cost_model
from search.evaluate import memory
from search.space import LayoutSpace


def memory_calibration(
    model: ModelSpec, parallel: ParallelConfig, runs: Sequence[RunObservation], base: UnitCosts
) -> dict[str, float]:
    """Per-unit activation factors from the peak allocated memory each rank reported: measured
    minus the exact static state is activations x in-flight micro-batches (+ the logits on the
    last rank), solved by non-negative least squares; units no rank pins down keep 1."""
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
        static = memory(_static_only(cost_model), counts, layout.pp)[0]
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


def _static_only(cost_model: CostModel) -> CostModel:
    """The cost model with activations, logits and overhead at zero: its memory is the static
    state (weights, gradients, optimizer, a standalone MTP rank's embedding copy) alone."""
    return replace(cost_model, activation_bytes=np.zeros_like(cost_model.activation_bytes),
                   logits_bytes=0.0, overhead_bytes=0.0)  # fmt: skip
