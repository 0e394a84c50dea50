"""The fit recovers known unit costs from synthetic Megatron logs; the profile design works."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from ray_layout.errors import MeasurementError
from ray_layout.measure.design import (
    PAIR,
    design_rows,
    profile_design,
    relative_errors,
    unit_columns,
)
from ray_layout.measure.fit import fit_costs, simulated_step_ms
from ray_layout.measure.log_format import timers_max
from ray_layout.measure.logs import parse_log
from ray_layout.measure.observations import (
    STEP_WARMUP,
    observation_from_log,
    observation_from_records,
)
from ray_layout.model.costs import costs_from_flops, load_costs
from ray_layout.model.layout import Layout
from ray_layout.model.spec import load_recipe_file
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


# The design the tune profiles for the handbook on PP=4 with 32 micro-batches (the quickstart)
QUICKSTART = ("Et*4|t*6|t*6|mL", "E|t*8|t*7|tmL")


def test_a_light_unit_is_fitted_from_the_rank_it_holds_alone():
    """E (1 ms) is alone on PP rank 0 of the second run and beside 40 ms of layers in the first.
    Weighted by each rank's spread the fit takes it from the light rank, within the noise there;
    unweighted, the heavy rank's 3% jitter moved it by +9% (forward) and -6% (backward)."""
    result = fit_costs(HANDBOOK.model, HANDBOOK.parallel, observe(QUICKSTART, noise_cv=0.03))
    for table in ("forward_ms", "backward_ms"):
        fitted, truth = getattr(result.costs, table), getattr(TRUTH, table)
        for unit in ("E", "t"):
            assert fitted[unit] == pytest.approx(truth[unit], rel=0.01)
        assert fitted["m"] + fitted["L"] == pytest.approx(truth["m"] + truth["L"], rel=0.01)


def relative_errors_of(texts, unit_ms):
    columns = unit_columns(HANDBOOK.model, True)
    rows = [design_rows(HANDBOOK.model, Layout.parse(text, 4), columns) for text in texts]
    stacked = np.concatenate(rows).astype(float)[None]
    return dict(zip(columns, relative_errors(stacked, np.array(
        [unit_ms[c] for c in columns]))[0], strict=True))  # fmt: skip


def test_relative_errors_are_weighted_least_squares_errors():
    """Each unit's standard error over its cost when every rank's timer spreads in proportion to
    its time: (A^T W A)^-1 with W = 1 / stage^2, written out."""
    texts, costs = ("Et*4|t*6|t*6|mL", "E|t*16|m|L"), TRUTH.backward_ms
    columns = unit_columns(HANDBOOK.model, True)
    a = np.concatenate([design_rows(HANDBOOK.model, Layout.parse(t, 4), columns) for t in texts])
    cost = np.array([costs[c] for c in columns])
    weights = np.diag(1 / (a @ cost) ** 2)
    expected = np.sqrt(np.diag(np.linalg.inv(a.T @ weights @ a))) / cost
    found = relative_errors_of(texts, costs)
    assert [found[c] for c in columns] == pytest.approx(expected.tolist(), rel=1e-9)
    assert max(found.values()) <= 1.0  # E, m and L each alone on a rank: at most its cv
    unresolved = relative_errors_of(texts[:1], costs)  # m and L always together
    assert all(value == np.inf for value in unresolved.values())


def test_the_design_puts_each_unit_where_it_can_be_measured():
    """A well-conditioned count matrix can still lose a light unit: E beside 4 or 5 layers in
    every run (the pick of the condition number alone) leaves E forward at 500 times the
    timers' cv; the design's MTP-standalone pick holds E, m and L each alone."""
    guess = costs_from_flops(HANDBOOK.model, HANDBOOK.parallel)
    apart = profile_design(HANDBOOK.model, HANDBOOK.parallel, 32, guess, standalone_mtp=True)
    assert [str(layout) for layout in apart.layouts] == ["Et*4|t*6|t*6|mL", "E|t*16|m|L"]
    assert apart.worst_relative_error == pytest.approx(1.0, abs=0.01)
    beside = relative_errors_of(("Et*4|t*6|t*6|mL", "Et*5|t*9|t*2m|L"), guess.forward_ms)
    assert beside["E"] > 100 and beside["m"] > 2
    kept = profile_design(HANDBOOK.model, HANDBOOK.parallel, 32, guess, hbm_gib=131)
    assert [str(layout) for layout in kept.layouts] == list(QUICKSTART)
    assert kept.worst_relative_error == pytest.approx(1.0, abs=0.01)


