"""When each arm is looked at: the configured looks, with an earlier first look for an arm the
simulator predicts to lose by far more than the margin.

The search knows each arm's predicted step and, from the fitted jitter, its spread; from the two
follows how many batches the margin test needs to show a predicted loser worse.  Moving only
the first look, and only earlier, keeps every arm at ``len(config.looks)`` looks of
``alpha / len(looks)`` each, fixed before any step is seen: a wrong prediction costs power (an
arm not shown worse yet continues to its next look), never the chance of stopping an arm that is
not worse.  The predicted gap is trusted only in part: the simulator is a few percent off.

The same arithmetic says how long an arm must run for the arms still to come when the cluster
holds fewer arms than the test has (:func:`covering_iterations`): each is expected to be
decided at some look, and the arm that ran before it must have reached that look.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from scipy import special

from ray_layout.ab.stats import ABConfig

POWER_Z = 2.326  # the look is planned for 99% power (one-sided normal quantile)
TRUSTED_SHARE = 0.5  # of the predicted gap beyond the margin: the simulator errs by a few %
BATCH_SPREAD = 1.5  # batch means of autocorrelated steps spread more than independent ones
MIN_CV = 0.005  # a prediction without jitter is not a promise of none
MIN_MEASURED_CV = 0.001  # a few steady steps that happen to agree are not a promise of none


@dataclass(frozen=True)
class Prediction:
    """What the search predicted of one arm's step."""

    mean_ms: float
    cv: float  # predicted standard deviation of one step over its mean


def batches_to_decide(gap: float, cv: float, config: ABConfig) -> int | None:
    """The fewest batches (at least 2) after which an arm ``gap`` slower than the best (0.2: 20%)
    is shown worse than the margin with 99% power at a look's level; None when the trusted gap
    is within the margin or no look of the budget gets there."""
    return _batches_for(TRUSTED_SHARE * (gap - config.margin), max(cv, MIN_CV), config)


def batches_to_settle(gap: float, cv: float, config: ABConfig) -> int | None:
    """The fewest batches after which two arms whose means differ by ``gap`` (either sign) and
    whose steps spread by ``cv`` are told apart with 99% power at a look's level: one shown
    worse than the margin when the trusted gap lies beyond it, the two shown tied (two
    one-sided tests) when within; None when no look of the budget gets there."""
    return _batches_for(TRUSTED_SHARE * abs(abs(gap) - config.margin), cv, config)


def _batches_for(excess: float, cv: float, config: ABConfig) -> int | None:
    """The fewest batches (at least 2) for a one-sided Welch test on batch means to clear its
    bound by ``excess`` (a share of the mean) with 99% power at a look's level."""
    if not excess > 0:
        return None
    batch_cv = BATCH_SPREAD * cv / math.sqrt(config.batch_size)
    for batches in range(2, config.looks[-1] + 1):
        critical = special.stdtrit(2 * batches - 2, 1.0 - config.alpha_per_look)
        if excess / (batch_cv * math.sqrt(2.0 / batches)) >= critical + POWER_Z:
            return batches
    return None


def first_looks(predictions: Mapping[str, Prediction], config: ABConfig) -> dict[str, int]:
    """Batches at the first look of each arm predicted to be shown worse before the configured
    first look; arms not named keep ``config.looks[0]``."""
    finite = [p.mean_ms for p in predictions.values() if math.isfinite(p.mean_ms) and p.mean_ms > 0]
    if not finite:
        return {}
    best = min(finite)
    early = {}
    for arm, prediction in predictions.items():
        if not (math.isfinite(prediction.mean_ms) and math.isfinite(prediction.cv)):
            continue
        batches = batches_to_decide(prediction.mean_ms / best - 1.0, prediction.cv, config)
        if batches is not None and batches < config.looks[0]:
            early[arm] = batches
    return early


def look_iterations(config: ABConfig, look: int, first_batches: int | None = None) -> int:
    """Steady iterations an arm has at look ``look``: ``first_batches`` moves its first look."""
    if look == 0 and first_batches is not None:
        return config.batch_size * first_batches
    return config.look_iterations(look)


def covering_iterations(
    reference_ms: float,
    measured_cv: float,
    pending: Mapping[str, float],
    config: ABConfig,
    first_looks: Mapping[str, int] | None = None,
) -> int:
    """Steady iterations an arm predicted at ``reference_ms`` must have for each arm yet to run
    (``pending``: its predicted ms) to meet it at the look where that arm is expected to be
    decided against it (:func:`batches_to_settle`; its first look may come early); the budget
    when one is not expected to be decided before it.  The spread is the reference's measured
    step CV (floored at MIN_MEASURED_CV): the arms run the same model on the same cluster, and
    a measured spread is better than the search's.

    When the cluster holds one arm at a time, the arm that runs first has nothing to be compared
    with while it runs: without this it would run its whole budget for arms that will be
    stopped after a few batches."""
    first_looks = first_looks or {}
    needed = 0
    cv = max(measured_cv, MIN_MEASURED_CV)
    for arm, predicted_ms in pending.items():
        looks = [look_iterations(config, k, first_looks.get(arm)) for k in range(len(config.looks))]
        gap = predicted_ms / reference_ms - 1.0 if reference_ms > 0 else math.nan
        batches = batches_to_settle(gap, cv, config) if math.isfinite(gap + cv) else None
        at = looks[-1] if batches is None else batches * config.batch_size
        needed = max(needed, next((n for n in looks if n >= at), looks[-1]))
    return needed
