"""Peak memory of each PP rank for a layout: static state, activations in flight, logits.

Activations follow Megatron's ``theoretical_memory_usage.py`` (Korthikanti et al. 2022, Table 2):
bytes a micro-batch keeps for its backward, assuming sequence parallelism and flash attention
(no s x s score matrix: Megatron's selective-recompute figure), bf16 activations, 1-byte dropout
masks, everything split by TP and, the sequence being split, by CP.  Per token, with
q = heads x kv_channels and kv = groups x kv_channels:

- decoder layer: the inputs of its two norms 4h, attention, MLP or MoE block;
- attention: its input 2h, Q 2q, K and V 2kv each, the core-attention output 2q, dropout mask h:
  ``3h + 4q + 4kv``, Megatron's 11h when q = kv = h (GQA shrinks K and V; MLA keeps its latents
  and uses its own Q/K and V widths); flash attention's per-head softmax statistics are ignored;
- MLP: input 2h, the first projection's output (2 x ffn wide when gated: SwiGLU or
  quick-GeGLU) and the activation's output ffn, dropout mask h: ``3h + 2(g+1)ffn`` with g = 2
  when gated else 1 (Megatron's ``3h + 4ffn`` for GeLU);
- MoE block: as the MLP but each token's top-k routed copies keep the permuted input 2h, the
  expert's ``2(g+1)moe_ffn`` and the expert output 2h for the weighted combine; plus the router's
  fp32 scores 4E and a shared expert's ``2(g+1)shared``.  Routing is taken as balanced, and expert
  activations are split by TP like the rest (as with ETP = 1 under sequence parallelism);
- MTP layer: a decoder layer (MoE if the last decoder layer is) plus its glue: the inputs of the
  embedding and hidden norms 2h each, the 2h-wide concatenation 4h, its final norm's input 2h;
- embedding: Megatron's 8 bytes of token ids and the h-byte dropout mask;
- output layer + loss: the final norm's input 2h and the output layer's input 2h per MTP depth
  + 1 (Megatron's 4h when there is no MTP); the logits, padded vocab / TP per token per depth,
  are kept apart as ``logits``: what the loss saves for its backward (fp32 softmax, or TE's bf16
  logits) per micro-batch, plus what is alive beside it once while one depth's loss runs
  (:func:`loss_logit_bytes`, per ``--cross-entropy-loss-fusion`` and its implementation).

The job's own flags (``ray_layout.model.memory_settings``) change these amounts as Megatron's
code does: selective recompute and fine-grained offloading take out the tensors each module
frees (one layer's recomputed tensors come back while its backward runs); full recompute keeps a
2h checkpoint input per group (``uniform``) or for a chunk's first layers (``block``); the
optimizer state follows the precision-aware optimizer's dtypes, its CPU offload fraction and the
distributed optimizer's shards over DP (dense) and expert-DP (experts); ``--fp8-param-gather``
stores decoder linear weights in one byte.

How many micro-batches of each virtual chunk a rank holds at its peak comes from the schedule.
Measured memory differs (allocator fragmentation, NCCL and cuBLAS workspaces):
``UnitCosts.memory_calibration`` scales each unit's activations (``L``'s also scales the logits)
and ``memory_overhead_gib`` adds a fixed amount; weights, gradients and optimizer state are exact
and not scaled.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from ray_layout.model.costs import UnitCosts, stage_units
from ray_layout.model.fields import ModelSpec
from ray_layout.model.layout import DECODER, EMBEDDING, LOSS, MTP, Layout
from ray_layout.model.memory_settings import PLAIN, MemorySettings
from ray_layout.model.sizing import (
    DECODER_UNITS,
    DENSE_DECODER,
    GIB,
    MOE_DECODER,
    WEIGHT_BYTES,
    Params,
    gpu_params,
    stage_sizes,
    unit_sizes,
)
from ray_layout.model.spec import ParallelConfig

LOGIT_BYTES = 4  # the unfused and native losses work on fp32 logits


@dataclass(frozen=True)
class StaticMemory:
    """Bytes one GPU holds for weights, gradients and optimizer state."""

    weights: float
    gradients: float
    optimizer: float

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer


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


# The per-token formulas below count bytes with the coefficients of the module docstring, one
# named term per saved tensor, so that recompute and offloading can take out exactly theirs.


def _attention_terms(model: ModelSpec) -> dict[str, float]:
    h, heads = model.hidden_size, model.num_attention_heads
    if model.mla is not None:
        mla = model.mla
        qk = heads * (mla.qk_head_dim + mla.qk_pos_emb_head_dim)
        v = heads * mla.v_head_dim
        latents = (mla.q_lora_rank or 0) + mla.kv_lora_rank + mla.qk_pos_emb_head_dim
        return {
            "attn_norm_in": 2 * h,
            "attn_in": 2 * h,
            "latents": 2 * latents,
            "qkv": 4 * qk + 2 * v,
            "attn_out": 2 * v,
            "attn_mask": h,
        }
    q = model.kv_channels * heads
    kv = model.kv_channels * model.num_query_groups
    return {
        "attn_norm_in": 2 * h,
        "attn_in": 2 * h,
        "qkv": 2 * q + 4 * kv,
        "attn_out": 2 * q,
        "attn_mask": h,
    }


def _mlp_terms(model: ModelSpec, moe: bool) -> dict[str, float]:
    h = model.hidden_size
    gate = 2 if model.gated_linear_unit else 1  # the first projection is 2 x ffn wide when gated
    terms = {"mlp_norm_in": 2 * h, "mlp_in": 2 * h, "mlp_mask": h}
    if not moe:
        return terms | {
            "fc1_out": 2 * gate * model.ffn_hidden_size,
            "act_out": 2 * model.ffn_hidden_size,
        }
    k, ffn = model.moe_router_topk, model.moe_ffn_hidden_size
    return terms | {
        "router": 4 * model.num_experts,
        "routed_in": k * 2 * h,
        "routed_fc1": k * 2 * gate * ffn,
        "routed_act": k * 2 * ffn,
        "routed_out": k * 2 * h,
        "shared": 2 * (gate + 1) * model.moe_shared_expert_intermediate_size,
    }


def layer_terms(model: ModelSpec, moe: bool) -> dict[str, float]:
    """Bytes per token of each tensor a decoder layer saves for its backward (no recompute)."""
    return _attention_terms(model) | _mlp_terms(model, moe)


# What each --recompute-modules entry frees, by the tensors its checkpoint discards
# (transformer_layer.py, multi_latent_attention.py, moe/experts.py, moe/moe_layer.py): a normal
# checkpoint keeps its input, an output-discarding one frees just its output.  core_attn frees
# nothing counted here: flash attention keeps no score matrix, and Q, K, V and the output stay
# as the checkpoint's input and the output projection's.  layernorm frees a norm's output only
# where the norm is not fused into the next linear (TE fuses the dense MLP's, and non-MLA
# attention's): MLA's input norm and an MoE layer's pre-MLP norm.
def _recomputed(model: ModelSpec, moe: bool, module: str) -> tuple[str, ...]:
    if module == "layernorm":
        return (("attn_in",) if model.mla is not None else ()) + (("mlp_in",) if moe else ())
    if module == "mla_up_proj":
        return ("qkv",) if model.mla is not None else ()
    if module == "mlp":
        return () if moe else ("fc1_out", "act_out")
    if module == "moe":
        return (
            ("router", "routed_in", "routed_fc1", "routed_act", "routed_out", "shared")
            if moe
            else ()
        )
    if module == "moe_act":
        return ("routed_act",) if moe else ()
    if module == "shared_experts":
        return ("shared",) if moe else ()
    return ()  # core_attn


# What each --offload-modules entry moves to the CPU: the tensors that module saves as its input.
_OFFLOADED = {
    "attn_norm": ("attn_norm_in",),
    "qkv_linear": ("attn_in",),
    "core_attn": ("qkv",),
    "attn_proj": ("attn_out",),
    "mlp_norm": ("mlp_norm_in",),
    "expert_fc1": ("routed_in",),
    "moe_act": ("routed_fc1",),
}


def _kept_terms(model: ModelSpec, moe: bool, settings: MemorySettings) -> dict[str, float]:
    """The layer's terms after selective recompute and offloading took theirs out."""
    terms = layer_terms(model, moe)
    freed = {t for m in settings.selective for t in _recomputed(model, moe, m)}
    freed |= {t for m in settings.offload_modules for t in _OFFLOADED[m]}
    return {name: b for name, b in terms.items() if name not in freed}


