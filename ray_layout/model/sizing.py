"""Parameters, FLOPs and memory of each layout unit: E, t (dense / MoE), m and L.

Counts follow the modules megatron-core builds (checked against an instantiated ``GPTModel`` in
tests); FLOPs follow ``training.py:num_floating_point_operations`` split per unit, so that the
units of a whole model add up to Megatron's own figure (but for ``--quick-geglu``, which that
formula counts as ungated and which is gated: every ``gated`` below is ``gated_linear_unit``).
Memory is the static part (weights, gradients, optimizer state) with Megatron's EP-aware
accounting; activations belong to the schedule and live in ``search/memory.py``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ray_layout.model.fields import ModelSpec
from ray_layout.model.layout import DECODER, EMBEDDING, LOSS, MTP
from ray_layout.model.spec import ParallelConfig

WEIGHT_BYTES = 2  # bf16 parameters
GIB = 2**30  # bytes in a GiB: every memory figure ray_layout shows is in GiB
GRAD_BYTES = 4  # fp32 main gradients
OPTIMIZER_BYTES = 12  # fp32 master copy + Adam's two moments

DENSE_DECODER, MOE_DECODER = "t_dense", "t_moe"  # a decoder layer of each kind, where they differ
DECODER_UNITS = (DECODER, DENSE_DECODER, MOE_DECODER)  # the units that are one decoder layer


@dataclass(frozen=True)
class Params:
    """Parameter counts split by how Megatron shards them."""

    tp_sharded: int = 0  # split across tensor-parallel ranks (linear weights, embeddings)
    replicated: int = 0  # copied on every TP rank (norms, router, row-parallel biases)
    expert: int = 0  # routed-expert weights, split across EP x ETP
    active_expert: int = 0  # the routed-expert weights one token uses (top-k of them)

    @property
    def total(self) -> int:
        return self.tp_sharded + self.replicated + self.expert

    @property
    def active(self) -> int:
        return self.tp_sharded + self.replicated + self.active_expert

    def __add__(self, other: Params) -> Params:
        return Params(
            self.tp_sharded + other.tp_sharded,
            self.replicated + other.replicated,
            self.expert + other.expert,
            self.active_expert + other.active_expert,
        )


@dataclass(frozen=True)
class UnitSize:
    """One layout unit: its parameters and forward FLOPs per micro-batch."""

    unit: str
    params: Params
    forward_flops: float

    @property
    def training_flops(self) -> float:
        """Forward, backward data-gradient and weight-gradient GEMMs: three forwards' worth."""
        return 3 * self.forward_flops


def _norm(model: ModelSpec, width: int) -> int:
    return width * (2 if model.normalization == "LayerNorm" else 1)


def _linear(model: ModelSpec, fan_in: int, fan_out: int) -> tuple[int, int]:
    """(weight, bias) parameter counts of a Megatron linear layer."""
    return fan_in * fan_out, fan_out if model.add_bias_linear else 0


def _mlp(model: ModelSpec, hidden: int, ffn: int) -> Params:
    gated = 2 if model.gated_linear_unit else 1
    fc1_weight, fc1_bias = _linear(model, hidden, gated * ffn)
    fc2_weight, fc2_bias = _linear(model, ffn, hidden)
    return Params(tp_sharded=fc1_weight + fc1_bias + fc2_weight, replicated=fc2_bias)


def attention_params(model: ModelSpec) -> Params:
    """Self-attention of one layer, without its input norm."""
    h, heads = model.hidden_size, model.num_attention_heads
    if model.mla is not None:
        mla = model.mla
        q_width = heads * (mla.qk_head_dim + mla.qk_pos_emb_head_dim)
        # The norms on the compressed q and kv exist only under qk_layernorm: Megatron's MLA
        # specs build them (or fuse them into the up-projections) under that switch alone.
        if mla.q_lora_rank:
            q_params = h * mla.q_lora_rank + mla.q_lora_rank * q_width
            q_norm = _norm(model, mla.q_lora_rank) if model.qk_layernorm else 0
        else:
            q_params, q_norm = h * q_width, 0
        kv_norm = _norm(model, mla.kv_lora_rank) if model.qk_layernorm else 0
        kv_down = h * (mla.kv_lora_rank + mla.qk_pos_emb_head_dim)
        kv_up = mla.kv_lora_rank * heads * (mla.qk_head_dim + mla.v_head_dim)
        proj_weight, proj_bias = _linear(model, heads * mla.v_head_dim, h)
        return Params(
            tp_sharded=q_params + kv_down + kv_up + proj_weight + _sinks(model),
            replicated=q_norm + kv_norm + proj_bias,
        )
    q = model.kv_channels * heads
    kv = model.kv_channels * model.num_query_groups
    qkv_bias = q + 2 * kv if (model.add_bias_linear or model.add_qkv_bias) else 0
    proj_weight, proj_bias = _linear(model, q, h)
    qk_norms = 2 * _norm(model, model.kv_channels) if model.qk_layernorm else 0
    return Params(
        tp_sharded=h * (q + 2 * kv) + qkv_bias + proj_weight + _sinks(model),
        replicated=proj_bias + qk_norms,
    )


