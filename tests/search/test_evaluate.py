"""Batch scoring: agreement with the scalar simulator, jitter, memory and standalone MTP."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from ray_layout.model.costs import costs_from_flops, stage_compute_ms
from ray_layout.model.hf_config import load_hf_config
from ray_layout.model.layout import Layout
from ray_layout.model.memory_settings import memory_settings
from search.cost_model import build_cost_model
from search.evaluate import monte_carlo, score, stage_times, standard_normals
from search.pipeline_ops import ScheduleShape
from search.schedule import compile_schedule
from search.simulator import simulate, stage_durations
from search.space import LayoutSpace
from tests.helpers.planner_fixtures import UNITS, toy_cost_model

V3_RUN = load_hf_config("tests/data/hf/DeepSeek-V3/config.json", seq_length=1024)
V3 = V3_RUN.model


def counts_of(space: LayoutSpace, cuts: list[tuple[int, ...]]) -> np.ndarray:
    return space.unit_counts(np.array(cuts), UNITS, (True,) * space.num_layers)


def test_batch_scores_equal_one_layout_at_a_time():
    space = LayoutSpace(16, 1, 4)
    program = compile_schedule(ScheduleShape(4, 1, 8))
    model = toy_cost_model(4)
    cuts = np.concatenate(list(space.cut_blocks()))
    batch = score(program, model, space.unit_counts(cuts, UNITS, model.moe_pattern))
    for index in (0, 100, 500, len(cuts) - 1):
        one = score(program, model, space.unit_counts(cuts[[index]], UNITS, model.moe_pattern))
        assert one.noise_free_ms[0] == batch.noise_free_ms[index]
        assert np.array_equal(one.memory_bytes[0], batch.memory_bytes[index])


def test_noise_free_step_is_the_schedule_of_the_stage_sums():
    space = LayoutSpace(16, 1, 4)
    program = compile_schedule(ScheduleShape(4, 1, 8))
    model = toy_cost_model(4, tail_ms_per_gparam=0.0)
    counts = counts_of(space, [(6, 12, 17)])  # Et*5|t*6|t*5|mL
    f = [1 + 50, 60, 50, 14 + 38]
    expected = simulate(program, stage_durations(f), stage_durations([2 * x for x in f]),
                        np.full(4, 0.4)).step[0]  # fmt: skip
    assert score(program, model, counts).noise_free_ms[0] == pytest.approx(expected)


def test_two_equal_bottlenecks_lose_more_to_jitter_than_one():
    """The seed study's lesson: with per-op noise, two equally slow stages push the mean step
    further above the noise-free prediction than one slow stage does."""
    program = compile_schedule(ScheduleShape(4, 1, 16))
    normals = standard_normals(program, 2000, seed=1)
    space = LayoutSpace(14, 0, 4)
    model = toy_cost_model(4, layers=14, forward=(0.0, 10.0, 0.0, 0.0), jitter=0.1, p2p=0.0,
                           tail_ms_per_gparam=0.0)  # fmt: skip
    one_slow = counts_of(space, [(4, 7, 10)])  # t*3 | t*3 | t*3 | t*5 (E and L are free)
    two_slow = counts_of(space, [(6, 11, 14)])  # t*5 | t*5 | t*3 | t*1
    one, two = score(program, model, one_slow), score(program, model, two_slow)
    assert (one.near_bottleneck[0], two.near_bottleneck[0]) == (1, 2)
    excess_one = monte_carlo(program, model, one_slow, normals).mean() - one.noise_free_ms[0]
    excess_two = monte_carlo(program, model, two_slow, normals).mean() - two.noise_free_ms[0]
    assert excess_two > 0 and excess_two > excess_one + 0.5 * excess_two


def test_monte_carlo_mean_never_below_noise_free_on_average():
    program = compile_schedule(ScheduleShape(4, 1, 8))
    space = LayoutSpace(16, 1, 4)
    model = toy_cost_model(4, jitter=0.05)
    counts = counts_of(space, [(6, 12, 17), (5, 10, 15)])
    steps = monte_carlo(program, model, counts, standard_normals(program, 4000, seed=2))
    noise_free = score(program, model, counts).noise_free_ms
    assert np.all(steps.mean(axis=1) >= noise_free - 0.5)  # Jensen, up to sampling error
    assert np.all(np.quantile(steps, 0.9, axis=1) > noise_free)


def test_memory_adds_logits_on_last_rank_and_copies_for_standalone_mtp():
    program = compile_schedule(ScheduleShape(4, 1, 8))
    space = LayoutSpace(16, 1, 4, allow_standalone_mtp=True)
    model = toy_cost_model(4)
    kept, alone = counts_of(space, [(6, 12, 17)]), counts_of(space, [(6, 12, 18)])
    kept_score, alone_score = score(program, model, kept), score(program, model, alone)
    gib = 2**30
    # Et*5|t*6|t*5|mL, last rank: m and L static, their activations x 1 in flight, logits, overhead
    expected_last = (3.6 + 3.0) + (0.6 + 0.3) * 1 + 4 + 3
    assert kept_score.memory_bytes[0, 3] / gib == pytest.approx(expected_last)
    # Et*5|t*6|t*5m|L: rank 2 holds m without L and builds an embedding copy
    assert alone_score.standalone[0] and not kept_score.standalone[0]
    expected_rank2 = 5 * 3.5 + 3.6 + 3.0 + (5 * 0.5 + 0.6) * 2 + 3
    assert alone_score.memory_bytes[0, 2] / gib == pytest.approx(expected_rank2)
    unpenalised = score(program, replace(model, mtp_standalone_factor=1.0), alone)
    assert alone_score.noise_free_ms[0] == pytest.approx(1.12 * unpenalised.noise_free_ms[0])


@pytest.mark.parametrize("layers", [0, 1, 2, 3])
@pytest.mark.parametrize("vpp", [1, 2])
def test_block_recompute_re_runs_each_stages_own_first_layers_as_the_rank_rule_does(layers, vpp):
    """The batch's block recomputation and block saving follow each flat stage's first layers
    in model order, as ``stage_compute_ms`` walks a stage's units: a dense layer between MoE
    ones is counted where it sits, not first."""
    pattern = (False, True, True, False, True, False, True, True)
    model = replace(V3, num_layers=8, moe_layer_pattern=pattern, moe_layer_experts=())
    parallel = replace(V3_RUN.parallel, pp=2, vpp=vpp)
    costs = costs_from_flops(model, parallel)
    block = ["--recompute-granularity", "full", "--recompute-method", "block"]
    settings = memory_settings([*block, "--recompute-num-layers", str(layers)])
    cost_model = build_cost_model(model, parallel, costs, 8, settings=settings)
    space = LayoutSpace.of(model, parallel)
    cuts = np.concatenate(list(space.cut_blocks()))
    _, backward = stage_times(cost_model, space.unit_counts(cuts, cost_model.units, pattern))
    for row, cut in enumerate(cuts):
        layout = Layout.parse(space.layout_string(cut), 2)
        _, expected = stage_compute_ms(costs, model, layout.stages, settings)
        assert backward[row] == pytest.approx(expected), layout
    assert cost_model.block_layers == layers
