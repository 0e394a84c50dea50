"""The A/B statistics: the config, batch means and their interval, the margin test, failure
reasons and blow-ups, and the equivalence test (TOST) that settles ties."""

from __future__ import annotations

import math
import warnings
from dataclasses import replace

import numpy as np
import pytest
from scipy import stats

from ray_layout.ab.decisions import decide_look
from ray_layout.ab.stats import (
    FAILURE_REASONS,
    ABConfig,
    ArmTrace,
    arm_stats,
    batch_means,
    blowup_reason,
    failure_reason,
    steady_steps,
    tied_within_margin,
    worse_by_margin,
)
from ray_layout.errors import ConfigError
from ray_layout.runtime.failures import FailureClass, run_status
from tests.helpers.ab_short import BEST, CONFIG, by_arm, steady

# --- config ------------------------------------------------------------------------------------


def test_config_derived_quantities():
    config = ABConfig(warmup_iterations=3, batch_size=5, looks=(2, 4, 8), alpha=0.06)
    assert config.max_iterations == 3 + 40
    assert [config.look_iterations(k) for k in range(3)] == [10, 20, 40]
    assert config.alpha_per_look == pytest.approx(0.02)
    assert ABConfig(looks=[3, 6]).looks == (3, 6)  # a list is kept as a tuple


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"warmup_iterations": -1}, "^--ab-warmup must be >= 0, got -1$"),  # the flag's words
        ({"warmup_iterations": 1.5}, "warmup_iterations"),
        ({"batch_size": 0}, "^--ab-batch must be >= 1, got 0$"),
        ({"batch_size": 2.5}, "batch_size"),
        ({"looks": (2, 2_000_000)}, "^--ab-looks must be <= 1,000,000"),
        ({"looks": ()}, "looks"),
        ({"looks": (1, 4)}, "at least 2 batches"),
        ({"looks": (2, 2, 8)}, "strictly increasing"),
        ({"looks": (4, 2)}, "strictly increasing"),
        ({"alpha": 0.0}, "alpha"),
        ({"alpha": 1.0}, "alpha"),
        ({"margin": -0.01}, "margin"),
        ({"margin": math.inf}, "margin"),
        ({"blowup": 1.0}, "blowup"),
        ({"batch_size": 100_000, "looks": (3, 20)}, "iterations per arm, more than 1,000,000"),
    ],
)
def test_config_errors_name_the_problem(fields, message):
    with pytest.raises(ConfigError, match=message):
        ABConfig(**fields)


def test_look_index_out_of_range_is_a_config_error():
    with pytest.raises(ConfigError, match="look"):
        CONFIG.look_iterations(3)
    with pytest.raises(ConfigError, match="unique"):
        decide_look([ArmTrace("a", "x", ()), ArmTrace("a", "y", ())], 0, CONFIG)


# --- one arm -----------------------------------------------------------------------------------


def test_steady_steps_and_batch_means_by_hand():
    trace = ArmTrace("a", BEST, (50.0, 40.0, 30.0, *range(1, 13)))
    steady = steady_steps(trace, CONFIG)
    assert steady.tolist() == list(range(1, 13))
    np.testing.assert_allclose(batch_means(steady, 5), [3.0, 8.0])  # 11, 12 dropped
    assert batch_means(steady[:4], 5).size == 0


def test_arm_stats_by_hand():
    values = np.array([10, 12, 11, 13, 9, 20, 22, 21, 23, 19, 14, 16, 15, 17, 13, 99.0])
    result = arm_stats(values, CONFIG)  # batches of 5: means 11, 21, 15; the 99 is dropped
    assert (result.n, result.batches) == (15, 3)
    assert result.mean_ms == pytest.approx(47 / 3)
    assert result.median_ms == 15.0
    sd = math.sqrt(((11 - 47 / 3) ** 2 + (21 - 47 / 3) ** 2 + (15 - 47 / 3) ** 2) / 2)
    half = stats.t.ppf(0.975, 2) * sd / math.sqrt(3)
    assert result.ci_low_ms == pytest.approx(47 / 3 - half)
    assert result.ci_high_ms == pytest.approx(47 / 3 + half)
    one_batch = arm_stats(values[:7], CONFIG)
    assert one_batch.batches == 1 and math.isnan(one_batch.ci_low_ms)


