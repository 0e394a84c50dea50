"""UnitCosts: what each layout unit costs on one cluster, as the planner reads it (COSTS.json).

Times are per micro-batch on one GPU of a stage, under the micro-batch size, sequence length, TP
and EP recorded with them: a fit of measured timers writes ``source="fit"``,
:func:`costs_from_flops` a FLOP-based guess, a person ``"manual"``.  ``docs/costs.md`` describes
the format field by field; loading rejects anything else with a one-line :class:`ConfigError`.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields, replace
from itertools import count
from pathlib import Path
from types import MappingProxyType
from typing import Any

from ray_layout.errors import ConfigError, MeasurementError, clipped, quoted
from ray_layout.model.cost_checks import (
    BOUNDS,
    TIME,
    TIMES,
    UNIT_MAPS,
    field_value,
    implausible,
)
from ray_layout.model.fields import ModelSpec
from ray_layout.model.files import read_mapping
from ray_layout.model.memory_settings import PLAIN, MemorySettings
from ray_layout.model.recompute_cost import recompute_shares, stage_recompute_ms
from ray_layout.model.sizing import (
    DECODER,
    DENSE_DECODER,
    EMBEDDING,
    GRAD_BYTES,
    LOSS,
    MOE_DECODER,
    OPTIMIZER_BYTES,
    WEIGHT_BYTES,
    StageSize,
    decoder_unit,
    layer_units,
    unit_sizes,
)
from ray_layout.model.spec import ParallelConfig
from ray_layout.model.traffic import HBM_GB_PER_S, a2a_ms, embedding_ms

FORMAT = "ray_layout.costs/1"
SOURCES = ("fit", "flops", "manual")

# Bytes Adam moves per parameter it updates: reads the fp32 gradient and its 12 bytes of state,
# writes the state back and the bf16 weight.
ADAM_BYTES_MOVED = GRAD_BYTES + 2 * OPTIMIZER_BYTES + WEIGHT_BYTES

FLOPS_TFLOPS = 400.0  # achieved bf16 TFLOP/s per GPU assumed when costs come from FLOPs
# what a GPU can achieve: below 1 TFLOP/s no accelerator, above 20,000 none yet (B200 FP4 is 9,000)
TFLOPS_RANGE = (1.0, 20_000.0)

# Backward over forward of FLOP-derived units.  A decoder layer's backward runs two GEMMs per
# forward GEMM (input and weight gradients).  The output layer + loss measured 1.16-1.30x its
# forward in the seed study: its forward also computes the fp32 softmax over the vocabulary,
# whose gradient backward gets nearly for free.  The MTP layer is a decoder layer first: 2x.
BACKWARD_RATIO = 2.0
LOSS_BACKWARD_RATIO = 1.23


@dataclass(frozen=True)
class UnitCosts:
    """Per-unit forward/backward milliseconds per micro-batch, communication, step tail, noise
    and memory calibration, with the run shape they were measured or derived under.

    The step tail of a PP rank is ``(grad_sync_ms_per_gparam + optimizer_ms_per_gparam) x`` the
    billions of parameters one GPU of that rank holds, plus ``tail_fixed_ms`` (see
    :func:`step_tail_ms`).  Units missing
    from ``jitter_cv`` have no jitter; units missing from ``memory_calibration`` have factor 1.
    """

    forward_ms: Mapping[str, float]
    backward_ms: Mapping[str, float]
    p2p_intra_node_ms: float  # one activation transfer between adjacent stages on one node
    p2p_inter_node_ms: float  # the same across nodes
    grad_sync_ms_per_gparam: float
    optimizer_ms_per_gparam: float
    source: str
    model: str
    micro_batch_size: int
    seq_length: int
    tp: int
    ep: int
    cp: int | None = None  # None: not recorded (costs written before it was)
    vocab_size: int | None = None  # the tokenizer's, before padding
    gpus_per_node: int = 8
    jitter_cv: Mapping[str, float] = field(default_factory=dict)
    memory_calibration: Mapping[str, float] = field(default_factory=dict)
    memory_overhead_gib: float = 3.0  # CUDA context, NCCL and allocator slack, per GPU
    mtp_standalone_factor: float = 1.12  # the seed study: MTP-standalone layouts ran 12% slower
    # Per step on every PP rank, whatever it holds: optimizer and grad-norm kernel launches,
    # logging, the iteration's bookkeeping.  0 in costs written before it was.
    tail_fixed_ms: float = 0.0
    # One EP dispatch or combine all-to-all of a MoE layer per micro-batch; a MoE layer's
    # forward and backward each include two.  0: EP 1, or costs written before it was.
    a2a_ms: float = 0.0
    format: str = FORMAT

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, Mapping):
                object.__setattr__(self, f.name, MappingProxyType(dict(value)))


def within_bounds(costs: UnitCosts) -> tuple[UnitCosts, tuple[str, ...]]:
    """A fit's costs moved into the ranges :func:`load_costs` accepts, so what ``fit -o``
    writes always loads: a time under a nanosecond is none, a spread past the time is clipped
    (said in a warning); what no move can mend (a transfer longer than the distributed timeout)
    is a MeasurementError, as the runs' timers cannot be right."""

    def time(value: float) -> float:
        return 0.0 if 0 < value < TIME.low else value

    high = BOUNDS["jitter_cv"].high
    clipped_units = sorted(unit for unit, cv in costs.jitter_cv.items() if cv > high)
    moved = replace(
        costs,
        **{name: time(getattr(costs, name)) for name in TIMES if name not in UNIT_MAPS},
        forward_ms={unit: time(ms) for unit, ms in costs.forward_ms.items()},
        backward_ms={unit: time(ms) for unit, ms in costs.backward_ms.items()},
        jitter_cv={unit: min(cv, high) for unit, cv in costs.jitter_cv.items()},
    )
    try:
        costs_from_dict(costs_to_dict(moved), source="the fitted costs")
    except ConfigError as exc:
        raise MeasurementError(f"{exc}: the runs' timers cannot give that") from None
    warnings = (
        (
            f"jitter of {', '.join(clipped_units)} clipped to {high:g} (a spread past the time "
            "itself: too few or too noisy intervals)",
        )
        if clipped_units
        else ()
    )
    return moved, warnings


