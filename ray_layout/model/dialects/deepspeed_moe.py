"""Megatron-DeepSpeed's MoE (microsoft/Megatron-DeepSpeed @ f4157bea, ``megatron/arguments.py``;
the MoE layer is DeepSpeed's ``deepspeed.moe.layer.MoE``, whose expert-parallel and
expert-data-parallel groups ``deepspeed.initialize()`` attaches).

- ``--num-experts`` is a list: one count for every MoE layer, or one per MoE layer; a count of 1 is
  a dense layer.  ``--expert-interval N`` (default 2) makes layers N, 2N, ... (1-based) the MoE
  slots (``transformer.py: get_num_experts_per_layer``): top-1 experts on every other layer by
  default, not megatron-core's top-2 on every layer.
- ``--topk`` (default 1) experts per token; ``--moe-expert-parallel-size`` the EP size; experts are
  the dense MLP's shape (``ParallelMLP(moe=True)``), whole on every TP rank unless
  ``--enable-expert-tensor-parallelism``.
- ``--mlp-type residual``: PR-MoE, the expert-shaped MLP beside the experts and a learned
  ``Linear(h, 2)`` that mixes the two (``deepspeed/moe/layer.py``).
- ``--num-experts-teacher``/``--num-layers-teacher`` (``--mos``, ``--kd``): a teacher loaded for
  distillation, not trained.
- Megatron-DeepSpeed's own spellings of core's model flags: ``--num-key-value-heads``,
  ``--normalization layernorm|rmsnorm``, learned positions unless ``--no-position-embedding``
  (beside rotary ones with ``--use-rotary-position-embeddings``); its ``pretrain_gpt.py`` defaults
  the tokenizer to GPT2BPETokenizer.
"""

from __future__ import annotations

from typing import Any

from ray_layout.errors import ConfigError, quoted
from ray_layout.model.dialects.deepspeed_partition import (
    PARTITION_METHOD,
    deepspeed_layout,
    transformer_layers_per_stage,
)
from ray_layout.model.dialects.dialect import Dialect, DialectReading, ReadContext, refuse
from ray_layout.model.dialects.flag import DialectFlag, passed, refused, sized

NAME = "Megatron-DeepSpeed"


