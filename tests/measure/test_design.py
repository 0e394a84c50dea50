"""The profile design: which units a run's per-rank timers identify, how well, and which few
layouts to profile."""

from __future__ import annotations

import time
import tracemalloc
from dataclasses import replace

import numpy as np
import pytest

from ray_layout.errors import ConfigError
from ray_layout.measure.design import (
    PAIR,
    PROFILE_FLAGS,
    TIMER_RESOLUTION_MS,
    _errors_with,
    _raising_rank,
    design_rows,
    profile_design,
    relative_errors,
    share_errors,
    timer_spread,
    unit_columns,
)
from ray_layout.model.costs import costs_from_flops
from ray_layout.model.layout import Layout
from ray_layout.model.loading import load_recipe
from ray_layout.model.megatron_recipe import Overrides
from ray_layout.model.memory_settings import memory_settings
from tests.helpers.measure_runs import HANDBOOK, HANDBOOK_DESIGN, TRUTH

GUESS = costs_from_flops(HANDBOOK.model, HANDBOOK.parallel)


def relative_errors_of(texts, unit_ms):
    columns = unit_columns(HANDBOOK.model, True)
    rows = [design_rows(HANDBOOK.model, Layout.parse(text, 4), columns) for text in texts]
    stacked = np.concatenate(rows).astype(float)[None]
    return dict(
        zip(
            columns,
            relative_errors(stacked, np.array([unit_ms[c] for c in columns]))[0],
            strict=True,
        )
    )


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
    assert [str(layout) for layout in apart.layouts] == ["Et*5|t*6|t*5|mL", "E|t*16|m|L"]
    assert apart.worst_relative_error == pytest.approx(1.0, abs=0.01)
    beside = relative_errors_of(("Et*4|t*6|t*6|mL", "Et*5|t*9|t*2m|L"), guess.forward_ms)
    assert beside["E"] > 100 and beside["m"] > 2
    kept = profile_design(HANDBOOK.model, HANDBOOK.parallel, 32, guess, hbm_gib=131)
    assert [str(layout) for layout in kept.layouts] == list(HANDBOOK_DESIGN)
    assert kept.worst_relative_error == pytest.approx(1.0, abs=0.01)


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
    assert flags[:4] == [
        "--pipeline-model-parallel-size",
        "4",
        "--pipeline-model-parallel-layout",
        str(kept.layouts[0]),
    ]
    assert "--timing-log-option" in flags and "all" in flags


def test_the_units_to_solve_for() -> None:
    """m and L apart only where some run holds MTP without the loss; no MTP, no m."""
    assert unit_columns(HANDBOOK.model, True) == ("E", "t", "m", "L")
    assert unit_columns(HANDBOOK.model, False) == ("E", "t", PAIR)
    assert unit_columns(replace(HANDBOOK.model, mtp_num_layers=0), False) == ("E", "t", "L")


def test_design_rows_count_each_ranks_units() -> None:
    layout = Layout.parse("Et*3|t*7|t*6m|L", 4)
    apart = design_rows(HANDBOOK.model, layout, unit_columns(HANDBOOK.model, True))
    assert apart.tolist() == [[1, 3, 0, 0], [0, 7, 0, 0], [0, 6, 1, 0], [0, 0, 0, 1]]
    # m+L counts once on a rank that holds either: here m on rank 2 and L on rank 3
    pair = design_rows(HANDBOOK.model, layout, unit_columns(HANDBOOK.model, False))
    assert pair.tolist() == [[1, 3, 0], [0, 7, 0], [0, 6, 1], [0, 0, 1]]


def test_an_interleaved_ranks_row_sums_its_chunks() -> None:
    layout = Layout.parse("Ett|t*2|t*2|t*2|t*2|t*2|t*2|t*2mL", 4)
    assert layout.vpp == 2
    rows = design_rows(HANDBOOK.model, layout, unit_columns(HANDBOOK.model, True))
    assert rows.tolist() == [[1, 4, 0, 0], [0, 4, 0, 0], [0, 4, 0, 0], [0, 4, 1, 1]]


