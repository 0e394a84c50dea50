"""The fit recovers known unit costs from synthetic Megatron logs."""

from __future__ import annotations

from dataclasses import replace
from functools import partial

import numpy as np
import pytest

from ray_layout.errors import MeasurementError
from ray_layout.measure.design import PAIR, design_rows, profile_design, unit_columns
from ray_layout.measure.fit import fit_costs
from ray_layout.measure.observations import RunObservation
from ray_layout.model.costs import costs_from_flops
from ray_layout.model.layout import Layout
from ray_layout.model.memory_settings import MemorySettings, memory_settings
from ray_layout.model.recompute_cost import recompute_shares
from search.cost_model import build_cost_model
from tests.helpers import synthetic_runs
from tests.helpers.measure_runs import (
    APART,
    HANDBOOK,
    MICROBATCHES,
    ON_4_GPU_NODES,
    QUICKSTART,
    TRUTH,
    observe,
    observe_on,
)


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


# --- p2p within and across nodes ------------------------------------------------------------


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


def test_interleaved_runs_with_overlapped_p2p_say_nothing_of_a_transfer():
    """Their logs lack the combined call's timer; their steady calls only post (timers near 0),
    so the fit keeps the guess's p2p rather than fit it to nothing."""
    texts = ("Ett|t*2|t*2|t*2|t*2|t*2|t*2|tmL", "E|t*3|t*2|t*2|t*2|t*2|t*2|t*3mL")
    posting = ("forward-send-forward-recv", "backward-send-backward-recv")
    runs = []
    for run in observe_on(ON_4_GPU_NODES, texts):
        timers = {k: v * (0.01 if k in posting else 1) for k, v in run.timers.items()}
        del timers["forward-backward-send-forward-backward-recv"]
        runs.append(replace(run, timers=timers, step_ms=None))
    guess = costs_from_flops(HANDBOOK.model, HANDBOOK.parallel)
    result = fit_costs(HANDBOOK.model, HANDBOOK.parallel, runs, base=guess, gpus_per_node=4)
    assert result.costs.p2p_inter_node_ms == guess.p2p_inter_node_ms
    assert result.costs.p2p_intra_node_ms == guess.p2p_intra_node_ms


def test_a_run_declared_with_a_layout_one_layer_off_is_refused_not_warned():
    """Moving one layer misses its two stages by 18%, under the 25% bound: the timers still show
    the layout it ran, so the fit refuses it (the costs are not written) unless accepted."""
    runs = observe(["Et*3|t*7|t*6m|L", "Et|t*15|m|L", "Et*5|t*6|t*5|mL"])
    wrong = replace(runs[2], name="wrong", layout=Layout.parse("Et*5|t*5|t*6|mL", 4))
    refused = r"wrong: declared as Et\*5\|t\*5\|t\*6\|mL, but its timers show layout Et\*5\|t\*6"
    with pytest.raises(MeasurementError, match=refused + r".*--accept-residuals$"):
        fit_costs(HANDBOOK.model, HANDBOOK.parallel, [*runs[:2], wrong])
    runs = [*runs[:2], wrong]
    accepted = fit_costs(HANDBOOK.model, HANDBOOK.parallel, runs, accept_residuals=True)
    assert accepted.suggested_layouts == {"wrong": "Et*5|t*6|t*5|mL"}


# --- runs that recompute --------------------------------------------------------------------

RECOMPUTING = {
    "full uniform": "--recompute-granularity full --recompute-method uniform"
    " --recompute-num-layers 1",
    "full block": "--recompute-granularity full --recompute-method block --recompute-num-layers 2",
    "selective": "--recompute-granularity selective --recompute-modules core_attn moe_act",
}
INTERLEAVED = ("Ett|t*2|t*2|t*2|t*2|t*2|t*2|tmL", "E|t*3|t*2|t*2|t*2|t*2|t*2|t*3mL")


def observe_recomputing(
    monkeypatch: pytest.MonkeyPatch, settings: MemorySettings, texts: tuple[str, ...]
) -> list[RunObservation]:
    """Noisy runs whose backward re-ran what ``settings`` recompute: ``synthetic_log`` times
    them on a cost model built under those settings, as the planner prices such a job."""
    recomputing = partial(build_cost_model, settings=settings)
    monkeypatch.setattr(synthetic_runs, "build_cost_model", recomputing)
    return observe(texts, noise_cv=0.02, iterations=10)


@pytest.mark.parametrize(
    ("setting", "texts"),
    [
        *((name, ("Et*3|t*7|t*6m|L", "Et|t*15|m|L")) for name in RECOMPUTING),
        ("full block", INTERLEAVED),  # each chunk's own first layers
    ],
)
def test_the_runs_recomputation_is_taken_out_of_the_backward(monkeypatch, setting, texts):
    """Told the runs' recompute flags, the fit gives back the plain backward the runs were made
    from, and says per unit what it took out; not told, it keeps the recomputation in."""
    settings = memory_settings(RECOMPUTING[setting].split())
    runs = observe_recomputing(monkeypatch, settings, texts)
    model, parallel = HANDBOOK.model, HANDBOOK.parallel
    result = fit_costs(model, parallel, runs, memory=settings)
    units = ("t", "m", "L") if "m" in result.columns else ("t",)
    for unit in units:  # E is 1 ms: its share of a stage is below the noise
        assert result.costs.forward_ms[unit] == pytest.approx(TRUTH.forward_ms[unit], rel=0.02)
        assert result.costs.backward_ms[unit] == pytest.approx(TRUTH.backward_ms[unit], rel=0.02)
    assert result.max_residual < 0.02
    shares = recompute_shares(model, settings)
    share = shares.every.get("t", 0.0) + shares.block.get("t", 0.0)
    assert result.recompute_ms["t"] == pytest.approx(share * TRUTH.forward_ms["t"], rel=0.02)
    assert ("m" in result.recompute_ms) is (setting != "full block")  # MTP: not under block
    assert "L" not in result.recompute_ms and "E" not in result.recompute_ms

    untold = fit_costs(model, parallel, runs, accept_residuals=True)
    assert untold.recompute_ms == {}
    assert untold.costs.backward_ms["t"] > 1.04 * TRUTH.backward_ms["t"]


def test_a_plain_fit_takes_nothing_out():
    result = fit_costs(HANDBOOK.model, HANDBOOK.parallel, observe(QUICKSTART))
    assert result.recompute_ms == {}