def test_dense_and_moe_layers_are_told_apart():
    from ray_layout.model.spec import build_recipe

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
    with pytest.raises(MeasurementError, match=r"cannot tell apart all of E, t, m\+L"):
        fit_costs(two.model, two.parallel, observe(["Et*8|t*8mL"], recipe=two))
    one_default_run = observe(["Et*4|t*4|t*4|t*4mL"])  # PP=4: E, t and m+L on different rows
    assert fit_costs(HANDBOOK.model, HANDBOOK.parallel, one_default_run).max_residual < 1e-6


def test_max_timer_option_is_refused_with_a_hint():
    log = "\n".join([timers_max({"forward-compute": 10.0})] * 4) + "\n"
    with pytest.raises(MeasurementError, match="timing-log-option all"):
        observation_from_log("run", parse_log(log), Layout.parse("Et*8|t*8mL", 2),
                             HANDBOOK.parallel, 8)  # fmt: skip


def test_profile_design_for_the_handbook():
    guess = costs_from_flops(HANDBOOK.model, HANDBOOK.parallel)
    kept = profile_design(HANDBOOK.model, HANDBOOK.parallel, 32, guess, hbm_gib=131)
    assert len(kept.layouts) == 2 and kept.rank == 3 and kept.condition < 10
    assert all(not layout.mtp_standalone for layout in kept.layouts)
    apart = profile_design(HANDBOOK.model, HANDBOOK.parallel, 32, guess, standalone_mtp=True)
    assert apart.columns == ("E", "t", "m", "L") and apart.rank == 4
    assert any(layout.mtp_standalone for layout in apart.layouts) and not apart.unidentified
    assert kept.unidentified and "m and L apart" in kept.unidentified[0]
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


def test_fitted_memory_predicts_every_ranks_max_allocated_within_5_percent():
    """The simulator's peak under the fitted calibration, less the fixed overhead Megatron's
    allocator does not see, against each rank's max allocated, on a layout no run had."""
    from search.cost_model import build_cost_model
    from search.evaluate import memory
    from search.space import LayoutSpace

    truth = replace(TRUTH, memory_calibration={"t": 1.25, "m": 0.9, "L": 1.2, "E": 1.0})
    result = fit_costs(HANDBOOK.model, HANDBOOK.parallel,
                       observe(["Et*3|t*7|t*6m|L", "Et|t*15|m|L"], costs=truth))  # fmt: skip
    layout = Layout.parse("Et*4|t*5|t*5|t*2mL", HANDBOOK.parallel.pp)
    (measured,) = observe([str(layout)], costs=truth)
    model = build_cost_model(HANDBOOK.model, HANDBOOK.parallel, result.costs, MICROBATCHES)
    space, cuts = LayoutSpace.holding(layout)
    counts = space.unit_counts(cuts[None], model.units, model.moe_pattern)
    predicted_mb = (memory(model, counts, layout.pp)[0] - model.overhead_bytes) / 2**20
    assert predicted_mb == pytest.approx(measured.max_allocated_mb, rel=0.05)


def test_every_ranks_max_allocated_line_counts():
    """A stage's peak is the largest any of its ranks (TP/CP/DP peers) reported."""
    layout = Layout.parse(KEPT[0], HANDBOOK.parallel.pp)
    parsed = parse_log(synthetic_log(HANDBOOK.model, HANDBOOK.parallel, layout, TRUTH,
                                     MICROBATCHES))  # fmt: skip
    first = parsed.memory[0]
    peer = replace(first, rank=first.rank + 1, max_allocated_mb=first.max_allocated_mb + 100.0)
    run = observation_from_records("run", parsed.timers, [*parsed.memory, peer], layout,
                                   HANDBOOK.parallel, MICROBATCHES)  # fmt: skip
    stage = first.rank // (HANDBOOK.parallel.world_size // HANDBOOK.parallel.pp)
    assert run.max_allocated_mb[stage] == pytest.approx(first.max_allocated_mb + 100.0)
    assert np.isfinite(run.max_allocated_mb).all()


