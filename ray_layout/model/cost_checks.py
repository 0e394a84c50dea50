"""What a COSTS.json's values may be: each field's physical range, outside which a value is
impossible (a ConfigError at load), and what is possible but implausible together (a warning
line each, which the commands print before planning with it).

A COSTS.json is legal and still absurd when a transfer takes longer than the whole model's work,
a step tail lasts hours or a backward is 10,000 times its forward: the planner would plan an
8-day step from it and say nothing.  What no run can do (one transfer longer than Megatron's
distributed timeout) is refused; what a broken fit or a typo most likely did is said.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ray_layout.errors import ConfigError, clipped, one_line, quoted
from ray_layout.model.config_values import Bound, integer
from ray_layout.model.fields import MAX_DIMENSION, MAX_PARALLEL_SIZE
from ray_layout.model.sizing import DECODER_UNITS, EMBEDDING, LOSS, MTP

UNITS = (EMBEDDING, *DECODER_UNITS, MTP, LOSS)
COUNTS = {  # the largest each run-shape count may be
    "micro_batch_size": MAX_PARALLEL_SIZE,
    "seq_length": MAX_DIMENSION,
    "tp": MAX_PARALLEL_SIZE,
    "ep": MAX_PARALLEL_SIZE,
    "cp": MAX_PARALLEL_SIZE,
    "vocab_size": MAX_DIMENSION,
    "gpus_per_node": MAX_PARALLEL_SIZE,
}
TEXTS = frozenset({"source", "model", "format"})
UNIT_MAPS = frozenset({"forward_ms", "backward_ms", "jitter_cv", "memory_calibration"})

# A nanosecond is shorter than any GPU operation; 10^7 ms (about 3 hours) longer than any step.
TIME = Bound(1e-6, 1e7, " ms", zero=True, why=" (1 ns)")
# Megatron's --distributed-timeout-minutes default: NCCL ends a job whose one transfer waits longer.
DISTRIBUTED_TIMEOUT_MS = 600_000.0
TRANSFER = Bound(
    TIME.low,
    DISTRIBUTED_TIMEOUT_MS,
    TIME.unit,
    zero=True,
    why=TIME.why,
    high_why=" (Megatron's default distributed timeout, 10 minutes, ends a job whose one "
    "transfer takes longer)",
)
BOUNDS = {
    **dict.fromkeys(
        (
            "forward_ms",
            "backward_ms",
            "grad_sync_ms_per_gparam",
            "optimizer_ms_per_gparam",
            "tail_fixed_ms",
        ),
        TIME,
    ),
    **dict.fromkeys(("p2p_intra_node_ms", "p2p_inter_node_ms", "a2a_ms"), TRANSFER),
    "jitter_cv": Bound(0.0, 1.0),  # a spread as large as the time itself
    "memory_calibration": Bound(0.05, 20.0),  # the range the fit clips its factors to
    "memory_overhead_gib": Bound(0.0, 1024.0, " GiB"),
    "mtp_standalone_factor": Bound(0.5, 4.0),  # the seed study measured 1.12
}
TIMES = tuple(name for name, bound in BOUNDS.items() if bound.unit == TIME.unit)


def field_value(key: str, value: Any, source: str) -> Any:
    """One top-level value, checked for its kind and its physical range (a text kept
    printable: the model's name is shown to the user)."""
    if key in COUNTS:
        return integer(value, key, source, low=1, high=COUNTS[key])
    if key in TEXTS:
        if not isinstance(value, str) or not value:
            raise ConfigError(f"{source}: {key} must be a non-empty string, got {quoted(value)}")
        return one_line(value)
    if key in UNIT_MAPS:
        if not isinstance(value, dict):
            raise ConfigError(
                f"{source}: {key} must be an object of unit name to number, got {quoted(value)}"
            )
        unknown = sorted(map(str, set(value) - set(UNITS)))
        if unknown:
            raise ConfigError(
                f"{source}: {key} has unknown unit(s) {clipped(', '.join(unknown))}; "
                f"units are {', '.join(UNITS)}"
            )
        return {u: BOUNDS[key].check(v, f"{key}.{u}", source) for u, v in value.items()}
    return BOUNDS[key].check(value, key, source)


# What real runs stay within, with a wide margin: outside it a value is possible but most likely a
# typo or a broken fit, and the plan is said to rest on it.
BACKWARD_RATIO_RANGE = (0.5, 10.0)  # a layer's backward over its forward: 2x its GEMMs, up to 3-4x
# with recompute; not the embedding's, whose backward writes the whole table's gradient.
TRANSFER_OVER_LAYER = 100.0  # one transfer over one decoder layer's forward
MINUTE_MS = 60_000.0  # a unit's forward or backward of one micro-batch, a step tail, per gparam


def implausible(values: Mapping[str, Any]) -> tuple[str, ...]:
    """One line for each thing checked costs (``values``: their fields by name) hold that no real
    run does, each naming the field, its value and what real runs measure."""
    forward, backward = values["forward_ms"], values["backward_ms"]
    found = []
    low, high = BACKWARD_RATIO_RANGE
    for unit in sorted(set(forward) - {EMBEDDING}):
        ratio = backward[unit] / forward[unit] if forward[unit] else None
        if ratio is not None and not low <= ratio <= high:
            times = f"{ratio:,.0f}" if ratio >= 100 else f"{ratio:.2g}"
            found.append(
                f"backward_ms.{unit} is {times}x forward_ms.{unit} ({backward[unit]:,.6g} "
                f"against {forward[unit]:,.6g} ms), where a layer's backward takes "
                f"{low:g}-{high:g}x its forward"
            )
    slow = {
        f"{name}.{unit}": ms
        for name, times in (("forward_ms", forward), ("backward_ms", backward))
        for unit, ms in times.items()
        if ms > MINUTE_MS
    }
    found += [
        f"{name} is {ms:,.6g} ms, over a minute for one micro-batch" for name, ms in slow.items()
    ]
    layer = max((forward[u] for u in DECODER_UNITS if u in forward), default=0.0)
    for name in ("p2p_intra_node_ms", "p2p_inter_node_ms", "a2a_ms"):
        ms = values.get(name, 0.0)
        if layer and ms > TRANSFER_OVER_LAYER * layer:
            found.append(
                f"{name} is {ms:,.6g} ms, {ms / layer:,.0f}x a decoder layer's forward "
                f"({layer:,.6g} ms), where a real transfer takes a fraction of one"
            )
    per_gparam = values["grad_sync_ms_per_gparam"] + values["optimizer_ms_per_gparam"]
    if per_gparam > MINUTE_MS:
        found.append(
            f"grad_sync_ms_per_gparam + optimizer_ms_per_gparam is {per_gparam:,.6g} ms, a step "
            "tail of over a minute per billion parameters"
        )
    if values.get("tail_fixed_ms", 0.0) > MINUTE_MS:
        found.append(
            f"tail_fixed_ms is {values['tail_fixed_ms']:,.6g} ms, over a minute of every step"
        )
    return tuple(found)
