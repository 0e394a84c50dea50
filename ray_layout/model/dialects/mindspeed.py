"""MindSpeed-LLM (Ascend/MindSpeed-LLM @ 98c60fa1, its ``pretrain_gpt.py`` on megatron-core): the
flags its parser adds (``mindspeed_llm/training/arguments.py``, ``features_manager/``) and what its
model code does with those that change the model.

- ``--first-k-dense-replace K --moe-layer-freq F`` with ``--num-experts``: layer i (0-based) is MoE
  when i >= K and i % F == 0 (``core/transformer/transformer_block.py``); without K, megatron-core's
  reading of ``--moe-layer-freq``.
- ``--n-shared-experts N``: a shared expert N x the routed experts' FFN wide, unless
  ``--moe-shared-expert-intermediate-size`` says otherwise
  (``features_manager/moe/shared_expert.py``).
- ``--noop-layers 1,5``: those layers are ``NoopTransformerLayer``s, no parameters, no compute.
- ``--tokenizer-type PretrainedFromHF``: the vocabulary is the HF tokenizer's, padded as Megatron
  pads, unless ``--padded-vocab-size`` gives it as built (``training/tokenizer/tokenizer.py``).
"""

from __future__ import annotations

from typing import Any

from ray_layout.errors import ConfigError, quoted
from ray_layout.model.dialects.dialect import Dialect, DialectReading, ReadContext, refuse
from ray_layout.model.dialects.flag import DialectFlag, passed, refused, sized
from ray_layout.options.checks import integer

NAME = "MindSpeed-LLM"