def test_a_timer_spreads_with_its_rank_but_never_below_the_resolution() -> None:
    assert timer_spread(np.array([0.0, 0.004, 2.5])).tolist() == [TIMER_RESOLUTION_MS] * 2 + [2.5]


def test_a_unit_alone_on_a_rank_is_known_to_the_timers_cv() -> None:
    """One unit per rank: each rank's timer is that unit alone, at any cost."""
    errors = relative_errors(np.eye(3)[None], np.array([1.0, 10.0, 40.0]))
    assert errors[0] == pytest.approx([1.0, 1.0, 1.0])


def test_relative_errors_do_not_depend_on_the_costs_scale() -> None:
    columns = unit_columns(HANDBOOK.model, True)
    texts = ("Et*4|t*6|t*6|mL", "E|t*16|m|L")
    rows = [design_rows(HANDBOOK.model, Layout.parse(text, 4), columns) for text in texts]
    stacked = np.concatenate(rows).astype(float)[None]
    cost = np.array([TRUTH.forward_ms[c] for c in columns])
    assert relative_errors(stacked, 3.0 * cost) == pytest.approx(relative_errors(stacked, cost))


def test_more_runs_when_asked_each_fits_and_is_told_how_fast() -> None:
    plan = profile_design(HANDBOOK.model, HANDBOOK.parallel, 32, GUESS, hbm_gib=131, runs=3)
    assert len(plan.layouts) == len(set(plan.layouts)) == 3
    assert len(plan.predicted_ms) == len(plan.peak_memory_gib) == 3
    assert all(gib <= 131 for gib in plan.peak_memory_gib)
    fastest = profile_design(HANDBOOK.model, HANDBOOK.parallel, 32, GUESS, hbm_gib=131, runs=1)
    # one run already identifies E, t and m+L on PP=4; it is the fastest that fits
    assert fastest.layouts == plan.layouts[:1] and fastest.rank == 3
    assert plan.worst_relative_error <= fastest.worst_relative_error


def test_a_memory_too_small_for_any_layout_is_one_line() -> None:
    with pytest.raises(ConfigError, match=r"^no layout on PP=4 fits in 1 GiB for profiling$"):
        profile_design(HANDBOOK.model, HANDBOOK.parallel, 32, GUESS, hbm_gib=1)


def test_the_flags_that_profile_a_layout() -> None:
    plan = profile_design(HANDBOOK.model, HANDBOOK.parallel, 32, GUESS, hbm_gib=131)
    layout = Layout.parse("Et*4|t*6|t*6|mL", 4)
    assert plan.megatron_flags(layout, train_iters=7) == [
        "--pipeline-model-parallel-size",
        "4",
        "--pipeline-model-parallel-layout",
        "Et*4|t*6|t*6|mL",
        "--train-iters",
        "7",
        *PROFILE_FLAGS,
    ]
    flags = dict(zip(PROFILE_FLAGS[::2], PROFILE_FLAGS[1::2], strict=True))
    # per-rank timers of every iteration, and no evaluation blocks between them
    assert flags == {
        "--timing-log-level": "2",
        "--timing-log-option": "all",
        "--log-interval": "1",
        "--eval-iters": "0",
    }


def test_the_greedy_step_s_errors_are_those_of_all_the_rows_stacked():
    """The greedy step stacks the chosen runs' rows as their QR root, and once those are well
    posed sums Gram matrices instead: both give each candidate the errors of all its rows."""
    rng = np.random.default_rng(0)
    candidates = rng.random((50, 8, 4)) * (rng.random((50, 8, 4)) > 0.3)
    roots = np.linalg.qr(candidates, mode="r")
    grams = np.einsum("nru,nrv->nuv", candidates, candidates)
    for chosen in (rng.random((24, 4)), rng.random((2, 4)), np.zeros((8, 4))):
        stacked = np.concatenate([np.broadcast_to(chosen, (50, *chosen.shape)), candidates], 1)
        expected = share_errors(stacked).max(axis=1)
        assert _errors_with(chosen, roots, grams) == pytest.approx(expected, rel=1e-9)


