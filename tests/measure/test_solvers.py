"""Every solver call of the fit is bounded: it settles, or says in one line that it did not, and
refuses values that are not finite before a solver sees them."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest
from scipy.optimize import nnls

from ray_layout.errors import MeasurementError
from ray_layout.measure import solvers
from ray_layout.measure.solvers import bounded_minimum, bounded_nnls
from tests.helpers.paths import ROOT


def test_nnls_gives_scipys_answer_under_an_explicit_bound(monkeypatch):
    rows = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    values = np.array([2.0, 1.0, -1.0])
    bounds = []

    def spy(a, b, *, maxiter):
        bounds.append(maxiter)
        return nnls(a, b, maxiter=maxiter)

    monkeypatch.setattr(solvers, "nnls", spy)
    assert bounded_nnls(rows, values, "x").tolist() == pytest.approx([1.5, 0.0])
    assert bounds == [solvers.NNLS_ITERATIONS_PER_UNKNOWN * 2]


def test_nnls_out_of_iterations_is_one_line_not_a_hang(monkeypatch):
    def exhausted(a, b, *, maxiter):
        raise RuntimeError("Maximum number of iterations reached.")

    monkeypatch.setattr(solvers, "nnls", exhausted)
    with pytest.raises(
        MeasurementError, match=r"fit of forward-compute did not settle within 60"
    ) as e:
        bounded_nnls(np.eye(2), np.ones(2), "forward-compute")
    assert "\n" not in str(e.value)


def test_scipys_own_bound_is_the_one_hit(monkeypatch):
    """With one iteration per unknown, ten positive unknowns that NNLS adds one at a time (and
    then checks) run out: scipy's RuntimeError comes back as the one-line error."""
    monkeypatch.setattr(solvers, "NNLS_ITERATIONS_PER_UNKNOWN", 0.5)
    rows = np.tril(np.ones((10, 10)))
    with pytest.raises(MeasurementError, match="did not settle within 5 NNLS iterations"):
        bounded_nnls(rows, rows @ np.arange(1.0, 11.0), "the test")


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_value_that_is_not_finite_is_refused_before_any_solver(bad):
    values = np.array([1.0, bad])
    with pytest.raises(
        MeasurementError, match="the fit of jitter met a value that is not a finite number"
    ):
        bounded_nnls(np.eye(2), values, "jitter")


def test_the_bounded_minimum_finds_it_or_says_it_did_not(monkeypatch):
    x, least = bounded_minimum(lambda v: (v - 2.0) ** 2 + 1.0, 0.0, 5.0, 1e-6, "x")
    assert x == pytest.approx(2.0, abs=1e-5) and least == pytest.approx(1.0)
    assert bounded_minimum(lambda v: v, 3.0, 3.0, 1e-3, "x") == (3.0, 3.0)
    with pytest.raises(MeasurementError, match=r"fit of the latency met no finite objective"):
        bounded_minimum(lambda v: math.nan, 0.0, 1.0, 1e-3, "the latency")
    with pytest.raises(MeasurementError, match=r"has no finite range to search"):
        bounded_minimum(lambda v: v, 0.0, math.inf, 1e-3, "x")
    monkeypatch.setattr(solvers, "SCALAR_ITERATIONS", 3)
    with pytest.raises(MeasurementError, match=r"did not settle within 3 iterations") as e:
        bounded_minimum(lambda v: (v - 2.0) ** 2, 0.0, 5.0, 1e-12, "the all-to-all time")
    assert "\n" not in str(e.value)


def test_no_other_module_calls_a_solver_unbounded():
    """The guard holds by construction: scipy's solvers are imported here and nowhere else."""
    solver = re.compile(r"\b(nnls|minimize_scalar|minimize|least_squares|lsq_linear)\b")
    callers = [
        str(path.relative_to(ROOT))
        for package in ("ray_layout", "search")
        for path in sorted((ROOT / package).rglob("*.py"))
        if path != Path(solvers.__file__)
        and any(solver.search(line) for line in path.read_text().splitlines() if "import" in line)
    ]
    assert callers == []
