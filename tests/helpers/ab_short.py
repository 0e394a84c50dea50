"""A short A/B config whose looks can be checked by hand, and steady step series for it."""

from __future__ import annotations

import numpy as np

from ray_layout.ab.stats import ABConfig, ArmTrace

CONFIG = ABConfig(warmup_iterations=3, batch_size=5, looks=(2, 4, 8))  # short looks, hand-checkable
BEST = "Et*5|t*6|t*5|mL"


def by_arm(decisions):
    return {d.arm: d for d in decisions}


def steady(n, mean=100.0, seed=0, cv=0.01):
    """``CONFIG.warmup_iterations + n`` step times around ``mean``, spread ``cv``."""
    rng = np.random.default_rng(seed)
    steps = mean * (1 + cv * rng.standard_normal(CONFIG.warmup_iterations + n))
    return tuple(float(x) for x in steps)


def tie_traces(best_headroom, other_headroom, ratio=1.003, cv=0.002):
    return [
        ArmTrace("best", BEST, steady(20, 100.0, seed=1, cv=cv), headroom_gib=best_headroom),
        ArmTrace(
            "other", "x", steady(20, 100.0 * ratio, seed=2, cv=cv), headroom_gib=other_headroom
        ),
    ]