FLAGS: tuple[DialectFlag, ...] = (
    # Read: they change the model.
    sized("--noop-layers", "str", "comma-separated layers (0-based) built as no-ops"),
    sized("--first-k-dense-replace", "int", "the first K layers dense, MoE from layer K"),
    sized("--moe-layer-freq", "str", "with --first-k-dense-replace: every F-th layer MoE",
          marks=False),
    sized("--n-shared-experts", "int", "shared experts, each as wide as a routed expert"),
    sized("--moe-intermediate-size", "int", "deprecated --moe-ffn-hidden-size",
          dest="ms_moe_intermediate_size"),
    sized("--qk-nope-head-dim", "int", "deprecated --qk-head-dim", dest="ms_qk_nope_head_dim",
          marks=False),
    sized("--qk-rope-head-dim", "int", "deprecated --qk-pos-emb-head-dim",
          dest="ms_qk_rope_head_dim", marks=False),
    sized("--multi-head-latent-attention", "switch", "deprecated --multi-latent-attention",
          dest="ms_multi_head_latent_attention"),
    sized("--padded-vocab-size", "int", "the vocabulary as built, not padded further",
          marks=False),
    sized("--tokenizer-type", "str", "the tokenizer; PretrainedFromHF: the HF tokenizer's",
          marks=False),
    # Changes the model or its split in ways this tool does not model.
    sized("--num-layer-list", "str", "the layers of each pipeline stage (its split)"),
    refused("--embed-layernorm", "switch", "a norm after the embedding", marks=False),
    refused("--add-dense-bias", "switch", "biases on the dense MLPs only"),
    refused("--add-output-layer-bias", "switch", "a bias on the output layer"),
    refused("--geglu", "switch", "a gated GeLU MLP"),
    refused("--post-norm", "switch", "norms after attention and MLP"),
    refused("--no-post-layer-norm", "switch", "no final norm"),
    refused("--cla-share-factor", "int", "cross-layer attention sharing K/V"),
    refused("--shared-expert-gate", "switch", "a gate on the shared expert"),
    refused("--full-attention-interval", "int", "linear-attention layers (Qwen3-Next)"),
    refused("--enable-dsa-indexer", "switch", "DeepSeek sparse attention's indexer"),
    refused("--index-n-heads", "int", "the sparse-attention indexer's heads"),
    refused("--index-head-dim", "int", "the sparse-attention indexer's head width"),
    refused("--mamba-d-state", "int", "Mamba layers"),
    refused("--mamba-expand", "int", "Mamba layers"),
    refused("--lora-r", "int", "LoRA adapters"),
    refused("--qlora", "switch", "QLoRA adapters"),
    refused("--tp-2d", "switch", "2-D tensor parallelism"),
    # Passed on: no effect on the model's size (their names may speak of its shape).
    passed("--moe-tp-extend-ep", "switch", "experts over TP x EP, as ETP = TP shards them"),
    passed("--moe-token-dispatcher-type", "str", "MindSpeed's dispatchers (alltoall_seq too)",
          marks=False),
    passed("--moe-router-load-balancing-type", "strs", "MindSpeed's balancing losses too",
          marks=False),
    passed("--moe-permutation-async-comm", "switch", "asynchronous token permutation"),
    passed("--moe-device-level-aux-loss-coeff", "float", "DeepSeek-V2's device-level loss"),
    passed("--moe-comm-aux-loss-coeff", "float", "DeepSeek-V2's communication loss"),
    passed("--seq-aux", "switch", "sequence-level auxiliary loss"),
    passed("--moe-alltoall-overlap-comm", "switch", "all-to-all overlap"),
    passed("--moe-allgather-overlap-comm", "switch", "all-gather overlap"),
    passed("--moe-zero-memory", "str", "MoE activation memory saving"),
    passed("--moe-zero-memory-num-layers", "int", "layers of --moe-zero-memory"),
    passed("--moe-fb-overlap", "switch", "forward/backward overlap"),
    passed("--moe-unperm2-mem-optim", "switch", "unpermute memory saving"),
    passed("--moe-revert-type-after-topk", "switch", "router precision"),
    passed("--moe-train-capacity-factor", "float", "token capacity", marks=False),
    passed("--use-fused-rmsnorm", "switch", "fused kernel"),
    passed("--use-fused-swiglu", "switch", "fused kernel"),
    passed("--use-fused-rotary-pos-emb", "switch", "fused kernel"),
    passed("--use-fused-moe-token-permute-and-unpermute", "switch", "fused kernel"),
    passed("--reuse-fp32-param", "switch", "optimizer memory saving"),
    passed("--shape-order", "str", "attention layout"),
    passed("--context-parallel-algo", "str", "context-parallel algorithm"),
    passed("--no-shared-storage", "switch", "checkpoint storage"),
    passed("--output-layer-slice-num", "int", "output-layer GEMM slicing"),
    passed("--tokenizer-name-or-path", "str", "the HF tokenizer's folder"),
    passed("--tokenizer-not-use-fast", "switch", "slow HF tokenizer"),
    passed("--rope-scaling-type", "str", "RoPE scaling"),
    passed("--rope-scaling-factor", "float", "RoPE scaling"),
    passed("--rope-scaling-mscale", "float", "YaRN"),
    passed("--rope-scaling-mscale-all-dim", "float", "YaRN"),
    passed("--rope-scaling-original-max-position-embeddings", "int", "YaRN"),
    passed("--rope-scaling-beta-fast", "int", "YaRN"),
    passed("--rope-scaling-beta-slow", "int", "YaRN"),
    passed("--beta-fast", "int", "YaRN"),
    passed("--beta-slow", "int", "YaRN"),
    passed("--n-group", "int", "deprecated --moe-router-num-groups"),
    passed("--topk-group", "int", "deprecated --moe-router-group-topk"),
    passed("--routed-scaling-factor", "float", "deprecated --moe-router-topk-scaling-factor"),
    passed("--norm-topk-prob", "switch", "router normalisation"),
    passed("--mla-mm-split", "switch", "MLA kernel"),
    passed("--mla-fa-without-pad", "switch", "MLA kernel"),
    passed("--mla-up-proj-tp-overlap", "switch", "MLA overlap"),
    passed("--mla-zero-memory", "switch", "MLA memory saving"),
    passed("--mla-swap-core-attn-out", "switch", "MLA memory saving"),
    passed("--mla-fa-divide-qk", "switch", "MLA kernel"),
    passed("--recompute-mla-up-proj", "switch", "recompute"),
    passed("--padded-base-length", "int", "MLA padding"),
    passed("--kv-head-repeat-before-uly-alltoall", "switch", "Ulysses context parallelism"),
    passed("--dim-model-base", "float", "MiniCPM's logit scaling"),
    passed("--scale-emb", "float", "MiniCPM's embedding scaling"),
    passed("--scale-depth", "float", "MiniCPM's residual scaling"),
    passed("--embedding-multiplier-scale", "float", "embedding scaling"),
    passed("--input-embeds-norm", "switch", "embedding scaling"),
    passed("--input-layernorm-in-fp32", "switch", "norm precision"),
    passed("--original-max-position-embeddings", "float", "RoPE scaling"),
    passed("--sliding-window", "int", "attention window", marks=False),
    passed("--use-glm-rope", "switch", "GLM's RoPE"),
    passed("--mtp-mem-efficient-logits", "switch", "MTP memory saving"),
)  # fmt: skip