def _sinks(model: ModelSpec) -> int:
    """``--softmax-type learnable`` (attention sinks): core attention's one offset per head, split
    by TP with the heads."""
    return model.num_attention_heads if model.softmax_type == "learnable" else 0


def decoder_layer_params(model: ModelSpec, moe: bool, experts: int | None = None) -> Params:
    """One transformer layer: input norm, attention, pre-MLP norm, MLP or MoE block (of
    ``experts`` routed experts: num_experts unless given)."""
    h = model.hidden_size
    norms = Params(replicated=2 * _norm(model, h))
    if not moe:
        return norms + attention_params(model) + _mlp(model, h, model.ffn_hidden_size)
    return norms + attention_params(model) + moe_block_params(model, experts)


def moe_block_params(model: ModelSpec, experts: int | None = None) -> Params:
    """The MoE block of one layer: router, routed experts, shared expert (and its gate), or
    DeepSpeed-MoE's PR-MoE residual MLP."""
    h = model.hidden_size
    count = model.num_experts if experts is None else experts
    expert = _mlp(model, h, model.moe_ffn_hidden_size)
    routed = Params(expert=expert.total * count, active_expert=expert.total * model.moe_router_topk)
    if model.moe_block == "deepspeed":
        # deepspeed.moe: TopKGate's Linear(h, E) has no bias; PR-MoE keeps the expert-shaped MLP
        # beside them and a Linear(h, 2) that mixes the two; neither is split by TP
        # (Megatron-DeepSpeed builds them as experts: ParallelMLP(moe=True)).
        gate = Params(replicated=count * h)
        residual = Params(replicated=expert.total + 2 * h + 2) if model.moe_residual else Params()
        return gate + routed + residual
    # The router's bias exists under --add-bias-linear (megatron-core's TopKRouter).
    router = Params(replicated=count * (h + model.add_bias_linear))
    shared = Params()
    if model.moe_shared_expert_intermediate_size:
        shared = _mlp(model, h, model.moe_shared_expert_intermediate_size)
        # SharedExpertMLP's gate_weight, (1, h), under --moe-shared-expert-gate.
        shared = shared + Params(replicated=h * model.moe_shared_expert_gate)
    return router + shared + routed


def layer_params(model: ModelSpec) -> list[Params]:
    """Each decoder layer's parameters in order: its kind, its own expert count (DeepSpeed's
    pyramid), nothing for a MindSpeed no-op layer."""
    cache: dict[int, Params] = {}  # by expert count, 0 for a dense layer
    noop = set(model.noop_layers)
    out = []
    for index, experts in enumerate(model.experts_per_layer):
        if index in noop:
            out.append(Params())
            continue
        if experts not in cache:
            cache[experts] = decoder_layer_params(model, bool(experts), experts or None)
        out.append(cache[experts])
    return out


def attention_flops_per_token(model: ModelSpec) -> float:
    """Forward FLOPs of one attention layer per token (Megatron's causal accounting)."""
    h, heads, s = model.hidden_size, model.num_attention_heads, model.seq_length
    if model.mla is not None:
        mla = model.mla
        qk_width = heads * (mla.qk_head_dim + mla.qk_pos_emb_head_dim)
        q_term = mla.q_lora_rank * (h + qk_width + 1) if mla.q_lora_rank else h * qk_width
        kv_term = mla.kv_lora_rank * (h + heads * (mla.qk_head_dim + mla.v_head_dim) + 1)
        terms = (
            q_term
            + kv_term
            + h * mla.qk_pos_emb_head_dim
            + heads * mla.v_head_dim * h
            + s * qk_width / 2
            + s * heads * mla.v_head_dim / 2
        )
        return 2 * terms
    q = model.kv_channels * heads
    kv = model.kv_channels * model.num_query_groups
    return 2 * (h * (q + 2 * kv) + q * s + q * h)


def mlp_flops_per_token(model: ModelSpec, moe: bool) -> float:
    # Megatron's own formula reads args.swiglu and so counts --quick-geglu as ungated; it is gated.
    gated = 3 if model.gated_linear_unit else 2
    if not moe:
        return 2 * model.hidden_size * model.ffn_hidden_size * gated
    ffn = (
        model.moe_ffn_hidden_size * (model.moe_router_topk + model.moe_residual)
        + model.moe_shared_expert_intermediate_size
    )
    return 2 * model.hidden_size * ffn * gated


