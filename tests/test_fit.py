"""The fit recovers known unit costs from synthetic Megatron logs; the profile design works."""

from __future__ import annotations

import numpy as np
import pytest

from ray_layout.costs import costs_from_flops, load_costs
from ray_layout.fit import (
    PAIR,
    design_rows,
    fit_costs,
    observation_from_log,
    profile_design,
    unit_columns,
)
from ray_layout.layout import Layout
from ray_layout.megatron_logs import parse_log
from ray_layout.model import ConfigError, load_recipe_file
from tests.synthetic_runs import synthetic_log

HANDBOOK = load_recipe_file("configs/handbook_7b_a1b.yaml")
TRUTH = load_costs("configs/costs/handbook_h200_example.json")
MICROBATCHES = 8


def observe(texts, noise_cv=0.0, iterations=8, costs=TRUTH, recipe=HANDBOOK):
    runs = []
    for index, text in enumerate(texts):
        layout = Layout.parse(text, recipe.parallel.pp)
        log = synthetic_log(recipe.model, recipe.parallel, layout, costs, MICROBATCHES,
                            iterations=iterations, noise_cv=noise_cv, seed=index)  # fmt: skip
        runs.append(observation_from_log(f"run{index}", parse_log(log), layout, recipe.parallel,
                                         MICROBATCHES))  # fmt: skip
    return runs


def test_noise_free_logs_give_back_the_costs_within_one_percent():
    result = fit_costs(HANDBOOK.model, HANDBOOK.parallel,
                       observe(["Et*3|t*7|t*6m|L", "Et|t*15|m|L"]))  # fmt: skip
    for unit in ("E", "t", "m", "L"):
        assert result.costs.forward_ms[unit] == pytest.approx(TRUTH.forward_ms[unit], rel=0.01)
        assert result.costs.backward_ms[unit] == pytest.approx(TRUTH.backward_ms[unit], rel=0.01)
    assert result.costs.grad_sync_ms_per_gparam == pytest.approx(20.0, rel=0.01)
    assert result.costs.optimizer_ms_per_gparam == pytest.approx(5.0, rel=0.01)
    assert result.costs.p2p_intra_node_ms == pytest.approx(0.4, rel=0.01)
    assert result.max_residual < 1e-6 and result.columns == ("E", "t", "m", "L")
    assert result.costs.source == "fit"


def test_mtp_kept_with_the_loss_fits_their_sum():
    result = fit_costs(HANDBOOK.model, HANDBOOK.parallel,
                       observe(["Ett|t*6|t*8|mL", "E|t*8|t*8|mL"]))  # fmt: skip
    assert result.columns == ("E", "t", PAIR)
    pair = result.costs.forward_ms["m"] + result.costs.forward_ms["L"]
    assert pair == pytest.approx(14.0 + 38.0, rel=0.01)
    assert any("measured together" in w for w in result.warnings)


def test_noisy_logs_stay_within_the_noise():
    cv = 0.03
    result = fit_costs(HANDBOOK.model, HANDBOOK.parallel,
                       observe(["Et*3|t*7|t*6m|L", "Et|t*15|m|L"], noise_cv=cv,
                               iterations=14))  # fmt: skip
    for unit in ("t", "m", "L"):  # E is 1 ms: its share of a stage is below the noise
        assert result.costs.forward_ms[unit] == pytest.approx(TRUTH.forward_ms[unit], rel=cv)
        assert result.costs.backward_ms[unit] == pytest.approx(TRUTH.backward_ms[unit], rel=cv)
    assert 0 < result.costs.jitter_cv["t"] < 5 * cv
    assert result.max_residual < cv