_REQUIRED = tuple(
    f.name for f in fields(UnitCosts) if f.default is MISSING and f.default_factory is MISSING
)


def costs_from_dict(raw: Mapping[str, Any], *, source: str) -> UnitCosts:
    """Check a parsed COSTS.json mapping key by key and build the costs it describes."""
    if raw.get("format") != FORMAT:  # first: another version may have other keys
        found = quoted(raw["format"]) if "format" in raw else "none"
        raise ConfigError(f"{source}: format must be {quoted(FORMAT)}, got {found}")
    unknown = sorted(map(str, set(raw) - {f.name for f in fields(UnitCosts)}))
    if unknown:
        raise ConfigError(f"{source}: unknown key(s) {clipped(', '.join(unknown))}")
    for key in _REQUIRED:
        if key not in raw:
            raise ConfigError(f"{source}: missing required key {key}")
    values = {key: field_value(key, value, source) for key, value in raw.items()}
    if values["source"] not in SOURCES:
        raise ConfigError(
            f"{source}: source must be one of {', '.join(SOURCES)}, got {quoted(values['source'])}"
        )
    forward, backward = values["forward_ms"], values["backward_ms"]
    decoder = {DECODER} if DECODER in forward else {DENSE_DECODER, MOE_DECODER}
    missing = sorted(({EMBEDDING, LOSS} | decoder) - set(forward))
    if missing:
        raise ConfigError(
            f"{source}: forward_ms lacks unit(s) {', '.join(missing)} "
            f"(every model needs E, L and t, or t_dense and t_moe)"
        )
    if set(backward) != set(forward):
        raise ConfigError(
            f"{source}: backward_ms must list the units of forward_ms "
            f"({', '.join(sorted(forward))}), got {', '.join(sorted(backward)) or 'none'}"
        )
    return UnitCosts(**values)


