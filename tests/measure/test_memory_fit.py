"""Memory calibration: per-unit activation factors from the peak memory each rank reported."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from ray_layout.measure.fit import fit_costs
from ray_layout.measure.memory_fit import fit_memory, memory_calibration, memory_costs
from ray_layout.model.layout import Layout
from tests.helpers.measure_runs import HANDBOOK, KEPT, MICROBATCHES, TRUTH, observe

APART = ("Et*3|t*7|t*6m|L", "Et|t*15|m|L")  # m and L on ranks of their own
CALIBRATED = replace(TRUTH, memory_calibration={"t": 1.3, "m": 0.8, "L": 1.1, "E": 1.0})


def test_memory_calibration_comes_back_from_max_allocated():
    truth = replace(TRUTH, memory_calibration={"t": 1.3, "m": 0.8, "L": 1.1, "E": 1.0})
    runs = observe(["Et*3|t*7|t*6m|L", "Et|t*15|m|L"], costs=truth)
    result = fit_costs(HANDBOOK.model, HANDBOOK.parallel, runs)
    for unit in ("t", "L"):
        assert result.costs.memory_calibration[unit] == pytest.approx(
            truth.memory_calibration[unit], rel=0.02
        )


def test_fitted_memory_predicts_every_ranks_max_allocated_within_5_percent():
    """The simulator's peak under the fitted calibration, less the fixed overhead Megatron's
    allocator does not see, against each rank's max allocated, on a layout no run had."""
    from search.cost_model import build_cost_model
    from search.evaluate import memory
    from search.space import LayoutSpace

    truth = replace(TRUTH, memory_calibration={"t": 1.25, "m": 0.9, "L": 1.2, "E": 1.0})
    result = fit_costs(
        HANDBOOK.model, HANDBOOK.parallel, observe(["Et*3|t*7|t*6m|L", "Et|t*15|m|L"], costs=truth)
    )
    layout = Layout.parse("Et*4|t*5|t*5|t*2mL", HANDBOOK.parallel.pp)
    (measured,) = observe([str(layout)], costs=truth)
    model = build_cost_model(HANDBOOK.model, HANDBOOK.parallel, result.costs, MICROBATCHES)
    space, cuts = LayoutSpace.holding(layout)
    counts = space.unit_counts(cuts[None], model.units, model.moe_pattern)
    predicted_mb = (memory(model, counts, layout.pp)[0] - model.overhead_bytes) / 2**20
    assert predicted_mb == pytest.approx(measured.max_allocated_mb, rel=0.05)


def test_the_factors_come_back_from_the_runs_alone() -> None:
    runs = observe(APART, costs=CALIBRATED)
    found = memory_calibration(HANDBOOK.model, HANDBOOK.parallel, runs, TRUTH)
    assert found == pytest.approx(CALIBRATED.memory_calibration, rel=1e-4)


def test_units_no_reported_rank_holds_keep_1() -> None:
    """Rank 3 alone holds m and L in both runs; without its memory line they stay 1."""
    runs = observe(KEPT, costs=CALIBRATED)
    last_unseen = [
        replace(run, max_allocated_mb=run.max_allocated_mb * [1, 1, 1, np.nan]) for run in runs
    ]
    found = memory_calibration(HANDBOOK.model, HANDBOOK.parallel, last_unseen, TRUTH)
    assert (found["m"], found["L"]) == (1.0, 1.0)
    assert found["t"] == pytest.approx(1.3, rel=1e-4)


def test_runs_without_memory_lines_keep_the_base_factors() -> None:
    runs = [replace(run, max_allocated_mb=None) for run in observe(KEPT)]
    unseen = [replace(run, max_allocated_mb=np.full(4, np.nan)) for run in observe(KEPT)]
    for blind in (runs, unseen, []):
        found = memory_calibration(HANDBOOK.model, HANDBOOK.parallel, blind, CALIBRATED)
        assert found == CALIBRATED.memory_calibration


def test_factors_are_kept_within_0_05_and_20() -> None:
    """A factor outside says more about the run than about activations: it is clipped."""
    wild = replace(TRUTH, memory_calibration={"t": 40.0, "m": 1.0, "L": 0.01, "E": 1.0})
    found = memory_calibration(HANDBOOK.model, HANDBOOK.parallel, observe(APART, costs=wild), TRUTH)
    assert (found["t"], found["L"]) == (20.0, 0.05)
    assert found["E"] == pytest.approx(1.0, rel=1e-4)


def test_an_interleaved_run_calibrates_like_a_plain_one() -> None:
    """Each chunk's activations count with its own micro-batches in flight."""
    interleaved = observe(["Ett|t*2|t*2|t*2|t*2|t*2|t*2|t*2mL", APART[1]], costs=CALIBRATED)
    assert interleaved[0].layout.vpp == 2
    found = memory_calibration(HANDBOOK.model, HANDBOOK.parallel, interleaved, TRUTH)
    assert found == pytest.approx(CALIBRATED.memory_calibration, rel=1e-4)


def test_a_fixed_allocation_comes_back_with_the_factors() -> None:
    """Every rank allocating 1.5 GiB beyond the model (workspaces, buffers) is fitted apart from
    the activation factors, and lands in the capacity overhead on top of the base's."""
    extra = [
        replace(run, max_allocated_mb=run.max_allocated_mb + 1.5 * 1024)
        for run in observe(APART, costs=CALIBRATED)
    ]
    found = fit_memory(HANDBOOK.model, HANDBOOK.parallel, extra, TRUTH)
    assert found.factors == pytest.approx(CALIBRATED.memory_calibration, rel=1e-3)
    assert found.allocated_gib == pytest.approx(1.5, rel=1e-3)
    assert all(abs(stage.fitted_error) < 1e-4 for stage in found.stages)
    assert len(found.stages) == 8 and any(abs(stage.prior_error) > 0.01 for stage in found.stages)
    costs = memory_costs(found, TRUTH)
    assert costs["memory_overhead_gib"] == pytest.approx(TRUTH.memory_overhead_gib + 1.5, rel=1e-3)


def test_too_few_ranks_fit_no_fixed_allocation() -> None:
    """Four ranks cannot tell four factors and a fixed amount apart: the amount stays 0."""
    (one,) = observe(APART[:1], costs=CALIBRATED)
    assert fit_memory(HANDBOOK.model, HANDBOOK.parallel, [one], TRUTH).allocated_gib == 0.0
