"""When each arm is looked at: batches to decide a predicted loser or to settle a pair, the
earlier first looks of predicted losers, and how far a lone arm must run for the arms to come."""

from __future__ import annotations

import math

from scipy import special

from ray_layout.ab.looks import (
    MIN_CV,
    MIN_MEASURED_CV,
    POWER_Z,
    TRUSTED_SHARE,
    Prediction,
    batches_to_decide,
    batches_to_settle,
    covering_iterations,
    first_looks,
    look_iterations,
)
from ray_layout.ab.stats import ABConfig

DEFAULT = ABConfig()


def test_batches_to_decide_by_hand():
    config = DEFAULT
    assert batches_to_decide(0.02, 0.01, config) is None  # within the margin
    assert batches_to_decide(0.03, 0.01, config) is None  # trusted excess 0.5%: not in budget
    gap, cv = 0.10, 0.01
    batches = batches_to_decide(gap, cv, config)
    excess = TRUSTED_SHARE * (gap - config.margin)
    batch_cv = 1.5 * cv / math.sqrt(config.batch_size)

    def power_t(n):
        return excess / (batch_cv * math.sqrt(2 / n))

    def needed(n):
        return special.stdtrit(2 * n - 2, 1 - config.alpha_per_look) + POWER_Z

    assert power_t(batches) >= needed(batches) and power_t(batches - 1) < needed(batches - 1)
    assert batches_to_decide(0.4, 0.01, config) == 2  # the least a variance needs
    assert batches_to_decide(0.4, 0.0, config) == 2  # no predicted jitter: a floor, not zero
    gaps = [batches_to_decide(g, 0.02, config) or math.inf for g in (0.05, 0.1, 0.2, 0.4)]
    assert gaps == sorted(gaps, reverse=True)  # further behind: sooner decided


def test_batches_to_settle_ties_within_the_margin_and_losses_beyond_it_either_way():
    config = DEFAULT
    # beyond the margin the count is the margin test's, whichever arm is the slower
    for gap in (0.05, 0.1, 0.3):
        assert batches_to_settle(gap, 0.01, config) == batches_to_decide(gap, 0.01, config)
        assert batches_to_settle(-gap, 0.01, config) == batches_to_settle(gap, 0.01, config)
    # within it, the tie needs its room to the nearer bound: less room, more batches
    ties = [batches_to_settle(g, 0.005, config) or math.inf for g in (0.0, 0.005, 0.01, 0.015)]
    assert ties == sorted(ties) and ties[0] < ties[-1]
    assert batches_to_settle(0.0, 0.005, config) == batches_to_decide(0.04, MIN_CV, config)
    assert batches_to_settle(config.margin, 0.005, config) is None  # on the bound: never
    assert batches_to_settle(0.0, 0.05, config) is None  # too noisy for the budget


def test_covering_iterations_reach_each_pending_arms_expected_decision_look():
    config = DEFAULT  # looks at 15, 30, 60 and 120 steady steps
    pending = {"close": 100.4, "loser": 140.0}
    # at 0.4% spread the close arm is settled as a tie after 6 batches: look 1
    assert batches_to_settle(0.004, 0.004, config) == 6
    assert covering_iterations(100.0, 0.004, pending, config) == 30
    # the loser alone is decided at its first look, moved earlier where predicted so
    assert covering_iterations(100.0, 0.004, {"loser": 140.0}, config) == 15
    assert covering_iterations(100.0, 0.004, {"loser": 140.0}, config, {"loser": 2}) == 10
    # less spread, less to run; more spread, more; not expected to be decided: the budget
    assert covering_iterations(100.0, 0.002, pending, config) == 15
    assert covering_iterations(100.0, 0.006, pending, config) == 60
    assert covering_iterations(100.0, 0.01, pending, config) == 120
    assert covering_iterations(100.0, 0.002, {"edge": 101.9}, config) == 120
    assert covering_iterations(100.0, 0.002, {}, config) == 0
    # a spread measured as nothing is floored, not trusted
    floor = covering_iterations(100.0, MIN_MEASURED_CV, pending, config)
    assert covering_iterations(100.0, 0.0, pending, config) == floor


def test_first_looks_name_only_predicted_losers_and_only_earlier():
    means = {
        "pick": 100.0,
        "close": 101.0,
        "near": 104.0,
        "default": 140.0,
        "count-based": 117.0,
        "broken": math.nan,
    }
    predictions = {arm: Prediction(mean, 0.01) for arm, mean in means.items()}
    assert first_looks(predictions, DEFAULT) == {"default": 2, "count-based": 2}
    assert first_looks(predictions, ABConfig(looks=(2, 4))) == {}  # nothing earlier than 2
    assert (
        first_looks({}, DEFAULT) == {} and first_looks({"a": Prediction(0.0, 0.0)}, DEFAULT) == {}
    )
    assert look_iterations(DEFAULT, 0, 2) == 10 and look_iterations(DEFAULT, 0) == 15
    assert look_iterations(DEFAULT, 1, 2) == 30


def test_an_arm_without_a_finite_prediction_keeps_its_looks_and_gets_the_budget():
    """A prediction that says nothing moves no look, and a reference or spread that is unknown
    asks for the whole budget rather than a guess."""
    predictions = {
        "pick": Prediction(100.0, 0.01),
        "unknown spread": Prediction(200.0, math.nan),
        "unknown mean": Prediction(math.inf, 0.01),
        "far": Prediction(200.0, 0.01),
    }
    assert first_looks(predictions, DEFAULT) == {"far": 2}
    budget = DEFAULT.look_iterations(len(DEFAULT.looks) - 1)
    assert covering_iterations(0.0, 0.004, {"loser": 140.0}, DEFAULT) == budget
    assert covering_iterations(100.0, math.nan, {"loser": 140.0}, DEFAULT) == budget