def load_costs(path: str | Path) -> UnitCosts:
    """Read a COSTS.json file."""
    path = Path(path)
    return costs_from_dict(read_mapping(path, str(path)), source=str(path))


def costs_warnings(costs: UnitCosts) -> tuple[str, ...]:
    """What ``costs`` hold that no real run does (:func:`cost_checks.implausible`), one line
    each, for a command to print before it plans with them."""
    return implausible(costs_to_dict(costs))


def costs_to_dict(costs: UnitCosts) -> dict[str, Any]:
    """The JSON mapping of ``costs``, format first; provenance not recorded is left out."""
    values = {
        f.name: dict(v) if isinstance(v := getattr(costs, f.name), Mapping) else v
        for f in fields(costs)
        if getattr(costs, f.name) is not None
    }
    return {"format": values.pop("format"), **values}


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def save_costs(costs: UnitCosts, path: str | Path) -> None:
    """Write ``costs`` as JSON; a reader sees the old file or the new one, never half of one."""
    path = Path(path)
    try:
        handle, temporary = tempfile.mkstemp(
            dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"
        )
        try:
            with os.fdopen(handle, "w") as out:
                json.dump(costs_to_dict(costs), out, indent=2)
                out.write("\n")
            os.chmod(temporary, 0o666 & ~_umask())  # as open() would make it, not mkstemp's 0600
            os.replace(temporary, path)
        except BaseException:
            os.unlink(temporary)
            raise
    except OSError as exc:  # a full disk, a folder the pre-check could not see through
        raise ConfigError(f"{path}: cannot write ({exc.strerror or exc})") from None


def provenance(model: ModelSpec, parallel: ParallelConfig) -> dict[str, Any]:
    """The run shape costs hold for, as :class:`UnitCosts` records it beside them."""
    return {
        "model": model.name,
        "micro_batch_size": parallel.micro_batch_size,
        "seq_length": model.seq_length,
        "tp": parallel.tp,
        "ep": parallel.ep,
        "cp": parallel.cp,
        "vocab_size": model.vocab_size,
    }


def provenance_mismatches(
    costs: UnitCosts, model: ModelSpec, parallel: ParallelConfig
) -> list[str]:
    """Where the shape ``costs`` were measured under differs from the recipe they would be
    used for, e.g. ``"seq_length 2048 (costs) vs 4096 (recipe)"``; empty when they match.
    Costs that do not record CP or the vocabulary (older files) are not checked on them.

    Every unit's time depends on these: tokens per micro-batch (micro-batch size x sequence
    length), how TP, CP and EP split the work, and the vocabulary the output layer computes."""
    recipe = provenance(model, parallel)
    return [
        f"{key} {getattr(costs, key)} (costs) vs {value} (recipe)"
        for key, value in recipe.items()
        if getattr(costs, key) is not None and getattr(costs, key) != value
    ]