def test_batch_means_interval_covers_the_true_mean_at_its_level():
    rng = np.random.default_rng(7)
    steps = 100.0 + 3.0 * rng.standard_normal((2000, 40))
    covered = [
        (s.ci_low_ms <= 100.0 <= s.ci_high_ms) for s in (arm_stats(r, CONFIG) for r in steps)
    ]
    assert np.mean(covered) == pytest.approx(0.95, abs=0.015)  # 3 binomial sd


# --- the margin test ---------------------------------------------------------------------------


def test_worse_by_margin_matches_welch_by_hand_and_scipy():
    rng = np.random.default_rng(3)
    arm, best = 108 + 4 * rng.standard_normal(30), 100 + 2 * rng.standard_normal(40)
    config = ABConfig(margin=0.02)
    t, p = worse_by_margin(arm, best, config)

    a, b = batch_means(arm, 5), 1.02 * batch_means(best, 5)
    va, vb = a.var(ddof=1) / a.size, b.var(ddof=1) / b.size
    hand_t = (a.mean() - b.mean()) / math.sqrt(va + vb)
    dof = (va + vb) ** 2 / (va**2 / (a.size - 1) + vb**2 / (b.size - 1))
    assert t == pytest.approx(hand_t)
    assert p == pytest.approx(stats.t.sf(hand_t, dof))
    oracle = stats.ttest_ind(a, b, equal_var=False, alternative="greater")
    assert (t, p) == pytest.approx((oracle.statistic, oracle.pvalue))


@pytest.mark.parametrize(
    ("arm", "best", "margin", "expected"),
    [
        (110.0, 100.0, 0.02, (math.inf, 0.0)),
        (101.0, 100.0, 0.02, (-math.inf, 1.0)),
        (0.1, 0.1, 0.0, (0.0, 0.5)),  # an ulp off in np.mean must not fake a difference
        (102.0, 100.0, 0.02, (0.0, 0.5)),
    ],
)
def test_worse_by_margin_on_deterministic_data(arm, best, margin, expected):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = worse_by_margin(np.full(10, arm), np.full(10, best), ABConfig(margin=margin))
    assert result == expected


def test_worse_by_margin_one_constant_side_and_too_few_batches():
    arm = np.array([110, 112, 111, 113, 109, 120, 118, 119, 121, 117.0])
    t, p = worse_by_margin(arm, np.full(10, 100.0), CONFIG)
    diff = batch_means(arm, 5).mean() - 102.0
    se = batch_means(arm, 5).std(ddof=1) / math.sqrt(2)
    assert t == pytest.approx(diff / se)
    assert p == pytest.approx(stats.t.sf(diff / se, 1))  # all dof from the varying side
    assert all(map(math.isnan, worse_by_margin(arm[:9], arm, CONFIG)))
    assert all(map(math.isnan, worse_by_margin(np.append(arm[:9], np.nan), arm, CONFIG)))


# --- immediate stops ---------------------------------------------------------------------------


def test_every_failure_class_but_the_runtimes_own_has_a_reason():
    """Keyed by the enum, the reasons still answer the plain strings a store gives back."""
    own = {FailureClass.EARLY_STOP, FailureClass.CANCELLED}  # stops and cancels, not failures
    assert set(FAILURE_REASONS) == set(FailureClass) - own
    for name in FAILURE_REASONS:
        plain = ArmTrace("a", BEST, steady(2), failure=str(name.value))
        assert (
            failure_reason(plain)
            == FAILURE_REASONS[name]
            == failure_reason(replace(plain, failure=name))
        )
    assert failure_reason(replace(plain, failure="failed")) == "failed"  # a status, unknown
    assert run_status(FailureClass.OOM) == run_status("oom") == "infeasible"
    assert run_status(FailureClass.EARLY_STOP) == "stopped" and run_status(None) == "finished"


