"""The exact search returns what enumeration finds, with a bound that holds."""

from __future__ import annotations

import numpy as np
import pytest

from search.evaluate import score
from search.exact import exact_search
from search.schedule import compile_schedule
from search.space import LayoutSpace
from tests.planner_fixtures import toy_cost_model


@pytest.mark.parametrize(
    ("layers", "pp", "vpp", "microbatches", "standalone"),
    [(16, 4, 1, 8, False), (16, 4, 1, 32, True), (16, 4, 2, 8, False), (12, 3, 2, 6, True),
     (10, 4, 1, 4, False)],
)  # fmt: skip
def test_exact_top_equals_enumeration(layers, pp, vpp, microbatches, standalone):
    space = LayoutSpace(layers, 1, pp, vpp, allow_standalone_mtp=standalone)
    program = compile_schedule(pp, vpp, microbatches)
    model = toy_cost_model(pp, vpp, microbatches, layers=layers)
    cuts = np.concatenate(list(space.cut_blocks()))
    steps = score(program, model, space.unit_counts(cuts, model.units, model.moe_pattern))
    everything = np.sort(steps.noise_free_ms)
    found = exact_search(space, program, model, top=5)
    assert found.steps == pytest.approx(everything[:5])
    assert found.proven_bound_ms >= found.steps[-1] - 1e-9
    assert found.proven_bound_ms <= everything[5] + 1e-9  # the bound is a real step or below
    assert found.simulated <= len(cuts)
    for row, step in zip(found.cuts, found.steps, strict=True):
        one = score(program, model, space.unit_counts(row[None], model.units, model.moe_pattern))
        assert one.noise_free_ms[0] == pytest.approx(step)


def test_memory_limit_applies_in_exact_search():
    space = LayoutSpace(16, 1, 4)
    program = compile_schedule(4, 1, 8)
    model = toy_cost_model(4)
    found = exact_search(space, program, model, top=3, hbm_gib=40.0)
    counts = space.unit_counts(found.cuts, model.units, model.moe_pattern)
    assert (score(program, model, counts).peak_memory_bytes <= 40.0 * 2**30).all()
    assert found.rejected_memory > 0