_PRETRAINED = "PretrainedFromHF"


def read(context: ReadContext) -> DialectReading:
    """The model MindSpeed-LLM builds from its flags, as this project's fields."""
    parsed, source = context.parsed, context.source
    refuse(FLAGS, parsed, NAME, source)
    values: dict[str, Any] = {}
    notes: list[str] = []
    aliases = {
        "ms_moe_intermediate_size": "moe_ffn_hidden_size",
        "ms_qk_nope_head_dim": "qk_head_dim",
        "ms_qk_rope_head_dim": "qk_pos_emb_head_dim",
        "ms_multi_head_latent_attention": "multi_latent_attention",
    }
    for alias, dest in aliases.items():  # deprecated_args.py: the old flag sets the new one
        if parsed.get(alias):
            values[dest] = parsed[alias]
    moe_ffn = values.get("moe_ffn_hidden_size", parsed.get("moe_ffn_hidden_size"))
    shared = parsed.get("n_shared_experts")
    if shared and not parsed.get("moe_shared_expert_intermediate_size"):
        width = moe_ffn or parsed.get("ffn_hidden_size")
        if width is None:
            raise ConfigError(f"{source}: --n-shared-experts needs --moe-ffn-hidden-size")
        values["moe_shared_expert_intermediate_size"] = shared * width
    values |= _moe_layers(parsed, source)
    split = _layer_list_split(context, notes)
    if split:
        values["pipeline_model_parallel_layout"] = split
    noop = parsed.get("noop_layers")
    if noop is not None:
        values["noop_layers"] = _layer_list(noop, source)
        notes.append(
            f"{source}: --noop-layers {noop}: {len(values['noop_layers'])} no-op layers, "
            "sized without parameters; the planner's unit costs count them as decoder layers"
        )
    vocabulary, vocab_notes = _vocabulary(context)
    values |= vocabulary
    notes += vocab_notes
    return DialectReading(values=values, notes=tuple(notes))


def _moe_layers(parsed: Any, source: str) -> dict[str, Any]:
    """The MoE pattern: transformer_block.py's rule where --first-k-dense-replace, the MoE
    frequency and experts are all set (non-zero), else megatron-core's --moe-layer-freq (an
    integer below 1 too, which core's parser takes and this project's would not)."""
    text = parsed.get("moe_layer_freq")
    first = parsed.get("first_k_dense_replace")
    layers, experts = parsed.get("num_layers"), parsed.get("num_experts")
    if first and not experts:
        raise ConfigError(f"{source}: --first-k-dense-replace is set without --num-experts")
    freq = 1 if text is None else _integer(text)  # megatron-core's default frequency
    if first and freq is None:
        raise ConfigError(
            f"{source}: --moe-layer-freq {quoted(text)} must be an integer with "
            "--first-k-dense-replace (MindSpeed-LLM takes layer % F)"
        )
    if not isinstance(layers, int) or not experts or not freq or (not first and freq >= 1):
        return {}  # megatron-core's reading, or nothing to read
    if first and first >= layers:
        raise ConfigError(
            f"{source}: --first-k-dense-replace {first} leaves no MoE layer of {layers}"
        )
    start = first or 0
    return {"moe_layer_freq": [int(i >= start and i % freq == 0) for i in range(layers)]}


