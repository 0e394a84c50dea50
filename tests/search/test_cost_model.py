"""The planner's cost model agrees with the per-stage modules it is built from."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from ray_layout.errors import ConfigError
from ray_layout.model.costs import costs_from_flops, load_costs, stage_compute_ms, step_tail_ms
from ray_layout.model.layout import Layout
from ray_layout.model.memory_settings import memory_settings
from ray_layout.model.sizing import stage_sizes
from ray_layout.model.spec import build_recipe, load_recipe_file, with_parallel
from search.cost_model import build_cost_model, in_flight_at_peak, p2p_links
from search.evaluate import memory, stage_times, tail_ms
from search.memory import stage_memory
from search.pipeline_ops import ScheduleShape
from search.planner import PlanOptions, Problem, SearchSpec, _layout_counts, score_given

HANDBOOK = load_recipe_file("configs/handbook_7b_a1b.yaml")
COSTS = load_costs("configs/costs/handbook_h200_example.json")


def test_in_flight_matches_megatron_counts():
    assert in_flight_at_peak(ScheduleShape(4, 1, 8))[:, 0].tolist() == [
        4,
        3,
        2,
        1,
    ]  # min(PP - r, M)
    assert in_flight_at_peak(ScheduleShape(4, 1, 2))[:, 0].tolist() == [2, 2, 2, 1]
    interleaved = in_flight_at_peak(ScheduleShape(4, 2, 8))
    assert interleaved[0].tolist() == [7, 4]
    # Megatron's interleaved first-stage factor: (1 + (PP - 1)/(PP V)) x PP micro-batches of a
    # full rank's activations = 4 + 3/2 = 5.5 ranks' worth = 11 chunk-micro-batches.
    assert interleaved[0].sum() == 11


@pytest.mark.parametrize(
    ("parallel", "expected"),
    [
        ({"pp": 4, "dp": 2}, [0.4, 0.4, 0.4, 0.4]),  # 8 GPUs, one node: all links inside
        ({"pp": 4, "dp": 4}, [0.4, 2.0, 0.4, 2.0]),  # 16 GPUs, 2 stages per node
        ({"pp": 4, "tp": 2, "dp": 4}, [2.0, 2.0, 2.0, 2.0]),  # each stage fills a node
    ],
)
def test_p2p_links_follow_where_ranks_sit(parallel, expected):
    recipe = with_parallel(HANDBOOK, ep=1, **parallel)
    assert p2p_links(COSTS, recipe.parallel).tolist() == expected


@pytest.mark.parametrize("text", ["Et*5|t*6|t*5|mL", "Et*4|t*4|t*4|t*4mL", "Et*5|t*6|t*5m|L"])
def test_vectorised_costs_equal_the_per_stage_functions(text):
    model, parallel = HANDBOOK.model, HANDBOOK.parallel
    layout = Layout.parse(text, parallel.pp)
    cost_model = build_cost_model(model, parallel, COSTS, 32)
    _, _, counts = _layout_counts(layout, cost_model)
    forward, backward = stage_times(cost_model, counts)
    expected_f, expected_b = stage_compute_ms(COSTS, model, layout.stages)
    assert forward[0] == pytest.approx(expected_f)
    assert backward[0] == pytest.approx(expected_b)
    in_flight = [dict(enumerate(row)) for row in cost_model.in_flight.tolist()]
    expected = [m.total for m in stage_memory(model, parallel, layout, COSTS, in_flight)]
    assert memory(cost_model, counts, parallel.pp)[0] == pytest.approx(expected, rel=1e-6)
    tails = [step_tail_ms(COSTS, s) for s in stage_sizes(model, parallel, layout.stages)]
    assert tail_ms(cost_model, counts, parallel.pp)[0] == pytest.approx(tails, rel=1e-5)


def test_mixed_model_needs_dense_and_moe_costs():
    mixed = build_recipe(
        {"num_layers": 4, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 32,
         "vocab_size": 100, "num_experts": 4, "moe_layer_freq": "[0]+[1]*3"},
        {"pp": 2}, source="test",
    )  # fmt: skip
    with pytest.raises(ConfigError, match="t_moe, t_dense"):
        build_cost_model(mixed.model, mixed.parallel, COSTS, 4)


def test_calibration_scales_activations_only():
    from dataclasses import replace

    doubled = replace(COSTS, memory_calibration={"t": 2.0})
    base = build_cost_model(HANDBOOK.model, HANDBOOK.parallel, COSTS, 8)
    scaled = build_cost_model(HANDBOOK.model, HANDBOOK.parallel, doubled, 8)
    t = base.units.index("t")
    assert scaled.activation_bytes[t] == 2 * base.activation_bytes[t]
    assert np.array_equal(scaled.static_bytes, base.static_bytes)


def test_recomputation_prices_the_handbooks_step_in_the_order_of_the_work_it_redoes():
    """One layout of the handbook recipe on FLOP costs: no recomputation < selective core
    attention and experts' activation < full recompute of every layer, which re-runs each
    layer's forward in its backward (a third of its compute): at least 15% more."""
    recipe = with_parallel(HANDBOOK, pp=4)
    costs = costs_from_flops(recipe.model, recipe.parallel)
    layout = Layout.parse("Et*5|t*6|t*5|mL", 4)
    problem = Problem.of(recipe, costs, SearchSpec(32), PlanOptions(top=1, samples=8))
    selective = ["--recompute-granularity", "selective", "--recompute-modules"]
    full = ["--recompute-granularity", "full", "--recompute-method", "uniform"]
    steps = [
        score_given(layout, replace(problem, memory=memory_settings(flags))).noise_free_ms
        for flags in (
            [],
            [*selective, "core_attn", "moe_act"],
            [*full, "--recompute-num-layers", "1"],
        )
    ]
    assert steps[0] < steps[1] < steps[2]
    assert steps[2] >= 1.15 * steps[0]
