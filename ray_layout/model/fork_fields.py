"""The model facts of Megatron's forks (``dialects``) that megatron-core has no flag for, checked
together the way ``spec.build_recipe`` checks the core fields: DeepSpeed-MoE's per-layer expert
counts, its MoE block and PR-MoE residual, MindSpeed's no-op layers, the shared expert's gate."""

from __future__ import annotations

from typing import Any

from ray_layout.errors import ConfigError, quoted
from ray_layout.model.fields import MAX_DIMENSION

_MOE_BLOCKS = ("megatron", "deepspeed")


def check_fork_fields(v: dict[str, Any], pattern: tuple[bool, ...], source: str) -> None:
    """The forks' model facts (``dialects``) checked and settled in ``v``: the per-MoE-layer
    expert counts (one per MoE layer, their largest num_experts; all alike is ()), the MoE block
    and its residual MLP, the no-op layers (each a layer, sorted), the shared expert's gate."""
    if v["moe_block"] not in _MOE_BLOCKS:
        shown = quoted(v["moe_block"])
        raise ConfigError(f"{source}: moe_block must be megatron or deepspeed, not {shown}")
    if v["moe_residual"] and v["moe_block"] != "deepspeed":
        raise ConfigError(f"{source}: moe_residual (PR-MoE) needs moe_block deepspeed")
    if v["moe_shared_expert_gate"] and not v["moe_shared_expert_intermediate_size"]:
        raise ConfigError(f"{source}: moe_shared_expert_gate set without a shared expert")
    counts = _integers(v["moe_layer_experts"], "moe_layer_experts", 1, MAX_DIMENSION, source)
    if counts:
        moe_layers = sum(pattern)
        if len(counts) != moe_layers:
            raise ConfigError(
                f"{source}: moe_layer_experts has {len(counts)} entries for {moe_layers} MoE layers"
            )
        if max(counts) != v["num_experts"]:
            raise ConfigError(
                f"{source}: num_experts {v['num_experts']} is not the largest of "
                f"moe_layer_experts ({max(counts)})"
            )
        if v["moe_router_topk"] > min(counts):
            raise ConfigError(
                f"{source}: moe_router_topk {v['moe_router_topk']} is more than a layer's "
                f"{min(counts)} experts"
            )
    v["moe_layer_experts"] = counts if len(set(counts)) > 1 else ()
    noop = _integers(v["noop_layers"], "noop_layers", 0, v["num_layers"] - 1, source)
    if len(set(noop)) != len(noop):
        raise ConfigError(f"{source}: noop_layers names a layer twice: {quoted(list(noop))}")
    v["noop_layers"] = tuple(sorted(noop))


def _integers(value: Any, key: str, least: int, most: int, source: str) -> tuple[int, ...]:
    """A list field of integers in [least, most], as a tuple."""
    if not isinstance(value, list | tuple):
        raise ConfigError(f"{source}: {key} must be a list of integers, got {quoted(value)}")
    for item in value:
        if type(item) is not int or not least <= item <= most:
            raise ConfigError(
                f"{source}: {key} entries must be integers in [{least}, {most}], got {quoted(item)}"
            )
    return tuple(value)