FLAGS: tuple[DialectFlag, ...] = (
    sized("--num-experts", "ints", "experts of every MoE layer, or of each", marks=False),
    sized("--expert-interval", "int", "MoE on every N-th layer (default 2)", default=2),
    sized("--topk", "int", "experts per token (default 1)", default=1),
    sized("--moe-expert-parallel-size", "int", "DeepSpeed's expert-parallel size"),
    sized("--mlp-type", "str", "residual: PR-MoE's dense MLP beside the experts",
          choices=("standard", "residual")),
    sized("--moe-train-capacity-factor", "float", "tokens per expert in training, x top-k/E",
          marks=False),
    sized("--moe-eval-capacity-factor", "float", "tokens per expert in evaluation"),
    sized("--moe-min-capacity", "int", "the least tokens per expert"),
    sized("--num-experts-teacher", "ints", "the distillation teacher's experts (not trained)"),
    sized("--num-layers-teacher", "int", "the distillation teacher's layers (not trained)"),
    sized("--hidden-size-teacher", "int", "the distillation teacher's hidden size"),
    sized("--num-attention-heads-teacher", "int", "the distillation teacher's heads"),
    sized("--load-teacher", "str", "the distillation teacher's checkpoint"),
    sized("--mos", "switch", "Mixture-of-Students distillation"),
    sized("--kd", "switch", "knowledge distillation"),
    sized("--num-key-value-heads", "int", "GQA's key/value heads (core: --num-query-groups)"),
    sized("--normalization", "str", "layernorm or rmsnorm", choices=("layernorm", "rmsnorm"),
          marks=False),
    sized("--deepspeed", "switch", "DeepSpeed's engine (ZeRO, its pipeline engine)"),
    sized("--deepspeed_config", "str", "DeepSpeed's JSON config (ZeRO stage, batch)"),
    sized("--no-pipeline-parallel", "switch", "no DeepSpeed pipeline engine: PP 1"),
    refused("--enable-expert-tensor-parallelism", "switch", "experts split by TP"),
    refused("--num-experts-switch", "int", "Megatron-LM's legacy SwitchMLP experts"),
    refused("--standalone-embedding-stage", "switch", "a pipeline stage of the embedding alone"),
    refused("--retro-add-retriever", "switch", "RETRO's retriever encoder"),
    refused("--retro-encoder-layers", "int", "RETRO's retriever encoder"),
    passed("--kd-alpha-ce", "float", "distillation loss weight"),
    passed("--kd-beta-ce", "float", "distillation loss weight"),
    passed("--kd-temp", "float", "distillation temperature"),
    passed("--moe-loss-coeff", "float", "load-balancing loss weight"),
    passed("--create-moe-param-group", "switch", "experts' own optimizer group (ZeRO)"),
    passed("--disable-moe-token-dropping", "switch", "no capacity limit"),
    passed("--disable-moe-top2-2nd-expert-sampling", "switch", "top-2 routing"),
    passed("--use-tutel", "switch", "Tutel's MoE kernels"),
    passed("--deepscale", "switch", "DeepSpeed's old name"),
    passed("--deepscale_config", "str", "DeepSpeed's old name"),
    passed("--deepspeed-activation-checkpointing", "switch", "DeepSpeed's checkpointing"),
    passed("--partition-activations", "switch", "DeepSpeed's checkpointing"),
    passed("--contigious-checkpointing", "switch", "DeepSpeed's checkpointing"),
    passed("--checkpoint-in-cpu", "switch", "DeepSpeed's checkpointing"),
    passed("--synchronize-each-layer", "switch", "DeepSpeed's checkpointing"),
    passed("--profile-backward", "switch", "DeepSpeed's checkpointing"),
    passed("--checkpoint-num-layers", "int", "layers per activation checkpoint"),
    passed("--zero-stage", "int", "ZeRO's stage as the model code sees it"),
    passed("--zero-reduce-scatter", "switch", "ZeRO"),
    passed("--zero-contigious-gradients", "switch", "ZeRO"),
    passed("--remote-device", "str", "ZeRO-3 offload"),
    passed("--use-pin-memory", "switch", "ZeRO-3 offload"),
    passed("--cpu-optimizer", "switch", "DeepSpeed's CPU Adam"),
    passed("--cpu_torch_adam", "switch", "CPU Adam"),
    passed("--ds_fused_adam", "switch", "DeepSpeed's fused Adam"),
    passed("--data-impl", "str", "indexed dataset kind"),
    passed("--train-tokens", "int", "training length in tokens"),
    passed("--lr-decay-tokens", "int", "learning-rate schedule in tokens"),
    passed("--lr-warmup-tokens", "int", "learning-rate schedule in tokens"),
    passed("--log-batch-size-to-tensorboard", "switch", "logging"),
    passed("--log-optimizer-states-to-tensorboard", "switch", "logging"),
    passed("--layernorm-epsilon", "float", "core's --norm-epsilon"),
    passed("--rotary-position-embeddings-theta", "int", "core's --rotary-base"),
    passed("--embedding-weights-in-fp32", "switch", "embedding precision"),
    passed("--no-query-key-layer-scaling", "switch", "attention scaling"),
    passed("--disable-mem-efficient-ln", "switch", "LayerNorm kernel"),
    passed("--use-flash-attn-v2", "switch", "flash attention"),
    passed("--use-flash-attn-triton", "switch", "flash attention"),
    passed("--use-flash-attn-builder", "switch", "flash attention"),
    passed("--random-ltd", "switch", "random layer-token drop"),
    passed("--ds-sequence-parallel-size", "int", "Ulysses sequence parallelism"),
    passed("--force-ds-sequence-parallel", "switch", "Ulysses sequence parallelism"),
    passed("--enable-zbh1-pipeline", "switch", "zero-bubble schedule"),
    passed("--enable-zbh1-exact-semantics", "switch", "zero-bubble schedule"),
    passed("--fp8-e4m3", "switch", "fp8"),
    passed("--fp8-hybrid", "switch", "fp8"),
    passed("--universal-checkpoint", "switch", "checkpoint format"),
    passed("--no-load-lr-state", "switch", "checkpoint loading"),
    passed("--load-tag", "str", "checkpoint loading"),
    passed("--inference", "switch", "inference"),
    passed("--ds-inference", "switch", "inference"),
    passed("--kill-switch-file", "str", "exit trigger"),
    passed("--aml-data-download-path", "str", "data"),
    passed("--mmap-warmup", "switch", "data"),
    passed("--train-data-exact-num-epochs", "int", "data"),
    passed("--return-data-index", "switch", "data"),
    passed("--data-efficiency-curriculum-learning", "switch", "data"),
    passed("--repeated-dataloader", "switch", "data"),
    passed("--reset-iteration", "switch", "training state"),
    passed("--DDP-impl", "str", "data-parallel wrapper"),
    passed("--no-contiguous-buffers-in-local-ddp", "switch", "data-parallel wrapper"),
)  # fmt: skip