def test_nan_or_inf_steady_step_is_a_failure_but_not_in_warmup():
    steps = list(steady(12))
    assert failure_reason(ArmTrace("a", BEST, tuple(steps))) is None
    steps[1] = math.nan  # warm-up
    assert failure_reason(ArmTrace("a", BEST, tuple(steps)), CONFIG) is None
    steps[8] = math.inf
    reason = failure_reason(ArmTrace("a", BEST, tuple(steps)), CONFIG)
    assert reason is not None and "NaN" in reason and "iteration 6" in reason
    decisions = decide_look(
        [
            ArmTrace("a", BEST, tuple(steps)),
            ArmTrace("b", "x", steady(10)),
            ArmTrace("c", "y", steady(10, seed=2)),
        ],
        0,
        CONFIG,
    )
    assert by_arm(decisions)["a"].action == "stop"


def test_blowup_reason():
    values = np.full(5, 350.0)
    reason = blowup_reason(values, 100.0, CONFIG)
    assert reason is not None and "3.5x" in reason
    assert blowup_reason(np.full(5, 250.0), 100.0, CONFIG) is None
    assert blowup_reason(np.full(4, 350.0), 100.0, CONFIG) is None  # less than a batch
    assert blowup_reason(np.array([100, 100, 100, 1000, 1000.0]), 100.0, CONFIG) is None


# --- equivalence (TOST) ------------------------------------------------------------------------


def tost_by_hand(arm, best, config):
    """TOST on batch means with scipy's t: (t nearer its bound, larger one-sided p)."""
    a = batch_means(np.asarray(arm), config.batch_size)
    b = batch_means(np.asarray(best), config.batch_size)

    def welch(scale):
        va, vb = a.var(ddof=1) / a.size, scale**2 * b.var(ddof=1) / b.size
        dof = (va + vb) ** 2 / (va**2 / (a.size - 1) + vb**2 / (b.size - 1))
        return (a.mean() - scale * b.mean()) / math.sqrt(va + vb), dof

    t_low, dof_low = welch(1 - config.margin)
    t_high, dof_high = welch(1 + config.margin)
    p_low, p_high = stats.t.sf(t_low, dof_low), stats.t.cdf(t_high, dof_high)
    return (t_low, p_low) if p_low >= p_high else (-t_high, p_high)


@pytest.mark.parametrize(
    ("ratio", "cv", "tied"),
    [
        (1.005, 0.002, True),
        (1.015, 0.05, False),
        (1.05, 0.002, False),
        (0.95, 0.002, False),
        (0.995, 0.002, True),
    ],
)
def test_tied_within_margin_matches_a_tost_by_hand(ratio, cv, tied):
    best = np.asarray(steady(40, 100.0, seed=1, cv=cv)[CONFIG.warmup_iterations :])
    arm = np.asarray(steady(40, 100.0 * ratio, seed=2, cv=cv)[CONFIG.warmup_iterations :])
    statistic, p_value = tied_within_margin(arm, best, CONFIG)
    expected_t, expected_p = tost_by_hand(arm, best, CONFIG)
    assert statistic == pytest.approx(expected_t, rel=1e-9)
    # abtest takes the upper p as 1 - sf: exact to about 1e-16 absolute, not relative
    assert p_value == pytest.approx(expected_p, rel=1e-9, abs=1e-15)
    if tied:
        assert p_value < 1e-6 and statistic > 0
    else:
        assert p_value > 0.2


def test_tied_within_margin_is_symmetric_enough_and_needs_two_batches():
    a = np.asarray(steady(40, 100.0, seed=3, cv=0.002)[CONFIG.warmup_iterations :])
    b = np.asarray(steady(40, 100.4, seed=4, cv=0.002)[CONFIG.warmup_iterations :])
    assert tied_within_margin(a, b, CONFIG)[1] < 1e-6
    assert tied_within_margin(b, a, CONFIG)[1] < 1e-6  # either way round
    far = a * 1.06
    assert (
        tied_within_margin(far, a, CONFIG)[1] > 0.5 and tied_within_margin(a, far, CONFIG)[1] > 0.5
    )
    # identical data is tied (any positive margin), never with margin 0
    assert tied_within_margin(a, a, CONFIG)[1] < 1e-6
    assert tied_within_margin(a, a, replace(CONFIG, margin=0.0))[1] >= 0.5
    short = a[: CONFIG.batch_size * 2 - 1]
    assert all(math.isnan(x) for x in tied_within_margin(short, a, CONFIG))
    constant = np.full(10, 100.0)
    assert tied_within_margin(constant, constant, CONFIG) == (math.inf, 0.0)