def _layer_list_split(context: ReadContext, notes: list[str]) -> str | None:
    """``--num-layer-list 7,8,...``: the decoder layers of each pipeline stage, as a layout (the
    embedding on the first, MTP and the loss on the last); our --pp drops it, with a note."""
    parsed, source = context.parsed, context.source
    text = parsed.get("num_layer_list")
    if text is None:
        return None
    if "pipeline_model_parallel_size" in context.given:
        notes.append(f"{source}: --pp replaces the script's split (--num-layer-list {text})")
        return None
    counts = _layer_list(text, source, "--num-layer-list")
    pp, layers = parsed.get("pipeline_model_parallel_size", 1), parsed.get("num_layers")
    if len(counts) != pp or any(n < 0 for n in counts) or sum(counts) != layers:
        raise ConfigError(
            f"{source}: --num-layer-list {text} must give each of PP {pp} stages its layers, "
            f"{layers} in all"
        )
    stages = [f"t*{n}" if n > 1 else "t" * n for n in counts]
    stages[0] = "E" + stages[0]
    stages[-1] += "m" * (parsed.get("mtp_num_layers") or 0) + "L"
    return "|".join(stages)


def _integer(text: Any) -> int | None:
    """An integer --moe-layer-freq (negative too: ``-1`` makes every layer MoE), else None."""
    if isinstance(text, int):
        return text
    try:
        return integer(str(text).strip())
    except ValueError:
        return None


def _layer_list(text: str, source: str, flag: str = "--noop-layers") -> list[int]:
    """``--noop-layers 1,5``: numbers, comma-separated, as arguments.py splits them."""
    try:
        return [integer(part.strip()) for part in str(text).split(",")]
    except ValueError:
        raise ConfigError(
            f"{source}: {flag} must be comma-separated numbers, got {quoted(text)}"
        ) from None


def _vocabulary(context: ReadContext) -> tuple[dict[str, Any], list[str]]:
    """PretrainedFromHF: --padded-vocab-size as built; else the vocabulary given on our command
    line, or the script's --vocab-size taken for the tokenizer's, padded as Megatron pads.  Other
    tokenizers: Megatron's own padding (its build_tokenizer overwrites --padded-vocab-size)."""
    parsed, source = context.parsed, context.source
    tokenizer = parsed.get("tokenizer_type")  # MindSpeed's own choices: its parser judges them
    padded = parsed.get("padded_vocab_size")
    if tokenizer != _PRETRAINED:  # Megatron's build_tokenizer pads the tokenizer's itself
        return {}, []
    if padded is not None:
        notes = []
        if "vocab_size" in context.given:
            notes.append(f"{source}: --vocab-size is not used: --padded-vocab-size {padded} is")
        return {"vocab_size": padded, "make_vocab_size_divisible_by": 1}, notes
    if "vocab_size" in context.given or parsed.get("vocab_size") is None:
        return {}, []
    return {}, [
        f"{source}: MindSpeed-LLM reads the vocabulary from the HF tokenizer "
        f"(PretrainedFromHF), not from --vocab-size: the script's {parsed['vocab_size']} is taken "
        "as the tokenizer's (give --vocab-size N if it is not)"
    ]


MINDSPEED = Dialect(
    NAME, FLAGS, read, marking_values=(("--tokenizer-type", lambda v: v == [_PRETRAINED]),)
)
