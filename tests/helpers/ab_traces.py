"""Synthetic A/B step series (AR(1) noise around given means) and the traces built from them."""

from __future__ import annotations

import math

import numpy as np

from ray_layout.ab.stats import ArmTrace


def ar1_steps(rng, reps, arms, n, means, cv=0.03, phi=0.3):
    """(reps, arms, n) step times: AR(1) noise with stationary sd ``cv * mean``."""
    means = np.broadcast_to(np.asarray(means, dtype=float), (arms,))[None, :, None]
    shocks = rng.standard_normal((reps, arms, n))
    noise = np.empty_like(shocks)
    noise[..., 0] = shocks[..., 0]
    for i in range(1, n):
        noise[..., i] = phi * noise[..., i - 1] + math.sqrt(1 - phi**2) * shocks[..., i]
    return means * (1.0 + cv * noise)


def traces_of(steps, names=None, **fields):
    names = names or [f"arm-{i}" for i in range(len(steps))]
    return [ArmTrace(name, f"layout-{name}", tuple(map(float, row)), **fields)
            for name, row in zip(names, steps, strict=True)]  # fmt: skip
