"""Small cost models with round numbers, for tests of the evaluator, planner and exact search."""

from __future__ import annotations

import numpy as np

from search.cost_model import CostModel, in_flight_at_peak

GIB = 2**30
UNITS = ("E", "t", "m", "L")


def toy_cost_model(
    pp: int,
    vpp: int = 1,
    microbatches: int = 8,
    layers: int = 16,
    forward=(1.0, 10.0, 14.0, 38.0),
    jitter: float = 0.0,
    p2p: float = 0.4,
    tail_ms_per_gparam: float = 5.0,
) -> CostModel:
    """The handbook's shape with hand-chosen unit costs (m = 1.4 t, L = 3.8 t)."""
    forward = np.array(forward, dtype=float)
    return CostModel(
        units=UNITS,
        moe_pattern=(True,) * layers,
        forward_ms=forward,
        backward_ms=2 * forward,
        jitter_cv=np.full(len(UNITS), jitter),
        static_bytes=np.array([3.0, 3.5, 3.6, 3.0]) * GIB,
        activation_bytes=np.array([0.1, 0.5, 0.6, 0.3]) * GIB,
        tail_params=np.array([0.13, 0.2, 0.21, 0.13]),
        p2p_ms=np.full(pp, p2p),
        tail_ms_per_gparam=tail_ms_per_gparam,
        logits_bytes=4 * GIB,
        standalone_copy_bytes=3 * GIB,
        standalone_copy_params=0.13,
        overhead_bytes=3 * GIB,
        mtp_standalone_factor=1.12,
        in_flight=in_flight_at_peak(pp, vpp, microbatches),
    )