def test_dense_and_moe_layers_are_told_apart():
    from ray_layout.model import build_recipe

    recipe = build_recipe(
        {"num_layers": 8, "hidden_size": 1024, "num_attention_heads": 8, "seq_length": 1024,
         "vocab_size": 32000, "num_experts": 8, "moe_router_topk": 2,
         "moe_ffn_hidden_size": 512, "moe_layer_freq": "[0]*2+[1]*6", "mtp_num_layers": 1},
        {"pp": 4, "dp": 2, "micro_batch_size": 1}, source="test",
    )  # fmt: skip
    truth = costs_from_flops(recipe.model, recipe.parallel)
    plan = profile_design(recipe.model, recipe.parallel, MICROBATCHES, truth)
    assert plan.rank == len(plan.columns) == 4  # E, t_moe, t_dense, m+L
    runs = observe([str(layout) for layout in plan.layouts], costs=truth, recipe=recipe)
    result = fit_costs(recipe.model, recipe.parallel, runs)
    for unit in ("t_dense", "t_moe"):
        assert result.costs.forward_ms[unit] == pytest.approx(truth.forward_ms[unit], rel=0.01)


def test_runs_that_cannot_separate_units_are_refused():
    """On PP=2, Et*8|t*8mL puts E beside 8 t and m+L beside 8 t: two equations, three units."""
    from dataclasses import replace

    layout = Layout.parse("Et*8|t*8mL", 2)
    rows = design_rows(HANDBOOK.model, layout, unit_columns(HANDBOOK.model, False))
    assert np.linalg.matrix_rank(rows) == 2
    two = replace(HANDBOOK, parallel=replace(HANDBOOK.parallel, pp=2))
    with pytest.raises(ConfigError, match=r"cannot tell apart all of E, t, m\+L"):
        fit_costs(two.model, two.parallel, observe(["Et*8|t*8mL"], recipe=two))
    one_default_run = observe(["Et*4|t*4|t*4|t*4mL"])  # PP=4: E, t and m+L on different rows
    assert fit_costs(HANDBOOK.model, HANDBOOK.parallel, one_default_run).max_residual < 1e-6


def test_max_timer_option_is_refused_with_a_hint():
    from ray_layout.megatron_log_format import timers_max

    log = "\n".join([timers_max({"forward-compute": 10.0})] * 4) + "\n"
    with pytest.raises(ConfigError, match="timing-log-option all"):
        observation_from_log("run", parse_log(log), Layout.parse("Et*8|t*8mL", 2),
                             HANDBOOK.parallel, 8)  # fmt: skip


def test_profile_design_for_the_handbook():
    guess = costs_from_flops(HANDBOOK.model, HANDBOOK.parallel)
    kept = profile_design(HANDBOOK.model, HANDBOOK.parallel, 32, guess, hbm_gib=131)
    assert len(kept.layouts) == 2 and kept.rank == 3 and kept.condition < 10
    assert all(not layout.mtp_standalone for layout in kept.layouts)
    apart = profile_design(HANDBOOK.model, HANDBOOK.parallel, 32, guess, standalone_mtp=True)
    assert apart.columns == ("E", "t", "m", "L") and apart.rank == 4
    assert any(layout.mtp_standalone for layout in apart.layouts)
    flags = kept.megatron_flags(kept.layouts[0])
    assert flags[:4] == ["--pipeline-model-parallel-size", "4",
                         "--pipeline-model-parallel-layout", str(kept.layouts[0])]  # fmt: skip
    assert "--timing-log-option" in flags and "all" in flags


def test_memory_calibration_comes_back_from_max_allocated():
    from dataclasses import replace

    truth = replace(TRUTH, memory_calibration={"t": 1.3, "m": 0.8, "L": 1.1, "E": 1.0})
    runs = observe(["Et*3|t*7|t*6m|L", "Et|t*15|m|L"], costs=truth)
    result = fit_costs(HANDBOOK.model, HANDBOOK.parallel, runs)
    for unit in ("t", "L"):
        assert result.costs.memory_calibration[unit] == pytest.approx(
            truth.memory_calibration[unit], rel=0.02
        )