def decoder_flops_per_token(model: ModelSpec, moe: bool) -> float:
    return attention_flops_per_token(model) + mlp_flops_per_token(model, moe)


def unit_sizes(model: ModelSpec, micro_batch_size: int = 1, tp: int = 1) -> dict[str, UnitSize]:
    """Every unit the model has, keyed by its name.

    Decoder layers are one unit ``t`` when all layers are alike, else ``t_dense`` and ``t_moe``.
    ``L`` is the output layer + loss, counted as built on the last stage: with tied embeddings
    and PP > 1 that stage holds its own copy of the embedding matrix.
    """
    h = model.hidden_size
    vocab = model.padded_vocab_size(tp)
    tokens = micro_batch_size * model.seq_length
    sizes: dict[str, UnitSize] = {}
    # Learned positions are a plain torch Embedding, whole on every TP rank (the vocabulary is
    # split): Megatron's "number of parameters on (tensor, pipeline) model parallel rank" counts
    # them on each.
    positions = model.max_position_embeddings * h
    embedding = Params(tp_sharded=vocab * h, replicated=positions)
    sizes[EMBEDDING] = UnitSize(EMBEDDING, embedding, 0.0)
    kinds = sorted(set(model.moe_layer_pattern), reverse=True)
    for moe in kinds:
        name = DECODER if len(kinds) == 1 else (MOE_DECODER if moe else DENSE_DECODER)
        sizes[name] = UnitSize(
            name,
            decoder_layer_params(model, moe),
            tokens * decoder_flops_per_token(model, moe),
        )
    if model.mtp_num_layers:
        mtp_glue = Params(tp_sharded=2 * h * h, replicated=3 * _norm(model, h))
        sizes[MTP] = UnitSize(
            MTP,
            decoder_layer_params(model, model.mtp_layer_is_moe) + mtp_glue,
            tokens
            * (decoder_flops_per_token(model, model.mtp_layer_is_moe) + 2 * (3 * h + 2 * h * h)),
        )
    sizes[LOSS] = UnitSize(
        LOSS,
        Params(tp_sharded=vocab * h),
        tokens * 2 * h * vocab * (model.mtp_num_layers + 1),
    )
    return sizes


def layer_units(model: ModelSpec) -> dict[str, bool]:
    """The model's units that are one decoder layer (MTP's too), each with whether it is MoE."""
    units = {decoder_unit(model, i): moe for i, moe in enumerate(model.moe_layer_pattern)}
    if model.mtp_num_layers:
        units[MTP] = model.mtp_layer_is_moe
    return units


def attention_share(model: ModelSpec, moe: bool) -> float:
    """Attention's share of one decoder layer's forward FLOPs (the rest is its MLP)."""
    attention = attention_flops_per_token(model)
    return attention / (attention + mlp_flops_per_token(model, moe))


def decoder_unit(model: ModelSpec, layer_index: int) -> str:
    """The unit name of decoder layer ``layer_index`` (0-based)."""
    if len(set(model.moe_layer_pattern)) == 1:
        return DECODER
    return MOE_DECODER if model.moe_layer_pattern[layer_index] else DENSE_DECODER


def final_norm_params(model: ModelSpec) -> Params:
    return Params(replicated=_norm(model, model.hidden_size))


@dataclass(frozen=True)
class ParameterCount:
    """Whole-model counts: a tied embedding counted once, an untied output layer counted, MTP
    layers apart (the handbook's 6.86B, DeepSeek-V3's 671B).

    Model cards count active parameters three ways, so all three are here, each by what it
    leaves out: ``active`` keeps the embedding and the output layer (Mixtral, Qwen, Llama 4),
    ``active_without_embedding_and_output`` leaves both out (DeepSeek, GLM, MiniMax), and
    ``active_without_input_embedding`` keeps the output layer alone (gpt-oss).  A tied matrix is
    the output layer there."""

    total: int  # embedding, decoder layers, final norm, untied output layer; no MTP
    active: int  # same, with only the top-k routed experts
    active_without_embedding_and_output: int
    active_without_input_embedding: int
    mtp: int  # all MTP layers together
    embedding: int  # the input embedding (and learned positions)
    output_layer: int  # 0 when tied to the embedding
    total_with_everything: int  # what a single-process megatron-core GPTModel holds


