"""The EP all-to-all time of combined 1F1B, from the steps its runs measured.

Under combined 1F1B Megatron times each merged forward+backward step whole, so no timer shows a
MoE layer's dispatch and combine.  What the merge hides shows in the step instead: with the unit
costs fitted from the profiling runs (which run without EP overlap, so each MoE layer's forward
and backward hold its all-to-alls exposed), the fit is the one ``a2a_ms`` whose simulated steps
come closest to the measured ones, least squares on relative errors, between 0 and the most a
MoE layer can hold (half its shorter pass: two all-to-alls each way).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ray_layout.errors import MeasurementError
from ray_layout.measure.solvers import bounded_minimum
from ray_layout.model.costs import UnitCosts
from ray_layout.model.fields import ModelSpec
from ray_layout.model.sizing import layer_units

A2A_TOLERANCE_MS = 1e-3
# Below this relative change of the simulated steps over the whole range, the steps cannot say
# what the all-to-alls take: nothing the runs merged hides anything.
SENSITIVITY_FLOOR = 1e-4


@dataclass(frozen=True)
class A2aFit:
    a2a_ms: float
    prior_ms: float  # what the costs said before (the bandwidth prior of the FLOP guess)
    errors: tuple[float, ...]  # each run's relative step error (simulated / measured - 1) at it


def largest_a2a_ms(model: ModelSpec, costs: UnitCosts) -> float:
    """The most one dispatch or combine can take: a MoE layer's forward and backward each hold
    two of them."""
    moe = [unit for unit, is_moe in layer_units(model).items() if is_moe]
    if not moe:
        raise MeasurementError(f"{model.name} has no MoE layer: it has no EP all-to-all to fit")
    return min(min(costs.forward_ms[u], costs.backward_ms[u]) for u in moe) / 2


def fit_a2a_ms(
    simulated_ms: Callable[[float], np.ndarray],
    measured_ms: Sequence[float],
    largest_ms: float,
    prior_ms: float,
) -> A2aFit:
    """The all-to-all time whose simulated steps (``simulated_ms(a2a)``, one per run) best meet
    ``measured_ms``.  Raises :class:`MeasurementError` when the steps do not depend on it."""
    measured = np.asarray(measured_ms, dtype=float)

    def errors(a2a: float) -> np.ndarray:
        return np.asarray(simulated_ms(a2a), dtype=float) / measured - 1

    low, high = errors(0.0), errors(largest_ms)
    if float(np.max(np.abs(high - low))) < SENSITIVITY_FLOOR:
        raise MeasurementError(
            "the measured steps do not depend on the EP all-to-all time (no merged step hides "
            f"anything between 0 and {largest_ms:.2f} ms), so they cannot fit it"
        )
    found, _ = bounded_minimum(
        lambda a2a: float(np.mean(errors(a2a) ** 2)),
        0.0,
        largest_ms,
        A2A_TOLERANCE_MS,
        "the EP all-to-all time",
    )
    # the bounded search never tries its ends, where the answer may lie (nothing hidden, say)
    tried = {0.0: low, largest_ms: high, found: errors(found)}
    best = min(tried, key=lambda a2a: float(np.mean(tried[a2a] ** 2)))
    return A2aFit(best, prior_ms, tuple(float(e) for e in tried[best]))
