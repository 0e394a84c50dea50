"""The planner's cost model: per-unit times, bytes and noise as arrays, built once per plan.

It joins what the other modules know — measured (or FLOP-derived) unit costs from COSTS.json,
static memory from ``sizing``, activations from ``search.memory``, micro-batches in flight from
Megatron's schedule, p2p links from where the ranks sit — into the arrays ``search.evaluate``
multiplies unit counts with.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ray_layout.errors import ConfigError
from ray_layout.model.costs import UnitCosts
from ray_layout.model.fields import ModelSpec
from ray_layout.model.job_flags import NO_EP_OVERLAP, EpOverlap
from ray_layout.model.layout import DECODER, EMBEDDING, LOSS, MTP
from ray_layout.model.memory_settings import PLAIN, MemorySettings
from ray_layout.model.recompute_cost import recompute_shares
from ray_layout.model.sizing import (
    DECODER_UNITS,
    DENSE_DECODER,
    GIB,
    MOE_DECODER,
    attention_share,
    gpu_gigaparams,
    layer_units,
    unit_sizes,
)
from ray_layout.model.spec import ParallelConfig
from search.combined import MergeSavings, merge_savings
from search.memory import (
    activation_bytes,
    block_saving,
    logits_bytes,
    loss_transient_bytes,
    recompute_bytes,
    static_bytes,
)
from search.pipeline_ops import BACKWARD, ScheduleShape
from search.schedule import compute_order


@dataclass(frozen=True)
class CostModel:
    """Per-unit numbers as arrays over ``units`` plus the per-rank and per-run constants."""

    units: tuple[str, ...]
    moe_pattern: tuple[bool, ...]  # which decoder layers are MoE (splits t into t_dense/t_moe)
    forward_ms: np.ndarray  # (U,) per micro-batch
    backward_ms: np.ndarray  # (U,)
    jitter_cv: np.ndarray  # (U,) coefficient of variation of one unit's op time
    static_bytes: np.ndarray  # (U,) weights + gradients + optimizer per GPU
    activation_bytes: np.ndarray  # (U,) per micro-batch in flight, calibrated
    tail_params: np.ndarray  # (U,) billions of parameters per GPU that the step tail syncs
    p2p_ms: np.ndarray  # (PP,) one transfer over the boundary rank r -> r+1 (last: wrap)
    tail_ms_per_gparam: float  # gradient sync + optimizer, per billion parameters on a GPU
    logits_bytes: float  # the last rank's logits for every MTP depth + 1
    standalone_copy_bytes: float  # a rank holding MTP without the loss builds an embedding
    standalone_copy_params: float
    overhead_bytes: float
    mtp_standalone_factor: float
    in_flight: np.ndarray  # (PP, VPP) micro-batches in flight per rank and chunk at the peak
    tail_fixed_ms: float = 0.0  # per step on every rank, not proportional to parameters
    # --recompute-method block: a chunk's first ``block_layers`` decoder layers keep only their
    # input, freeing ``block_saving_bytes`` each, and re-run ``block_recompute_ms`` each in their
    # backward; none when 0 (every other recompute setting is in ``backward_ms`` already)
    block_layers: int = 0
    block_saving_bytes: np.ndarray | None = None  # (U,)
    block_recompute_ms: np.ndarray | None = None  # (U,)
    recompute_bytes: float = 0.0  # what one backward recomputes at a time, on every rank
    # combined 1F1B (EP all-to-all overlap): what each merged layer pair hides; None: no merge
    merge: MergeSavings | None = None

    @property
    def has_jitter(self) -> bool:
        return bool(np.any(self.jitter_cv > 0))

    @property
    def layer_units(self) -> np.ndarray:
        """(decoder layers,) the unit index of each decoder layer, in model order."""
        if DECODER in self.units:
            return np.full(len(self.moe_pattern), self.units.index(DECODER))
        kinds = (self.units.index(DENSE_DECODER), self.units.index(MOE_DECODER))
        return np.array([kinds[moe] for moe in self.moe_pattern], dtype=int)


def in_flight_at_peak(shape: ScheduleShape) -> np.ndarray:
    """(PP, VPP) micro-batches of each chunk whose activations a rank holds when it holds the
    most (forwards done, backwards not yet), walking Megatron's own op order (a merged step
    holds its forward's before its backward frees its own)."""
    counts = np.zeros((shape.pp, shape.vpp), dtype=int)
    for rank, ops in enumerate(compute_order(shape)):
        held = np.zeros(shape.vpp, dtype=int)
        for op in ops:
            held[op.chunk] += -1 if op.kind == BACKWARD else 1
            if held.sum() > counts[rank].sum():
                counts[rank] = held
    return counts


def inter_node_links(parallel: ParallelConfig, gpus_per_node: int) -> np.ndarray:
    """(PP,) whether the boundary after PP rank r (the last wraps to rank 0) crosses nodes.

    Global ranks run tp-cp-ep-dp-pp with PP outermost, so stage r holds ranks
    ``r*k .. r*k + k - 1`` (k = world / PP) and a boundary is within a node only if every pair
    of peers on it shares one.
    """
    per_stage = parallel.world_size // parallel.pp
    crossing = np.empty(parallel.pp, dtype=bool)
    for rank in range(parallel.pp):
        peer = (rank + 1) % parallel.pp
        crossing[rank] = any(
            (rank * per_stage + j) // gpus_per_node != (peer * per_stage + j) // gpus_per_node
            for j in range(per_stage)
        )
    return crossing