# --- p2p within and across nodes, and the per-transfer latency -------------------------------

# Layouts that keep MTP beside the loss: the simulator multiplies an MTP-standalone layout's step
# by ``mtp_standalone_factor`` (1.12), which the synthetic logs do not print, so the step-time
# checks use layouts the factor does not touch.
KEPT = ("Ett|t*6|t*8|mL", "E|t*8|t*8|mL")
ON_4_GPU_NODES = replace(TRUTH, gpus_per_node=4)  # PP=4 x DP=2: stages 0-1 and 2-3 share a node


def observe_on(
    costs,
    texts=KEPT,
    extra_p2p_ms=0.0,
    parallel=HANDBOOK.parallel,
    steps=True,
    microbatches=(MICROBATCHES, MICROBATCHES),
):
    """Noise-free runs of ``texts`` (with ``microbatches``) simulated on
    ``costs.gpus_per_node``-GPU nodes; the printed step pays ``extra_p2p_ms`` on every transfer
    (the timers do not); ``steps=False`` drops the iteration lines, as a log without them
    would."""
    runs = []
    for index, (text, count) in enumerate(zip(texts, microbatches, strict=True)):
        layout = Layout.parse(text, parallel.pp)
        log = synthetic_log(HANDBOOK.model, parallel, layout, costs, count, iterations=8,
                            seed=index, extra_p2p_ms=extra_p2p_ms)  # fmt: skip
        if not steps:
            log = "".join(line for line in log.splitlines(True) if " iteration " not in line)
        runs.append(observation_from_log(f"run{index}", parse_log(log), layout, parallel,
                                         count))  # fmt: skip
    return runs


# Runs of 8 and 32 micro-batches: the latency costs the longer one more transfers, a fixed tail
# the same, so their steps tell the two apart.
APART = (MICROBATCHES, 4 * MICROBATCHES)


def test_inter_node_links_follow_megatrons_rank_order():
    from ray_layout.model.spec import ParallelConfig
    from search.cost_model import inter_node_links

    pp4_dp2 = ParallelConfig(pp=4, dp=2)  # stage r holds global ranks 2r, 2r+1
    assert inter_node_links(pp4_dp2, 4).tolist() == [False, True, False, True]  # 1->2, 3->0
    assert inter_node_links(pp4_dp2, 8).tolist() == [False] * 4
    assert inter_node_links(pp4_dp2, 2).tolist() == [True] * 4  # every stage on its own node
    assert inter_node_links(ParallelConfig(pp=4), 2).tolist() == [False, True, False, True]
    # TP x DP = 4 per stage on 4-GPU nodes: one node per stage, every boundary crosses
    assert inter_node_links(ParallelConfig(tp=2, pp=2, dp=2), 4).tolist() == [True, True]
    # PP=3 x DP=2 on 4-GPU nodes: stages {0,1} {2,3} | {4,5}: 0->1 stays, 1->2 and 2->0 cross
    assert inter_node_links(ParallelConfig(pp=3, dp=2), 4).tolist() == [False, True, True]
    # 3 GPUs a stage on 4-GPU nodes: the pair 0<->3 shares node 0, 1<->4 does not: it crosses
    assert inter_node_links(ParallelConfig(pp=2, dp=3), 4).tolist() == [True, True]
    assert inter_node_links(ParallelConfig(pp=1, dp=8), 4).tolist() == [False]


def test_p2p_links_pick_each_boundarys_cost():
    from search.cost_model import p2p_links

    four = p2p_links(ON_4_GPU_NODES, HANDBOOK.parallel)
    assert four.tolist() == [0.4, 2.0, 0.4, 2.0]
    assert p2p_links(TRUTH, HANDBOOK.parallel).tolist() == [0.4] * 4  # 8-GPU nodes