def costs_from_flops(
    model: ModelSpec,
    parallel: ParallelConfig,
    tflops_per_gpu: float = FLOPS_TFLOPS,
    *,
    intra_node_gb_per_s: float = 150.0,
    inter_node_gb_per_s: float = 25.0,
    hbm_gb_per_s: float = HBM_GB_PER_S,
    gpus_per_node: int = 8,
) -> UnitCosts:
    """A guess for when nothing was measured: compute at ``tflops_per_gpu`` achieved, backward
    at BACKWARD_RATIO (LOSS_BACKWARD_RATIO for the output layer) of forward, the embedding from
    the bytes it moves (:func:`embedding_ms`), transfers and the step tail at the given
    bandwidths.

    Measured costs differ: in the seed study FLOPs put the MTP layer at 4 decoder layers and the
    output layer at 2.9, where the timers said 1.4 and 3.6-4.0.  Prefer a fit.
    """
    shards = parallel.tp * parallel.cp
    sizes = unit_sizes(model, parallel.micro_batch_size, parallel.tp)
    forward = {
        u: s.forward_flops / shards / (tflops_per_gpu * 1e12) * 1e3 for u, s in sizes.items()
    }
    backward = {
        u: (LOSS_BACKWARD_RATIO if u == LOSS else BACKWARD_RATIO) * ms for u, ms in forward.items()
    }
    forward[EMBEDDING], backward[EMBEDDING] = embedding_ms(model, parallel, hbm_gb_per_s)
    a2a = a2a_ms(model, parallel, intra_node_gb_per_s, inter_node_gb_per_s, gpus_per_node)
    for unit, moe in layer_units(model).items():
        if moe:  # dispatch and combine, each way
            forward[unit] += 2 * a2a
            backward[unit] += 2 * a2a
    # Megatron sends [s/(TP.CP), b, h] bf16 between stages under sequence parallelism.
    p2p_bytes = WEIGHT_BYTES * model.seq_length * parallel.micro_batch_size * model.hidden_size
    p2p_bytes /= shards
    dp = parallel.dp
    sync_bytes = GRAD_BYTES + WEIGHT_BYTES if parallel.use_distributed_optimizer else 2 * GRAD_BYTES
    dp_in_node = shards * dp <= gpus_per_node  # DP is inner to PP in Megatron's rank order
    sync_gb_per_s = intra_node_gb_per_s if dp_in_node else inter_node_gb_per_s
    optimizer_shard = dp if parallel.use_distributed_optimizer else 1
    return UnitCosts(
        forward_ms=forward,
        backward_ms=backward,
        p2p_intra_node_ms=p2p_bytes / (intra_node_gb_per_s * 1e9) * 1e3,
        p2p_inter_node_ms=p2p_bytes / (inter_node_gb_per_s * 1e9) * 1e3,
        grad_sync_ms_per_gparam=sync_bytes * (dp - 1) / dp / sync_gb_per_s * 1e3,
        optimizer_ms_per_gparam=ADAM_BYTES_MOVED / optimizer_shard / hbm_gb_per_s * 1e3,
        source="flops",
        gpus_per_node=gpus_per_node,
        a2a_ms=a2a,
        **provenance(model, parallel),
    )


def stage_units(model: ModelSpec, stages: Sequence[str]) -> list[list[str]]:
    """The unit names of each flat stage; the k-th ``t`` overall is decoder layer k."""
    layer = count()
    return [
        [decoder_unit(model, next(layer)) if symbol == DECODER else symbol for symbol in stage]
        for stage in stages
    ]


def stage_compute_ms(
    costs: UnitCosts,
    model: ModelSpec,
    stages: Sequence[str],
    settings: MemorySettings = PLAIN,
) -> tuple[list[float], list[float]]:
    """Forward and backward ms of one micro-batch through each flat stage (not each rank); a
    backward re-runs the forward work the job's recompute ``settings`` cover
    (``recompute_cost``)."""
    units = stage_units(model, stages)
    missing = sorted({u for stage in units for u in stage} - set(costs.forward_ms))
    if missing:
        raise ConfigError(
            f"costs for {costs.model}: forward_ms/backward_ms lack unit(s) {', '.join(missing)}, "
            f"which {model.name} needs"
        )
    forward = [sum(costs.forward_ms[u] for u in stage) for stage in units]
    shares = recompute_shares(model, settings)
    backward = [
        sum(costs.backward_ms[u] for u in stage)
        + stage_recompute_ms(stage, costs.forward_ms, shares)
        for stage in units
    ]
    return forward, backward


def step_tail_ms(costs: UnitCosts, stage: StageSize) -> float:
    """Gradient sync and optimizer step of one PP rank after its last backward.

    Scaled by the parameters one GPU of the rank holds, in billions: dense weights split by TP,
    replicated ones whole, expert weights split by EP x ETP, summed over the rank's chunks, before
    any DP split of the distributed optimizer (``stage.gpu_gigaparams``); plus the
    fixed per-step overhead every rank pays.
    """
    gparams = stage.gpu_gigaparams
    per_gparam = costs.grad_sync_ms_per_gparam + costs.optimizer_ms_per_gparam
    return per_gparam * gparams + costs.tail_fixed_ms