def _layer_bytes(model: ModelSpec, moe: bool, settings: MemorySettings, unit: str) -> float:
    """Per token one decoder layer keeps: all its kept terms, or under full recompute only the
    checkpoint's input, 2h per checkpointed group (``transformer_block.py``); ``block`` keeps the
    whole layer here and :func:`block_saving` takes the first layers' share out per chunk."""
    if settings.recompute_granularity == "full" and settings.recompute_method == "uniform":
        if unit != MTP:
            return 2 * model.hidden_size / settings.recompute_num_layers
        return 2 * model.hidden_size  # multi_token_prediction.py checkpoints each MTP layer
    return sum(_kept_terms(model, moe, settings).values())


def _is_moe(model: ModelSpec, unit: str) -> bool:
    if unit == MTP:
        return model.mtp_layer_is_moe
    # A uniform model's single unit t is MoE exactly when all its layers are.
    return unit == MOE_DECODER or (unit == DECODER and any(model.moe_layer_pattern))


def _bytes_per_token(model: ModelSpec, unit: str, settings: MemorySettings) -> float:
    h = model.hidden_size
    if unit == EMBEDDING:
        return 8 + h
    if unit in DECODER_UNITS:
        return _layer_bytes(model, _is_moe(model, unit), settings, unit)
    if unit == MTP:
        return _layer_bytes(model, _is_moe(model, unit), settings, unit) + 10 * h
    if unit == LOSS:
        return 2 * h * (model.mtp_num_layers + 2)
    raise ValueError(f"unknown unit {unit!r}")