def test_p2p_within_and_across_nodes_come_back_from_4_gpu_nodes():
    runs = observe_on(ON_4_GPU_NODES)
    result = fit_costs(HANDBOOK.model, HANDBOOK.parallel, runs, gpus_per_node=4)
    assert result.costs.gpus_per_node == 4
    assert result.costs.p2p_intra_node_ms == pytest.approx(0.4, rel=0.02)
    assert result.costs.p2p_inter_node_ms == pytest.approx(2.0, rel=0.02)
    assert result.p2p_latency_ms == 0.0
    assert all(abs(e) < 0.001 for e in result.step_errors.values())


def test_the_wrong_node_size_cannot_tell_the_links_apart():
    """Told 8-GPU nodes, every boundary of the 4-GPU runs is taken as intra-node: intra is the
    fastest call (0.4), inter is only the guess's ratio to it, and the steps, which paid 2.0 ms
    on two of the four boundaries, are matched by a latency the data does not have."""
    runs = observe_on(ON_4_GPU_NODES, microbatches=APART)
    result = fit_costs(HANDBOOK.model, HANDBOOK.parallel, runs, gpus_per_node=8)
    guess = costs_from_flops(HANDBOOK.model, HANDBOOK.parallel)
    ratio = guess.p2p_inter_node_ms / guess.p2p_intra_node_ms
    latency = result.p2p_latency_ms
    assert result.costs.gpus_per_node == 8
    assert result.costs.p2p_intra_node_ms - latency == pytest.approx(0.4, rel=0.01)
    assert result.costs.p2p_inter_node_ms - latency == pytest.approx(0.4 * ratio, rel=0.01)
    assert latency > 0.2  # the hidden inter-node time, spread over every transfer
    assert all(abs(e) < 0.001 for e in result.step_errors.values())


def test_a_link_kind_no_run_crossed_keeps_the_base_ratio():
    base = replace(TRUTH, p2p_intra_node_ms=1.0, p2p_inter_node_ms=5.0)
    intra_only = fit_costs(HANDBOOK.model, HANDBOOK.parallel, observe_on(TRUTH), base=base)
    assert intra_only.costs.gpus_per_node == 8
    assert intra_only.p2p_latency_ms == 0.0
    assert intra_only.costs.p2p_intra_node_ms == pytest.approx(0.4, rel=0.01)
    assert intra_only.costs.p2p_inter_node_ms == pytest.approx(0.4 * 5.0, rel=0.01)
    # the mirror: on 2-GPU nodes every stage has a node of its own, every link crosses
    two = replace(TRUTH, gpus_per_node=2)
    inter_only = fit_costs(HANDBOOK.model, HANDBOOK.parallel, observe_on(two), base=base,
                           gpus_per_node=2)  # fmt: skip
    assert inter_only.p2p_latency_ms == 0.0
    assert inter_only.costs.p2p_inter_node_ms == pytest.approx(2.0, rel=0.01)
    assert inter_only.costs.p2p_intra_node_ms == pytest.approx(2.0 / 5.0, rel=0.01)


def test_interleaved_runs_give_back_the_inter_node_p2p():
    texts = ("Ett|t*2|t*2|t*2|t*2|t*2|t*2|tmL", "E|t*3|t*2|t*2|t*2|t*2|t*2|t*3mL")  # VPP=2
    runs = observe_on(ON_4_GPU_NODES, texts)
    assert all(run.layout.vpp == 2 for run in runs)
    result = fit_costs(HANDBOOK.model, HANDBOOK.parallel, runs, gpus_per_node=4)
    bare_inter = result.costs.p2p_inter_node_ms - result.p2p_latency_ms
    assert bare_inter == pytest.approx(2.0, rel=0.05)