def p2p_links(costs: UnitCosts, parallel: ParallelConfig) -> np.ndarray:
    """(PP,) one transfer over the boundary after rank r (the last wraps to rank 0)."""
    crossing = inter_node_links(parallel, costs.gpus_per_node)
    return np.where(crossing, costs.p2p_inter_node_ms, costs.p2p_intra_node_ms)


def build_cost_model(
    model: ModelSpec,
    parallel: ParallelConfig,
    costs: UnitCosts,
    num_microbatches: int,
    group_size: int | None = None,
    settings: MemorySettings = PLAIN,
    ep_overlap: EpOverlap = NO_EP_OVERLAP,
) -> CostModel:
    """Arrays over the model's units for a run of ``parallel`` sizes and ``num_microbatches``,
    with the memory and the recomputation the job's ``settings`` (recompute, optimizer
    precision, offload) imply and the merged steps of its EP all-to-all overlap
    (``ep_overlap``).  ``costs.backward_ms`` is a backward without recomputation."""
    sizes = unit_sizes(model, parallel.micro_batch_size, parallel.tp)
    units = tuple(sizes)
    missing = [u for u in units if u not in costs.forward_ms]
    if missing:
        raise ConfigError(
            f"costs for {costs.model} lack unit(s) {', '.join(missing)} that {model.name} needs"
            + (
                " (mixed dense/MoE models need t_dense and t_moe)"
                if "t" in costs.forward_ms
                else ""
            )
        )
    calibration = np.array([costs.memory_calibration.get(u, 1.0) for u in units])
    layers = (*DECODER_UNITS, MTP)
    static = [static_bytes(sizes[u].params, parallel, settings, fp8=u in layers) for u in units]
    in_flight = in_flight_at_peak(
        ScheduleShape(
            parallel.pp, parallel.vpp, num_microbatches, group_size, combined=ep_overlap.on
        )
    )
    forward = np.array([costs.forward_ms[u] for u in units])
    shares = recompute_shares(model, settings)
    every, block = ([table.get(u, 0.0) for u in units] for table in (shares.every, shares.block))
    backward = np.array([costs.backward_ms[u] for u in units]) + forward * every
    block_recompute = forward * block if shares.block_layers and any(block) else None
    embedding = static_bytes(sizes[EMBEDDING].params, parallel, settings)
    saving = np.array([block_saving(model, parallel, u, settings) for u in units]) * calibration
    return CostModel(
        units=units,
        moe_pattern=model.moe_layer_pattern,
        forward_ms=forward,
        backward_ms=backward,
        jitter_cv=np.array([costs.jitter_cv.get(u, 0.0) for u in units]),
        static_bytes=np.array([m.total for m in static]),
        activation_bytes=np.array([activation_bytes(model, parallel, u, settings) for u in units])
        * calibration,
        tail_params=np.array([gpu_gigaparams(sizes[u].params, parallel) for u in units]),
        p2p_ms=p2p_links(costs, parallel),
        tail_ms_per_gparam=costs.grad_sync_ms_per_gparam + costs.optimizer_ms_per_gparam,
        logits_bytes=(
            logits_bytes(model, parallel, settings) * in_flight[-1, -1]
            + loss_transient_bytes(model, parallel, settings) * (in_flight[-1, -1] > 0)
        )
        * costs.memory_calibration.get(LOSS, 1.0),
        standalone_copy_bytes=embedding.total,
        standalone_copy_params=gpu_gigaparams(sizes[EMBEDDING].params, parallel),
        overhead_bytes=costs.memory_overhead_gib * GIB,
        mtp_standalone_factor=costs.mtp_standalone_factor,
        in_flight=in_flight,
        tail_fixed_ms=costs.tail_fixed_ms,
        block_layers=shares.block_layers if saving.any() or block_recompute is not None else 0,
        block_saving_bytes=saving if saving.any() else None,
        block_recompute_ms=block_recompute,
        recompute_bytes=recompute_bytes(model, parallel, settings),
        merge=_merge(model, units, forward, backward, costs.a2a_ms, ep_overlap),
    )


def _merge(
    model: ModelSpec,
    units: tuple[str, ...],
    forward: np.ndarray,
    backward: np.ndarray,
    a2a: float,
    ep_overlap: EpOverlap,
) -> MergeSavings | None:
    """What combined 1F1B's merged layer pairs hide (None without it): decoder layers only."""
    if not ep_overlap.on:
        return None
    decoder = {u: moe for u, moe in layer_units(model).items() if u in DECODER_UNITS}
    shares = {u: attention_share(model, moe) for u, moe in decoder.items()}
    moe_units = [u for u, moe in decoder.items() if moe]
    return merge_savings(units, forward, backward, shares, a2a, moe_units, ep_overlap.delay_wgrad)