def _tokens_per_gpu(model: ModelSpec, parallel: ParallelConfig) -> float:
    """Tokens of one micro-batch whose activations one GPU keeps, after the TP and CP splits."""
    return model.seq_length * parallel.micro_batch_size / (parallel.tp * parallel.cp)


def activation_bytes(
    model: ModelSpec, parallel: ParallelConfig, unit: str, settings: MemorySettings = PLAIN
) -> float:
    """Bytes one micro-batch of ``unit`` keeps on one GPU until its backward."""
    return _bytes_per_token(model, unit, settings) * _tokens_per_gpu(model, parallel)


def block_saving(
    model: ModelSpec, parallel: ParallelConfig, unit: str, settings: MemorySettings
) -> float:
    """Bytes a decoder layer among a chunk's first ``--recompute-num-layers`` frees under
    ``--recompute-method block`` (it keeps only its 2h input); 0 for other units and methods."""
    block = settings.recompute_granularity == "full" and settings.recompute_method == "block"
    if not block or unit not in DECODER_UNITS:
        return 0.0
    full = _layer_bytes(model, _is_moe(model, unit), PLAIN, unit)
    return (full - 2 * model.hidden_size) * _tokens_per_gpu(model, parallel)


def recompute_bytes(model: ModelSpec, parallel: ParallelConfig, settings: MemorySettings) -> float:
    """What one backward recomputes at a time, on top of what is held: a uniform group's
    ``--recompute-num-layers`` layers, one block-checkpointed layer, or one layer's selectively
    recomputed tensors; counted for the widest layer, on every rank."""
    moe_kinds = {bool(m) for m in model.moe_layer_pattern} or {False}
    tokens = _tokens_per_gpu(model, parallel)
    if settings.recompute_granularity == "full":
        group = settings.recompute_num_layers if settings.recompute_method == "uniform" else 1
        widest = max(_layer_bytes(model, moe, PLAIN, DECODER) for moe in moe_kinds)
        return group * widest * tokens * (settings.recompute_num_layers > 0)
    freed = 0.0
    for moe in moe_kinds:
        terms = layer_terms(model, moe)
        names = {t for m in settings.selective for t in _recomputed(model, moe, m)}
        freed = max(freed, sum(terms[t] for t in names))
    return freed * tokens