@pytest.mark.parametrize("latency", [0.3, 1.0])
def test_the_per_transfer_latency_comes_back_from_the_step_times(latency):
    runs = observe_on(ON_4_GPU_NODES, extra_p2p_ms=latency, microbatches=APART)
    result = fit_costs(HANDBOOK.model, HANDBOOK.parallel, runs, gpus_per_node=4)
    assert result.p2p_latency_ms == pytest.approx(latency, rel=0.1)
    assert result.costs.tail_fixed_ms < 0.05 * latency
    assert result.costs.p2p_intra_node_ms == pytest.approx(0.4 + latency, rel=0.05)
    assert result.costs.p2p_inter_node_ms == pytest.approx(2.0 + latency, rel=0.05)
    assert set(result.step_errors) == {"run0", "run1"}
    assert all(abs(e) < 0.01 for e in result.step_errors.values())
    # the unit costs come from the timers alone: the latency leaves them as they were
    untimed = fit_costs(HANDBOOK.model, HANDBOOK.parallel,
                        [replace(run, step_ms=None) for run in runs], gpus_per_node=4)  # fmt: skip
    assert result.costs.forward_ms == untimed.costs.forward_ms
    assert result.costs.backward_ms == untimed.costs.backward_ms


@pytest.mark.parametrize("fixed", [5.0, 40.0])
def test_a_fixed_step_tail_comes_back_and_p2p_stays_the_bare_transfer(fixed):
    """Runs of one micro-batch count cannot tell a fixed tail from a latency: the fit takes the
    fixed tail (p2p stays what the timers measured) and says so."""
    truth = replace(ON_4_GPU_NODES, tail_fixed_ms=fixed)
    result = fit_costs(HANDBOOK.model, HANDBOOK.parallel, observe_on(truth), gpus_per_node=4)
    assert result.costs.tail_fixed_ms == pytest.approx(fixed, rel=0.02)
    assert result.p2p_latency_ms == 0.0
    assert result.costs.p2p_intra_node_ms == pytest.approx(0.4, rel=0.02)
    assert result.costs.p2p_inter_node_ms == pytest.approx(2.0, rel=0.02)
    assert result.costs.grad_sync_ms_per_gparam == pytest.approx(20.0, rel=0.01)
    assert result.costs.optimizer_ms_per_gparam == pytest.approx(5.0, rel=0.01)
    assert all(abs(e) < 0.001 for e in result.step_errors.values())
    assert any("cannot tell it from a per-transfer latency" in w for w in result.warnings)


def test_a_fixed_tail_and_a_latency_come_back_together_from_other_micro_batch_counts():
    truth = replace(ON_4_GPU_NODES, tail_fixed_ms=12.0)
    runs = observe_on(truth, extra_p2p_ms=0.5, microbatches=APART)
    result = fit_costs(HANDBOOK.model, HANDBOOK.parallel, runs, gpus_per_node=4)
    assert result.costs.tail_fixed_ms == pytest.approx(12.0, rel=0.1)
    assert result.p2p_latency_ms == pytest.approx(0.5, rel=0.1)
    assert result.costs.p2p_intra_node_ms - result.p2p_latency_ms == pytest.approx(0.4, rel=0.02)
    assert all(abs(e) < 0.001 for e in result.step_errors.values())
    assert not any("cannot tell" in w for w in result.warnings)


def noisy_runs(truth, texts, iterations, noise_cv):
    """Synthetic runs of ``texts`` under ``truth`` with per-op noise, a seed each."""
    runs = []
    for index, text in enumerate(texts):
        layout = Layout.parse(text, HANDBOOK.parallel.pp)
        log = synthetic_log(HANDBOOK.model, HANDBOOK.parallel, layout, truth, MICROBATCHES,
                            iterations=iterations, noise_cv=noise_cv, seed=index)  # fmt: skip
        runs.append(observation_from_log(f"run{index}", parse_log(log), layout,
                                         HANDBOOK.parallel, MICROBATCHES))  # fmt: skip
    return runs


def test_noisy_steps_keep_the_fixed_tail_within_the_noise():
    runs = noisy_runs(replace(TRUTH, tail_fixed_ms=30.0), KEPT * 2, iterations=12, noise_cv=0.02)
    result = fit_costs(HANDBOOK.model, HANDBOOK.parallel, runs)
    step = np.mean([run.step_ms for run in runs])
    assert abs(result.costs.tail_fixed_ms - 30.0) < 0.02 * step
    assert result.costs.p2p_intra_node_ms == pytest.approx(0.4, rel=0.05)