def test_the_most_runs_on_a_large_model_stay_inside_the_bound():
    """DeepSeek-V3 with --runs 64 (the most) took 58 s and 1.3 GB on PP 8, 117 s and 2.3 GB on
    PP 16; every greedy step now costs the same however many runs are chosen."""
    recipe = load_recipe("tests/data/hf/DeepSeek-V3/config.json", Overrides({}, {"pp": 16}))
    guess = costs_from_flops(recipe.model, recipe.parallel)
    started = time.perf_counter()
    tracemalloc.start()
    try:
        plan = profile_design(recipe.model, recipe.parallel, 8, guess, runs=64)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(plan.layouts) == 64 and plan.rank == len(plan.columns)
    assert time.perf_counter() - started < 30 and peak < 512 * 2**20


def test_pp2_with_a_dense_first_layer_profiles_three_layouts_that_identify_every_unit() -> None:
    """On PP 2 every pair of layouts leaves E, the dense layer, the MoE layer and m+L one row
    short (each layout's two rows sum to the same model), so no one added run completes the
    rank: the design adds the run that raises it, then the one that pins the units best."""
    recipe = load_recipe("configs/tiny_moe_mtp.yaml", Overrides({}, {"pp": 2}))
    guess = costs_from_flops(recipe.model, recipe.parallel)
    plan = profile_design(recipe.model, recipe.parallel, 4, guess)
    assert plan.columns == ("E", "t_moe", "t_dense", PAIR)
    assert len(set(plan.layouts)) == 3 and plan.rank == 4
    assert np.isfinite(plan.worst_relative_error)


def test_the_rank_raising_step_agrees_with_stacking_each_candidate():
    """What a candidate adds in the chosen rows' null space is the rank it adds to them."""
    rng = np.random.default_rng(1)
    for _ in range(200):
        n, rows, units = rng.integers(3, 30), rng.integers(1, 4), rng.integers(2, 6)
        designs = rng.integers(0, 3, (n, rows, units)).astype(float)
        chosen = [int(i) for i in rng.choice(n, rng.integers(1, 3), replace=False)]
        fits = rng.random(n) > 0.2
        stacked = designs[chosen].reshape(-1, units)
        rank = np.linalg.matrix_rank(stacked)
        gained = np.array(
            [np.linalg.matrix_rank(np.concatenate([stacked, d])) - rank for d in designs]
        )
        gained[chosen] = 0
        gained[~fits] = 0
        expected = np.flatnonzero((gained == gained.max()) & (gained > 0))
        assert _raising_rank(designs, chosen, fits).tolist() == expected.tolist()


def test_the_design_sizes_its_runs_under_the_jobs_recomputation():
    """The runs carry the job's recompute flags: their memory is smaller and their step longer
    than without, so a limit only the recomputing runs fit is no refusal."""
    full = memory_settings(["--recompute-granularity", "full", "--recompute-method", "uniform",
                            "--recompute-num-layers", "1"])  # fmt: skip
    microbatches = HANDBOOK.parallel.num_microbatches_or_none
    plain = profile_design(HANDBOOK.model, HANDBOOK.parallel, microbatches, GUESS)
    recomputing = profile_design(
        HANDBOOK.model, HANDBOOK.parallel, microbatches, GUESS, settings=full
    )
    assert max(recomputing.peak_memory_gib) < min(plain.peak_memory_gib)
    limit = 30.0  # no layout fits without recomputation (its smallest peak is 37.0 GiB)
    with pytest.raises(ConfigError, match="for profiling"):
        profile_design(HANDBOOK.model, HANDBOOK.parallel, microbatches, GUESS, hbm_gib=limit)
    fitting = profile_design(
        HANDBOOK.model, HANDBOOK.parallel, microbatches, GUESS, hbm_gib=limit, settings=full
    )
    assert fitting.layouts and min(fitting.predicted_ms) > min(plain.predicted_ms)
