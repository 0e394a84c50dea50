"""The fit's numerical solvers, each with an iteration bound: a problem a solver cannot settle
within it is one :class:`MeasurementError` naming what was being fitted, never a hang, and
values that are not finite are refused before any solver sees them.

Every ``nnls`` and ``minimize_scalar`` call of the fit goes through here.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from scipy.optimize import minimize_scalar, nnls

from ray_layout.errors import MeasurementError

# Lawson-Hanson NNLS moves one unknown in or out per iteration and settles within a few sweeps
# of the columns (scipy's own default is 3 per column); the fit has at most a dozen columns.
NNLS_ITERATIONS_PER_UNKNOWN = 30
# Brent's bounded search narrows its interval by at least the golden ratio every two steps:
# 200 steps narrow any range the fit gives it far below its tolerance.
SCALAR_ITERATIONS = 200


def bounded_nnls(rows: np.ndarray, values: np.ndarray, what: str) -> np.ndarray:
    """argmin ||rows x - values|| over x >= 0, within NNLS_ITERATIONS_PER_UNKNOWN per column."""
    rows, values = np.asarray(rows, dtype=float), np.asarray(values, dtype=float)
    require_finite(what, rows, values)
    bound = max(int(NNLS_ITERATIONS_PER_UNKNOWN * rows.shape[1]), 1)  # 0 is scipy's default
    try:
        solution, _ = nnls(rows, values, maxiter=bound)
    except RuntimeError as exc:  # scipy: "Maximum number of iterations reached."
        raise MeasurementError(
            f"the fit of {what} did not settle within {bound} NNLS iterations ({exc}); the runs' "
            "timers are too near alike to tell its unknowns apart: add a run that "
            "`profile-layouts` proposes"
        ) from None
    return solution


def bounded_minimum(
    objective: Callable[[float], float], low: float, high: float, tolerance: float, what: str
) -> tuple[float, float]:
    """(x, objective(x)) of the least objective in [low, high], within SCALAR_ITERATIONS."""
    if not (np.isfinite(low) and np.isfinite(high) and low <= high):
        raise MeasurementError(f"the fit of {what} has no finite range to search ({low}, {high})")
    found = minimize_scalar(
        objective,
        bounds=(low, high),
        method="bounded",
        options={"xatol": tolerance, "maxiter": SCALAR_ITERATIONS},
    )
    if not np.isfinite(found.fun):
        raise MeasurementError(
            f"the fit of {what} met no finite objective in [{low:g}, {high:g}] (a run's steps "
            "or timers hold a value no run has); check the runs it fits"
        )
    if not found.success:
        raise MeasurementError(
            f"the fit of {what} did not settle within {SCALAR_ITERATIONS} iterations "
            f"({found.message}); the runs' steps say too little to fit it"
        )
    return float(found.x), float(found.fun)


def require_finite(what: str, *arrays: np.ndarray) -> None:
    """Refuse NaN or infinite inputs, which no solver can fit (and some never finish on)."""
    if not all(np.isfinite(array).all() for array in arrays):
        raise MeasurementError(
            f"the fit of {what} met a value that is not a finite number (a run's timers or "
            "sizes hold one); check the runs it fits"
        )