def parameter_count(model: ModelSpec) -> ParameterCount:
    sizes = unit_sizes(model)
    output = sizes[LOSS].params if model.untie_embeddings_and_output_weights else Params()
    embedding = sizes[EMBEDDING].params.total
    body = sizes[EMBEDDING].params + final_norm_params(model) + output
    for params in layer_params(model):
        body = body + params
    mtp = sizes[MTP].params.total * model.mtp_num_layers if model.mtp_num_layers else 0
    return ParameterCount(
        total=body.total,
        active=body.active,
        active_without_embedding_and_output=body.active - embedding - output.total,
        active_without_input_embedding=body.active - embedding * (output.total > 0),
        mtp=mtp,
        embedding=embedding,
        output_layer=output.total,
        total_with_everything=body.total + mtp,
    )


def training_flops_per_iteration(model: ModelSpec, global_batch_size: int) -> float:
    """Megatron's ``num_floating_point_operations`` for one iteration, from the unit sizes."""
    sizes = unit_sizes(model, micro_batch_size=global_batch_size)
    noop = set(model.noop_layers)
    flops = sum(
        sizes[decoder_unit(model, i)].training_flops
        for i in range(model.num_layers)
        if i not in noop
    )
    if model.mtp_num_layers:
        flops += sizes[MTP].training_flops * model.mtp_num_layers
    return flops + sizes[LOSS].training_flops


def gpu_params(params: Params, parallel: ParallelConfig) -> tuple[float, float, float]:
    """(dense, expert, fp8-eligible) parameters on one GPU: dense split by TP, experts by EP x
    ETP; the TP-split linear weights and the experts are what ``--fp8-param-gather`` keeps in
    fp8."""
    dense = params.tp_sharded / parallel.tp + params.replicated
    expert = params.expert / (parallel.ep * parallel.etp)
    return dense, expert, params.tp_sharded / parallel.tp + expert


def gpu_gigaparams(params: Params, parallel: ParallelConfig) -> float:
    """Billions of parameters one GPU holds (what its step tail syncs and updates), before any
    DP split of the distributed optimizer."""
    dense, expert, _ = gpu_params(params, parallel)
    return (dense + expert) / 1e9


@dataclass(frozen=True)
class StageSize:
    """What one pipeline rank holds, over all its virtual chunks."""

    pp_rank: int
    units: str  # the layout symbols of its chunks, chunks separated by '|'
    params: Params
    forward_flops: float
    gpu_gigaparams: float  # parameters one GPU of the rank holds, in billions


def stage_sizes(
    model: ModelSpec, parallel: ParallelConfig, stages: Iterable[str]
) -> list[StageSize]:
    """Sum unit sizes over each PP rank for a layout given as its flat list of stage strings
    (chunk-major, as Megatron's ``--pipeline-model-parallel-layout`` lists them).

    Besides the units themselves this places what Megatron builds implicitly: the decoder's final
    norm (with the last decoder layer when MTP is on, else with the loss) and, for a rank that
    holds MTP but not the loss (MTP standalone), its own copy of the embedding.
    """
    stages = list(stages)
    sizes = unit_sizes(model, parallel.micro_batch_size, parallel.tp)
    layers = layer_params(model)
    noop = set(model.noop_layers)
    pp = parallel.pp
    totals = [Params()] * pp
    flops = [0.0] * pp
    decoder_index = 0
    for flat_index, stage in enumerate(stages):
        rank = flat_index % pp
        for symbol in stage:
            if symbol == "t":
                index, decoder_index = decoder_index, decoder_index + 1
                if decoder_index == model.num_layers and model.mtp_num_layers:
                    totals[rank] = totals[rank] + final_norm_params(model)
                totals[rank] = totals[rank] + layers[index]
                if index not in noop:  # a no-op layer computes nothing
                    flops[rank] += sizes[decoder_unit(model, index)].forward_flops
                continue
            unit = sizes[symbol]
            if symbol == LOSS:
                tied_single_stage = pp == 1 and model.tied_embeddings
                if not model.mtp_num_layers:
                    totals[rank] = totals[rank] + final_norm_params(model)
                if tied_single_stage:
                    flops[rank] += unit.forward_flops
                    continue
            totals[rank] = totals[rank] + unit.params
            flops[rank] += unit.forward_flops
    for rank in range(pp):
        rank_symbols = "".join(stages[rank::pp])
        if MTP in rank_symbols and LOSS not in rank_symbols and EMBEDDING not in rank_symbols:
            totals[rank] = totals[rank] + sizes[EMBEDDING].params
    return [
        StageSize(
            pp_rank=rank,
            units="|".join(stages[rank::pp]),
            params=totals[rank],
            forward_flops=flops[rank],
            gpu_gigaparams=gpu_gigaparams(totals[rank], parallel),
        )
        for rank in range(pp)
    ]
