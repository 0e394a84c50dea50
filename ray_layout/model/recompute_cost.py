"""What recomputation costs in time: the forward work each recompute setting re-runs.

Megatron re-runs a checkpointed forward just before the backward that needs it (megatron-core
0.16.1: ``transformer_block.py:_checkpointed_forward``, ``multi_token_prediction.py``, and the
selective checkpoints of ``transformer_layer.py``, ``moe/moe_layer.py``, ``moe/experts.py``,
``multi_latent_attention.py``), so a setting costs the forward time of what it covers, added to
the backward of the units it covers:

* ``full`` + ``uniform``: every decoder layer and every MTP layer, whole;
* ``full`` + ``block``: the first ``--recompute-num-layers`` decoder layers of each virtual
  stage (each chunk's ``TransformerBlock`` counts its own), whole; MTP layers are not recomputed
  (megatron-core warns "not supported for MTP yet" and runs them plainly);
* ``selective``: each listed module's share of a decoder layer's (and an MTP layer's) forward.

The shares are FLOP shares of one layer's forward (``sizing``'s accounting, split per module);
norms and activations, which move memory more than they compute, count ``ELEMENTWISE_FLOPS`` per
element so that recomputing them is cheap, never free.  Where a unit's forward was measured, the
recomputed time is that measured forward times the share.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from ray_layout.model.fields import ModelSpec
from ray_layout.model.layout import MTP
from ray_layout.model.memory_settings import MemorySettings
from ray_layout.model.sizing import (
    DECODER_UNITS,
    attention_flops_per_token,
    layer_units,
    unit_sizes,
)

ELEMENTWISE_FLOPS = 4  # per element of a norm or an activation: a few multiply-adds

# Which parts of a decoder layer each --recompute-modules entry re-runs (see module_flops).
MODULE_PARTS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "core_attn": ("core_attn",),
        "mla_up_proj": ("mla_up_proj",),
        "layernorm": ("norms",),
        "mlp": ("dense_mlp", "dense_act"),
        "moe": ("router", "routed", "routed_act", "shared", "shared_act"),
        "moe_act": ("routed_act",),
        "shared_experts": ("shared", "shared_act"),
    }
)


@dataclass(frozen=True)
class RecomputeShares:
    """Per unit, the share of its forward a backward re-runs: ``every`` for each copy of the
    unit, ``block`` only for a decoder layer among its chunk's first ``block_layers``."""

    every: Mapping[str, float] = field(default_factory=dict)
    block: Mapping[str, float] = field(default_factory=dict)
    block_layers: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "every", MappingProxyType(dict(self.every)))
        object.__setattr__(self, "block", MappingProxyType(dict(self.block)))

    @property
    def any(self) -> bool:
        return any(self.every.values()) or (self.block_layers > 0 and any(self.block.values()))


def module_flops(model: ModelSpec, moe: bool) -> dict[str, float]:
    """Forward FLOPs per token of each part of one decoder layer; they add up to ``sizing``'s
    figure for the layer plus its norms, activations and router."""
    h = model.hidden_size
    gated = 3 if model.gated_linear_unit else 2
    core = _core_attention_flops(model)
    up = _mla_up_flops(model)
    parts = {
        "core_attn": core,
        "mla_up_proj": up,
        "attention_rest": attention_flops_per_token(model) - core - up,
        "norms": 2 * ELEMENTWISE_FLOPS * h,
    }
    if not moe:
        return parts | {
            "dense_mlp": 2 * h * model.ffn_hidden_size * gated,
            "dense_act": ELEMENTWISE_FLOPS * model.ffn_hidden_size,
        }
    routed = model.moe_ffn_hidden_size * (model.moe_router_topk + model.moe_residual)
    shared = model.moe_shared_expert_intermediate_size
    return parts | {
        "router": 2 * h * max(model.experts_per_layer),
        "routed": 2 * h * routed * gated,
        "routed_act": ELEMENTWISE_FLOPS * routed,
        "shared": 2 * h * shared * gated,
        "shared_act": ELEMENTWISE_FLOPS * shared,
    }


def _core_attention_flops(model: ModelSpec) -> float:
    """Scores and their weighted sum, causal (``sizing``'s terms in s)."""
    heads, s = model.num_attention_heads, model.seq_length
    if model.mla is None:
        return 2 * model.kv_channels * heads * s
    mla = model.mla
    return s * heads * (mla.qk_head_dim + mla.qk_pos_emb_head_dim + mla.v_head_dim)


def _mla_up_flops(model: ModelSpec) -> float:
    """MLA's up-projections of the compressed query and key-value (none without MLA)."""
    mla = model.mla
    if mla is None:
        return 0.0
    heads = model.num_attention_heads
    query = mla.q_lora_rank * heads * (mla.qk_head_dim + mla.qk_pos_emb_head_dim)
    return 2 * (query + mla.kv_lora_rank * heads * (mla.qk_head_dim + mla.v_head_dim))


def _selective_share(model: ModelSpec, unit: str, moe: bool, modules: frozenset[str]) -> float:
    """The share of ``unit``'s forward FLOPs in the parts ``modules`` re-run."""
    parts = module_flops(model, moe)
    covered = {part for module in modules for part in MODULE_PARTS[module]}
    redone = sum(flops for part, flops in parts.items() if part in covered)
    total = sum(parts.values())
    if unit == MTP:  # the MTP layer's own projection and norms are not in a selective module
        glue = unit_sizes(model)[MTP].forward_flops / model.seq_length
        total += glue - _layer_flops_in_unit(model, moe)
    return redone / total


def _layer_flops_in_unit(model: ModelSpec, moe: bool) -> float:
    """``sizing``'s per-token forward FLOPs of one decoder layer (norms and router aside)."""
    parts = module_flops(model, moe)
    elementwise = ("norms", "dense_act", "routed_act", "shared_act", "router")
    return sum(flops for part, flops in parts.items() if part not in elementwise)


def recompute_shares(model: ModelSpec, settings: MemorySettings) -> RecomputeShares:
    """Each unit's recomputed share of its forward under the job's recompute settings."""
    layers = layer_units(model)
    if settings.recompute_granularity == "full":
        if settings.recompute_method == "block":
            block = {u: 1.0 for u in layers if u in DECODER_UNITS}
            return RecomputeShares(block=block, block_layers=settings.recompute_num_layers)
        return RecomputeShares(every=dict.fromkeys(layers, 1.0))
    if not settings.selective:
        return RecomputeShares()
    every = {u: _selective_share(model, u, moe, settings.selective) for u, moe in layers.items()}
    return RecomputeShares(every=every)


def stage_recompute_ms(
    units: Sequence[str], forward_ms: Mapping[str, float], shares: RecomputeShares
) -> float:
    """What one micro-batch's backward through a stage holding ``units`` (in model order)
    re-runs: every unit's share, and the block share of its first ``block_layers`` layers."""
    total = sum(forward_ms[u] * shares.every.get(u, 0.0) for u in units)
    decoder = [u for u in units if u in DECODER_UNITS]
    return total + sum(
        forward_ms[u] * shares.block.get(u, 0.0) for u in decoder[: shares.block_layers]
    )