def loss_logit_bytes(model: ModelSpec, settings: MemorySettings = PLAIN) -> tuple[int, int]:
    """Bytes per logit the loss keeps: (saved for the backward, per micro-batch and depth; alive
    once at the peak, beside the saved ones), following megatron-core 0.16.1's kernels as
    ``models/common/language_module/language_module.py:compute_language_model_loss`` picks them.

    - unfused (``tensor_parallel/cross_entropy.py``, ``_VocabParallelCrossEntropy``):
      ``calculate_logits_max`` copies the bf16 logits to fp32 with ``.float()``, and the shift,
      ``exp`` and normalisation run in place on that copy, which is saved as the softmax (4).
      Alive beside it: the bf16 logits while the forward runs (2), or in the backward the bf16
      gradient autograd casts the fp32 one to (2); with MTP, ``gpt_model.py:_postprocess``
      still binds the last depth's bf16 logits (``mtp_logits``) while the main loss runs (+2).
    - ``--cross-entropy-loss-fusion`` native (``fusions/fused_cross_entropy.py``): the same
      steps under ``jit_fuser`` (``torch.compile``); ``calculate_gradients`` updates the saved
      softmax with an indexed subtraction that inductor compiles to a fresh fp32 buffer (4),
      beside the bf16 gradient it returns (2): the larger transient.
    - ``--cross-entropy-fusion-impl te`` (TE's ``parallel_cross_entropy``): its Triton kernels
      read the bf16 logits, save them (2) and write the gradient into them: nothing beside.
    """
    mtp = 2 if model.mtp_num_layers else 0
    if settings.cross_entropy == "te":
        return WEIGHT_BYTES, 0
    if settings.cross_entropy == "native":
        return LOGIT_BYTES, LOGIT_BYTES + WEIGHT_BYTES  # the backward's, above the forward's
    return LOGIT_BYTES, WEIGHT_BYTES + mtp


def _logits_per_depth(model: ModelSpec, parallel: ParallelConfig) -> float:
    """Logits of one micro-batch and one depth on one GPU of the last rank."""
    return model.padded_vocab_size(parallel.tp) * _tokens_per_gpu(model, parallel)


def loss_transient_bytes(
    model: ModelSpec, parallel: ParallelConfig, settings: MemorySettings = PLAIN
) -> float:
    """What the loss of the depth being computed adds beside the saved logits
    (:func:`loss_logit_bytes`): once on the last rank, not per micro-batch held."""
    return loss_logit_bytes(model, settings)[1] * _logits_per_depth(model, parallel)


def logits_bytes(
    model: ModelSpec, parallel: ParallelConfig, settings: MemorySettings = PLAIN
) -> float:
    """The logits one micro-batch saves for its backward on one GPU of the last rank, for
    every MTP depth + 1 (:func:`loss_logit_bytes`)."""
    saved = loss_logit_bytes(model, settings)[0]
    return saved * _logits_per_depth(model, parallel) * (model.mtp_num_layers + 1)


