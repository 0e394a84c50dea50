"""Peak memory of each PP rank for a layout: static state, activations in flight, logits.

Activations follow Megatron's ``theoretical_memory_usage.py`` (Korthikanti et al. 2022, Table 2):
bytes a micro-batch keeps for its backward, assuming sequence parallelism and selective
recomputation (flash attention keeps no s x s score matrix), bf16 activations, 1-byte dropout
masks, everything split by TP and, the sequence being split, by CP.  Per token, with
q = heads x kv_channels and kv = groups x kv_channels:

- decoder layer: the inputs of its two norms 4h, attention, MLP or MoE block;
- attention: its input 2h, Q 2q, K and V 2kv each, the core-attention output 2q, dropout mask h:
  ``3h + 4q + 4kv``, Megatron's 11h when q = kv = h (GQA shrinks K and V; MLA keeps its latents
  and uses its own Q/K and V widths); flash attention's per-head softmax statistics are ignored;
- MLP: input 2h, the first projection's output (2 x ffn wide under SwiGLU) and the activation's
  output ffn, dropout mask h: ``3h + 2(g+1)ffn`` with g = 2 under SwiGLU else 1 (Megatron's
  ``3h + 4ffn`` for GeLU);
- MoE block: as the MLP but each token's top-k routed copies keep the permuted input 2h, the
  expert's ``2(g+1)moe_ffn`` and the expert output 2h for the weighted combine; plus the router's
  fp32 scores 4E and a shared expert's ``2(g+1)shared``.  Routing is taken as balanced, and expert
  activations are split by TP like the rest (as with ETP = 1 under sequence parallelism);
- MTP layer: a decoder layer (MoE if the last decoder layer is) plus its glue: the inputs of the
  embedding and hidden norms 2h each, the 2h-wide concatenation 4h, its final norm's input 2h;
- embedding: Megatron's 8 bytes of token ids and the h-byte dropout mask;
- output layer + loss: the final norm's input 2h and the output layer's input 2h per MTP depth
  + 1 (Megatron's 4h when there is no MTP); its fp32 logits, 4 bytes x padded vocab / TP per
  token per depth, are kept apart as ``logits``.

How many micro-batches of each virtual chunk a rank holds at its peak comes from the schedule.
Measured memory differs (allocator fragmentation, NCCL and cuBLAS workspaces, recomputation
settings): ``UnitCosts.memory_calibration`` scales each unit's activations (``L``'s also scales
the logits) and ``memory_overhead_gib`` adds a fixed amount; weights, gradients and optimizer
state are exact and not scaled.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from ray_layout.model.costs import UnitCosts, stage_units
from ray_layout.model.layout import Layout
from ray_layout.model.sizing import (
    DECODER,
    DENSE_DECODER,
    EMBEDDING,
    GIB,
    LOSS,
    MOE_DECODER,
    MTP,
    stage_sizes,
)
from ray_layout.model.spec import ModelSpec, ParallelConfig

LOGIT_BYTES = 4  # the loss works on fp32 logits


@dataclass(frozen=True)
class StageMemory:
    """Peak bytes on one GPU of PP rank ``pp_rank``."""

    pp_rank: int
    weights: float
    gradients: float
    optimizer: float
    activations: float
    logits: float
    overhead: float

    @property
    def total(self) -> float:
        return (
            self.weights
            + self.gradients
            + self.optimizer
            + self.activations
            + self.logits
            + self.overhead
        )

    @property
    def total_gib(self) -> float:
        return self.total / GIB


# The per-token formulas below count bytes with the coefficients of the module docstring.


def _attention_bytes_per_token(model: ModelSpec) -> float:
    h, heads = model.hidden_size, model.num_attention_heads
    if model.mla is not None:
        mla = model.mla
        qk = heads * (mla.qk_head_dim + mla.qk_pos_emb_head_dim)
        v = heads * mla.v_head_dim
        latents = (mla.q_lora_rank or 0) + mla.kv_lora_rank + mla.qk_pos_emb_head_dim
        return 3 * h + 2 * latents + 4 * qk + 4 * v
    q = model.kv_channels * heads
    kv = model.kv_channels * model.num_query_groups
    return 3 * h + 4 * q + 4 * kv


def _mlp_bytes_per_token(model: ModelSpec, moe: bool) -> float:
    h = model.hidden_size
    widths = 6 if model.swiglu else 4  # bytes per unit of FFN width: 2(g+1)
    if not moe:
        return 3 * h + widths * model.ffn_hidden_size
    routed_copy = 4 * h + widths * model.moe_ffn_hidden_size
    return (
        3 * h
        + 4 * model.num_experts
        + model.moe_router_topk * routed_copy
        + widths * model.moe_shared_expert_intermediate_size
    )


def _decoder_bytes_per_token(model: ModelSpec, moe: bool) -> float:
    return (
        4 * model.hidden_size + _attention_bytes_per_token(model) + _mlp_bytes_per_token(model, moe)
    )


def _bytes_per_token(model: ModelSpec, unit: str) -> float:
    h = model.hidden_size
    if unit == EMBEDDING:
        return 8 + h
    if unit in (DECODER, DENSE_DECODER, MOE_DECODER):
        # A uniform model's single unit t is MoE exactly when all its layers are.
        moe = unit == MOE_DECODER or (unit == DECODER and any(model.moe_layer_pattern))
        return _decoder_bytes_per_token(model, moe)
    if unit == MTP:
        return _decoder_bytes_per_token(model, model.mtp_layer_is_moe) + 10 * h
    if unit == LOSS:
        return 2 * h * (model.mtp_num_layers + 2)
    raise ValueError(f"unknown unit {unit!r}")


def _tokens_per_gpu(model: ModelSpec, parallel: ParallelConfig) -> float:
    """Tokens of one micro-batch whose activations one GPU keeps, after the TP and CP splits."""
    return model.seq_length * parallel.micro_batch_size / (parallel.tp * parallel.cp)


def activation_bytes(model: ModelSpec, parallel: ParallelConfig, unit: str) -> float:
    """Bytes one micro-batch of ``unit`` keeps on one GPU until its backward."""
    return _bytes_per_token(model, unit) * _tokens_per_gpu(model, parallel)


def logits_bytes(model: ModelSpec, parallel: ParallelConfig) -> float:
    """fp32 logits of one micro-batch on one GPU of the last rank, for every MTP depth + 1."""
    vocab = model.padded_vocab_size(parallel.tp)
    return LOGIT_BYTES * vocab * _tokens_per_gpu(model, parallel) * (model.mtp_num_layers + 1)


def stage_memory(
    model: ModelSpec,
    parallel: ParallelConfig,
    layout: Layout,
    costs: UnitCosts,
    in_flight: Sequence[Mapping[int, int]],
) -> list[StageMemory]:
    """Peak memory of each PP rank; ``in_flight[r][c]`` is how many micro-batches of virtual
    chunk ``c`` rank ``r`` holds activations for at its peak (a chunk left out holds none)."""
    if layout.pp != parallel.pp or len(in_flight) != layout.pp:
        raise ValueError(
            f"layout PP {layout.pp}, parallel PP {parallel.pp} and {len(in_flight)} in-flight "
            "counts must agree"
        )
    for rank, counts in enumerate(in_flight):
        if not set(counts) <= set(range(layout.vpp)):
            raise ValueError(f"in-flight counts of PP rank {rank} name chunks {sorted(counts)}")
    units = stage_units(model, layout.stages)
    scale = costs.memory_calibration
    per_batch = {
        unit: activation_bytes(model, parallel, unit) * scale.get(unit, 1.0)
        for unit in {u for stage in units for u in stage}
    }
    logits_per_batch = logits_bytes(model, parallel) * scale.get(LOSS, 1.0)
    memories = []
    for static, counts in zip(stage_sizes(model, parallel, layout.stages), in_flight, strict=True):
        chunks = enumerate(units[static.pp_rank :: layout.pp])
        held = [(counts.get(chunk, 0), stage) for chunk, stage in chunks]
        memories.append(
            StageMemory(
                pp_rank=static.pp_rank,
                weights=static.memory.weights,
                gradients=static.memory.gradients,
                optimizer=static.memory.optimizer,
                activations=sum(n * sum(per_batch[u] for u in stage) for n, stage in held),
                logits=sum(n * logits_per_batch for n, stage in held if LOSS in stage),
                overhead=costs.memory_overhead_gib * GIB,
            )
        )
    return memories


def fits(memories: Iterable[StageMemory], hbm_gib: float) -> bool:
    """Every rank's peak within ``hbm_gib`` GiB of device memory."""
    return all(memory.total_gib <= hbm_gib for memory in memories)
