"""The EP all-to-all time fitted to combined 1F1B runs' measured steps: it finds the time that
made them, nothing hidden included, and refuses steps that cannot say."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from ray_layout.errors import MeasurementError
from ray_layout.measure.a2a_fit import fit_a2a_ms, largest_a2a_ms
from ray_layout.model.costs import costs_from_flops
from ray_layout.model.layout import Layout
from ray_layout.model.loading import load_recipe
from ray_layout.model.spec import with_parallel
from search.planner import PlanOptions, Problem, SearchSpec, score_given

EP_OVERLAP = ("--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute")
HANDBOOK = with_parallel(load_recipe("configs/handbook_7b_a1b.yaml"), pp=4, vpp=2)
COMBINED = replace(HANDBOOK, megatron_args=(*HANDBOOK.megatron_args, *EP_OVERLAP))
COSTS = costs_from_flops(COMBINED.model, COMBINED.parallel)
LAYOUTS = [
    Layout.parse(text, 4)
    for text in ("Et*5|t*5|t|t|t|tt|t|mL", "Ett|(tt|)*6t*2mL", "Ett|t*3|t*3|(tt|)*4mL")
]


def steps_at(recipe, a2a: float) -> np.ndarray:
    spec = SearchSpec(num_microbatches=32)
    problem = Problem.of(recipe, replace(COSTS, a2a_ms=a2a), spec, PlanOptions())
    return np.array([score_given(layout, problem).mean_ms for layout in LAYOUTS])


@pytest.mark.parametrize("truth", [0.0, 0.35, 1.2])
def test_the_fit_finds_the_all_to_all_time_the_steps_were_made_with(truth):
    """The FLOP prior (0.89 ms) is a start, not an answer: steps simulated with another time,
    nothing hidden (0) among them, give that time back."""
    largest = largest_a2a_ms(COMBINED.model, COSTS)
    assert largest == pytest.approx(COSTS.forward_ms["t"] / 2)
    found = fit_a2a_ms(
        lambda a2a: steps_at(COMBINED, a2a), steps_at(COMBINED, truth), largest, COSTS.a2a_ms
    )
    assert found.a2a_ms == pytest.approx(truth, abs=5e-3)
    assert found.prior_ms == COSTS.a2a_ms and max(map(abs, found.errors)) < 1e-4


def test_steps_that_hide_nothing_cannot_fit_it():
    """Without EP overlap nothing merges: every all-to-all time gives the same steps."""
    measured = steps_at(HANDBOOK, 0.5)
    with pytest.raises(MeasurementError, match="do not depend on the EP all-to-all time"):
        fit_a2a_ms(lambda a2a: steps_at(HANDBOOK, a2a), measured, 2.0, COSTS.a2a_ms)


def test_a_dense_model_has_no_all_to_all_to_fit():
    dense = load_recipe("configs/tiny_dense.yaml").model
    with pytest.raises(MeasurementError, match=f"{dense.name} has no MoE layer"):
        largest_a2a_ms(dense, COSTS)