_NORMS = {"layernorm": "LayerNorm", "rmsnorm": "RMSNorm"}
_TOKENIZER = "GPT2BPETokenizer"  # pretrain_gpt.py's args_defaults


def read(context: ReadContext) -> DialectReading:
    """The model Megatron-DeepSpeed builds, its DeepSpeed-MoE groups, and the notes its user
    should hear: the ZeRO stage not read, the teacher not trained, the pipeline engine's split."""
    parsed, source = context.parsed, context.source
    refuse(FLAGS, parsed, NAME, source)
    values: dict[str, Any] = {"moe_block": "deepspeed"}
    notes: list[str] = []
    if "num_key_value_heads" in parsed:
        values["num_query_groups"] = parsed["num_key_value_heads"]
        values["group_query_attention"] = True
    if "normalization" in parsed:
        values["normalization"] = _NORMS[parsed["normalization"]]
    values["position_embedding_type"] = _positions(parsed)
    values.setdefault("tokenizer_type", parsed.get("tokenizer_type") or _TOKENIZER)
    parallel: dict[str, Any] = {"expert_groups": "deepspeed", "etp": 1}
    values |= _experts(parsed, context.given, source, parallel)
    if parsed.get("deepspeed"):
        parallel["use_distributed_optimizer"] = True  # ZeRO (stage >= 1) shards optimizer state
    split = _split(context, bool(values.get("num_experts")))
    if split is not None:
        values["pipeline_model_parallel_layout"], line = split
        notes.append(line)
    notes += _engine_notes(parsed, values, source)
    notes += _teacher_notes(parsed, source)
    return DialectReading(values=values, parallel=parallel, notes=tuple(notes))


def _positions(parsed: Any) -> str:
    """Learned absolute positions unless --no-position-embedding (also beside rotary ones:
    language_model.py builds both); rotary alone, or none."""
    if parsed.get("add_position_embedding", True):
        return "learned_absolute"
    return "rope" if parsed.get("use_rotary_position_embeddings") else "none"


