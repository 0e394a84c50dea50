"""The step beyond the units' compute comes back from the runs' step times: a per-transfer
latency, a fixed tail, or both where other micro-batch counts tell them apart."""

from __future__ import annotations

from dataclasses import replace
from functools import partial

import numpy as np
import pytest

from ray_layout.measure.fit import fit_costs
from ray_layout.measure.logs import parse_log
from ray_layout.measure.observations import observation_from_log
from ray_layout.measure.step_fit import simulated_step_ms, step_overheads, step_tail
from ray_layout.model.layout import Layout
from ray_layout.model.memory_settings import memory_settings
from search.cost_model import build_cost_model
from tests.helpers import synthetic_runs
from tests.helpers.measure_runs import (
    APART,
    HANDBOOK,
    KEPT,
    MICROBATCHES,
    ON_4_GPU_NODES,
    TRUTH,
    observe,
    observe_on,
)
from tests.helpers.synthetic_runs import synthetic_log


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


def test_the_step_tail_timers_scale_with_the_parameters_a_gpu_holds():
    """all-grads-sync and optimizer per billion parameters, through the origin; a run without
    those timers adds nothing, and no run with them fits nothing."""
    runs = observe(["Et*3|t*7|t*6m|L", "Et|t*15|m|L"])
    found = step_tail(HANDBOOK.model, HANDBOOK.parallel, runs)
    assert found["grad_sync_ms_per_gparam"] == pytest.approx(20.0, rel=0.01)
    assert found["optimizer_ms_per_gparam"] == pytest.approx(5.0, rel=0.01)
    bare = [replace(run, timers={}) for run in runs]
    assert step_tail(HANDBOOK.model, HANDBOOK.parallel, bare) == {}
    one = step_tail(HANDBOOK.model, HANDBOOK.parallel, [bare[0], runs[1]])
    assert one == pytest.approx(found, rel=0.01)


@pytest.mark.parametrize(
    "flags",
    [
        "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1",
        "--recompute-granularity full --recompute-method block --recompute-num-layers 2",
        "--recompute-granularity selective --recompute-modules core_attn moe_act",
    ],
)
def test_recomputing_runs_steps_are_simulated_recomputing(monkeypatch, flags):
    """The costs' backward leaves the runs' recomputation out, their steps paid it: simulated
    with the runs' flags the steps need no latency or tail; simulated plain, a latency the data
    does not have made up the difference."""
    settings = memory_settings(flags.split())
    monkeypatch.setattr(
        synthetic_runs, "build_cost_model", partial(build_cost_model, settings=settings)
    )
    runs = observe_on(TRUTH, microbatches=APART)
    model, parallel = HANDBOOK.model, HANDBOOK.parallel
    result = fit_costs(model, parallel, runs, memory=settings)
    assert result.p2p_latency_ms == 0.0 and result.costs.tail_fixed_ms < 0.01
    assert all(abs(e) < 0.001 for e in result.step_errors.values())
    latency, fixed, _, _ = step_overheads(model, parallel, result.costs, runs)
    assert latency + fixed > 1.0