def test_no_latency_in_the_data_fits_none_and_changes_nothing():
    runs = observe_on(ON_4_GPU_NODES)
    assert all(run.step_ms is not None for run in runs)
    result = fit_costs(HANDBOOK.model, HANDBOOK.parallel, runs, gpus_per_node=4)
    untimed = fit_costs(HANDBOOK.model, HANDBOOK.parallel,
                        [replace(run, step_ms=None) for run in runs], gpus_per_node=4)  # fmt: skip
    assert result.p2p_latency_ms < 0.01 * 0.4
    assert result.costs.tail_fixed_ms < 0.01
    assert untimed.p2p_latency_ms == 0.0 and untimed.step_errors == {}
    for key in ("p2p_intra_node_ms", "p2p_inter_node_ms"):
        assert getattr(result.costs, key) == pytest.approx(getattr(untimed.costs, key), rel=0.01)
    assert result.costs.forward_ms == untimed.costs.forward_ms
    assert result.costs.backward_ms == untimed.costs.backward_ms


def test_runs_without_iteration_lines_fit_no_latency():
    runs = observe_on(ON_4_GPU_NODES, extra_p2p_ms=0.5, steps=False)
    assert all(run.step_ms is None for run in runs)
    result = fit_costs(HANDBOOK.model, HANDBOOK.parallel, runs, gpus_per_node=4)
    assert result.p2p_latency_ms == 0.0 and result.step_errors == {}
    assert result.costs.p2p_intra_node_ms == pytest.approx(0.4, rel=0.02)
    assert result.costs.p2p_inter_node_ms == pytest.approx(2.0, rel=0.02)


def test_step_ms_is_the_mean_after_the_warmup_iterations():
    layout = Layout.parse(KEPT[0], HANDBOOK.parallel.pp)
    parsed = parse_log(synthetic_log(HANDBOOK.model, HANDBOOK.parallel, layout, TRUTH,
                                     MICROBATCHES))  # fmt: skip

    def step_ms(steps):
        return observation_from_records("run", parsed.timers, parsed.memory, layout,
                                        HANDBOOK.parallel, MICROBATCHES,
                                        steps_ms=steps).step_ms  # fmt: skip

    assert STEP_WARMUP == 3
    assert step_ms([900.0, 500.0, 400.0, 100.0, 110.0, 120.0]) == pytest.approx(110.0)
    assert step_ms([900.0, 500.0, 400.0, 130.0]) == pytest.approx(130.0)
    assert step_ms([900.0, 500.0, 400.0]) is None
    assert step_ms([]) is None
    logged = observation_from_log("run", parsed, layout, HANDBOOK.parallel, MICROBATCHES)
    printed = [record.elapsed_ms for record in parsed.iterations]
    assert len(printed) == 6 and logged.step_ms == pytest.approx(np.mean(printed[3:]))


def test_jitter_lengthens_the_predicted_step_and_is_not_also_fitted_as_a_fixed_tail():
    """Per-op jitter makes the mean step longer than the noise-free one (the critical path takes
    the slower branch); the planner's predictions carry that through its Monte Carlo, so the
    fit must compare the steps with the same mean, or it adds the lengthening again as a tail."""
    runs = noisy_runs(TRUTH, KEPT, iterations=40, noise_cv=0.08)
    result = fit_costs(HANDBOOK.model, HANDBOOK.parallel, runs)
    still = replace(result.costs, jitter_cv=dict.fromkeys(result.costs.jitter_cv, 0.0))
    lengthening = [
        simulated_step_ms(HANDBOOK.model, HANDBOOK.parallel, result.costs, run)
        - simulated_step_ms(HANDBOOK.model, HANDBOOK.parallel, still, run)
        for run in runs
    ]
    assert min(lengthening) > 0
    assert result.costs.tail_fixed_ms < 0.5 * np.mean(lengthening)
    assert all(abs(error) < 0.01 for error in result.step_errors.values())