def _experts(
    parsed: Any, given: frozenset[str], source: str, parallel: dict[str, Any]
) -> dict[str, Any]:
    """Which layers are MoE with how many experts (get_num_experts_per_layer's rule), and the
    expert-parallel size."""
    counts = parsed.get("num_experts") or [1]
    counts = counts if isinstance(counts, list) else [counts]
    interval = parsed.get("expert_interval", 2)
    layers = parsed.get("num_layers")
    if not all(isinstance(c, int) for c in counts):  # a word the job's environment gives
        shown = " ".join(map(str, counts))
        raise ConfigError(f"{source}: --num-experts {shown}: a count is not known here (--env)")
    if not isinstance(layers, int):
        return {}  # _recipe names what is missing or unknown
    if interval < 1:
        raise ConfigError(f"{source}: --expert-interval must be >= 1, got {interval}")
    slots = layers // interval
    if len(counts) not in (1, slots):
        raise ConfigError(
            f"{source}: --num-experts has {len(counts)} values; Megatron-DeepSpeed takes one or "
            f"one per MoE layer: {slots} ({layers} layers, every {interval}-th)"
        )
    if any(c < 1 for c in counts):
        raise ConfigError(f"{source}: --num-experts must be >= 1, got {quoted(counts)}")
    per_slot = counts * slots if len(counts) == 1 else counts
    experts = [per_slot[i // interval] if (i + 1) % interval == 0 else 1 for i in range(layers)]
    moe = [n > 1 for n in experts]  # transformer.py: num_experts <= 1 is a dense MLP
    ours = "expert_model_parallel_size" in given  # our --ep replaces the script's
    ep = parsed.get("expert_model_parallel_size" if ours else "moe_expert_parallel_size", 1)
    parallel["ep"] = ep
    if not any(moe):
        return {"num_experts": 0}
    uneven = sorted({n for n in experts if n > 1 and isinstance(ep, int) and n % ep})
    if uneven:
        raise ConfigError(
            f"{source}: MoE layers of {uneven[0]} experts on expert-parallel size {ep}: "
            "DeepSpeed's MoE layer asserts the experts divide by it (deepspeed/moe/layer.py); "
            "give --ep N"
        )
    return {
        "num_experts": max(experts),
        "moe_layer_experts": [n for n in experts if n > 1],
        "moe_layer_freq": [int(m) for m in moe],
        "moe_router_topk": parsed.get("topk", 1),
        "moe_ffn_hidden_size": parsed.get("ffn_hidden_size"),
        "moe_residual": parsed.get("mlp_type") == "residual",
    }


def _split(context: ReadContext, moe: bool) -> tuple[str, str] | None:
    """(the layout the job runs, the line that says who split it) with PP > 1."""
    parsed, source = context.parsed, context.source
    pp, layers = parsed.get("pipeline_model_parallel_size", 1), parsed.get("num_layers")
    if not isinstance(pp, int) or not isinstance(layers, int) or pp <= 1:
        return None
    off = parsed.get("no_pipeline_parallel")
    if off and "pipeline_model_parallel_size" not in context.given:
        raise ConfigError(f"{source}: --no-pipeline-parallel needs PP 1 (arguments.py), got {pp}")
    engine = bool(parsed.get("deepspeed"))
    if not engine and layers % pp:
        raise ConfigError(
            f"{source}: Megatron-DeepSpeed splits {layers} layers evenly: not over PP {pp}"
        )
    layout, rule = deepspeed_split(layers, pp, moe, engine)
    return layout, f"{source}: {NAME} takes no layout flag: {rule}: {layout}"


def _engine_notes(parsed: Any, values: dict[str, Any], source: str) -> list[str]:
    """What DeepSpeed's engine decides and this tool does not read from the command line."""
    notes = []
    if parsed.get("deepspeed"):
        config = parsed.get("deepspeed_config") or "its JSON config"
        notes.append(
            f"{source}: ZeRO's stage is in the DeepSpeed config ({config}), which is not read: "
            "memory shards the optimizer state as ZeRO-1 does (dense over DP, experts over "
            "expert-DP = DP / EP); ZeRO-2 and 3 shard more"
        )
    factor = parsed.get("moe_train_capacity_factor", 1.0)
    if values.get("num_experts") and factor != 1.0:
        notes.append(
            f"{source}: --moe-train-capacity-factor {factor:g}: FLOPs count top-k tokens per "
            "expert (capacity factor 1)"
        )
    return notes


def _teacher_notes(parsed: Any, source: str) -> list[str]:
    """MoS/KD: the teacher runs forward each step but is neither trained nor sized."""
    if not (parsed.get("mos") or parsed.get("kd")) and "num_layers_teacher" not in parsed:
        return []
    layers = parsed.get("num_layers_teacher", "?")
    experts = parsed.get("num_experts_teacher")
    shape = f"{layers} layers" + (f", experts {' '.join(map(str, experts))}" if experts else "")
    return [
        f"{source}: the distillation teacher ({shape}) is loaded and run forward, not trained: "
        "it is not in the sizes, and its forward is not in the step's FLOPs"
    ]


def deepspeed_split(num_layers: int, pp: int, moe: bool, engine: bool) -> tuple[str, str]:
    """(the layout the job runs, one line saying who splits it): DeepSpeed's pipeline engine
    (GPTModelPipe, under --deepspeed) by its partition method, or Megatron-DeepSpeed's own even
    split without it."""
    counts, rule = stage_layers(num_layers, pp, moe, engine)
    return deepspeed_layout(counts), rule


def stage_layers(num_layers: int, pp: int, moe: bool, engine: bool) -> tuple[list[int], str]:
    """(the decoder layers of each pipeline stage, who decides them)."""
    if engine:
        rule = (
            "DeepSpeed's pipeline engine splits the layers by its partition_method "
            f"'{PARTITION_METHOD}' (GPTModelPipe)"
        )
        return transformer_layers_per_stage(num_layers, pp, moe), rule
    return [num_layers // pp] * pp, "its own pipeline splits the layers evenly"


def plan_line(num_layers: int, pp: int, moe: bool, megatron_args: tuple[str, ...]) -> str:
    """What a layout search says of a Megatron-DeepSpeed job instead of planning a layout it
    cannot take: who splits the layers, and how many each stage gets."""
    counts, rule = stage_layers(num_layers, pp, moe, "--deepspeed" in megatron_args)
    if pp == 1:
        rule = "with PP 1 one stage holds every layer"
    layers = ", ".join(map(str, counts))
    return f"{NAME} takes no --pipeline-model-parallel-layout: {rule}; layers per stage: {layers}"


DEEPSPEED_MOE = Dialect(
    NAME, FLAGS, read, marking_values=(("--num-experts", lambda v: len(v) > 1),)
)