def static_bytes(
    params: Params, parallel: ParallelConfig, settings: MemorySettings = PLAIN, fp8: bool = False
) -> StaticMemory:
    """Per-GPU weights, gradient buffer and optimizer state of ``params``.  The distributed
    optimizer shards its state over DP x CP for dense parameters and over the expert-data-parallel
    group for experts, within each of ``--num-distributed-optimizer-instances``
    (``distributed/distributed_data_parallel.py``: the intra-instance groups);
    ``--optimizer-cpu-offload`` keeps ``--optimizer-offload-fraction`` of it on the CPU
    (``cpu_offloading/hybrid_optimizer.py``); ``fp8`` (a decoder or MTP layer under
    ``--fp8-param-gather``) stores its linear weights in one byte instead of bf16's two."""
    dense, expert, eligible = gpu_params(params, parallel)
    weights = WEIGHT_BYTES * (dense + expert) - (
        eligible if fp8 and settings.fp8_param_gather else 0
    )
    if parallel.use_distributed_optimizer:
        instances = settings.optimizer_instances
        dense_shards = max(parallel.dp * parallel.cp // instances, 1)
        expert_shards = max(parallel.expert_dp // instances, 1)
        state = dense / dense_shards + expert / expert_shards
    else:
        state = dense + expert
    optimizer = (
        settings.optimizer_bytes_per_param * state * (1 - settings.optimizer_offload_fraction)
    )
    return StaticMemory(
        weights=weights,
        gradients=settings.grad_bytes_per_param * (dense + expert),
        optimizer=optimizer,
    )


def stage_memory(
    model: ModelSpec,
    parallel: ParallelConfig,
    layout: Layout,
    costs: UnitCosts,
    in_flight: Sequence[Mapping[int, int]],
    settings: MemorySettings = PLAIN,
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
    kinds = {u for stage in units for u in stage}
    per_batch = {
        u: activation_bytes(model, parallel, u, settings) * scale.get(u, 1.0) for u in kinds
    }
    saving = {u: block_saving(model, parallel, u, settings) * scale.get(u, 1.0) for u in kinds}
    logits_per_batch = logits_bytes(model, parallel, settings) * scale.get(LOSS, 1.0)
    loss_transient = loss_transient_bytes(model, parallel, settings) * scale.get(LOSS, 1.0)
    sizes = unit_sizes(model, parallel.micro_batch_size, parallel.tp)
    fp8_saved = {  # --fp8-param-gather: a byte less for each eligible parameter, as static_bytes
        u: gpu_params(sizes[u].params, parallel)[2]
        for u in kinds
        if settings.fp8_param_gather and u in (*DECODER_UNITS, MTP)
    }
    transient = recompute_bytes(model, parallel, settings)
    memories = []
    for static, counts in zip(stage_sizes(model, parallel, layout.stages), in_flight, strict=True):
        chunks = enumerate(units[static.pp_rank :: layout.pp])
        held = [(counts.get(chunk, 0), stage) for chunk, stage in chunks]
        plain = static_bytes(static.params, parallel, settings)
        activations = 0.0
        for n, stage in held:
            layers = (u for u in stage if u in DECODER_UNITS)
            first = sorted(layers, key=lambda u: u != DENSE_DECODER)
            checkpointed = first[: settings.recompute_num_layers if any(saving.values()) else 0]
            kept = sum(per_batch[u] for u in stage) - sum(saving[u] for u in checkpointed)
            activations += n * kept
        memories.append(
            StageMemory(
                pp_rank=static.pp_rank,
                weights=plain.weights - sum(fp8_saved.get(u, 0.0) for s in held for u in s[1]),
                gradients=plain.gradients,
                optimizer=plain.optimizer,
                activations=activations + transient,
                logits=sum(
                    n * logits_per_batch + (n > 0) * loss_transient
                    for n, stage in held
                    if LOSS in stage
                ),
                overhead=costs.memory_overhead_gib * GIB,
            )
        )
    return memories


def fits(memories: Iterable[StageMemory], hbm_gib: float) -> bool:
    """Every rank's peak within ``hbm_gib`` GiB of device memory."""
    return all(memory.total_gib <= hbm_gib for memory in memories)
