"""Pai-Megatron-Patch (alibaba/Pai-Megatron-Patch @ a098ca5a): its entry points
(``examples/*/pretrain_*.py``) run megatron-core with the flags of
``megatron_patch/arguments.py`` added, and some build models of their own.

- The vocabulary is the HF tokenizer's in ``--load`` (``--patch-tokenizer-type``) plus
  ``--extra-vocab-size``, used as built: Megatron's padding is not applied
  (``megatron_patch/tokenizer/__init__.py`` sets ``padded_vocab_size``), unless
  ``--padded-vocab-size`` gives it.
- ``examples/deepseek_v2/pretrain_deepseek.py`` reads ``--moe-layer-freq N`` as "the first N
  layers dense" (``model/deepseek_v2/transformer_layer.py``: MoE where layer_number > N); the
  deepseek_v3 entry (megatron-core's specs) takes core's meaning, and Pai's scripts give it lists.
- ``examples/qwen2/pretrain_qwen2_moe.py`` gates its shared expert (``model/qwen2_moe``:
  ``use_shared_expert_gate=True``), and ``--enable-shared-expert
  --shared-moe-ffn-hidden-size F`` is the qwen1.5/qwen2 models' gated shared expert.
- ``--qk-nope-head-dim``/``--qk-rope-head-dim`` are read by Pai's HF converters only; its MLA is
  megatron-core's, sized by ``--qk-head-dim``/``--qk-pos-emb-head-dim``.
"""

from __future__ import annotations

from typing import Any

from ray_layout.errors import ConfigError
from ray_layout.model.dialects.dialect import Dialect, DialectReading, ReadContext, refuse
from ray_layout.model.dialects.flag import DialectFlag, passed, refused, sized
from ray_layout.options.checks import integer

NAME = "Pai-Megatron-Patch"


FLAGS: tuple[DialectFlag, ...] = (
    sized("--extra-vocab-size", "int", "vocabulary rows beyond the tokenizer's", default=0),
    sized("--patch-tokenizer-type", "str", "Pai's tokenizer, built from the HF one in --load"),
    sized("--padded-vocab-size", "int", "the vocabulary as built", marks=False),
    sized("--qk-nope-head-dim", "int", "read by Pai's HF converters (core: --qk-head-dim)",
          marks=False),
    sized("--qk-rope-head-dim", "int", "read by Pai's HF converters (core: --qk-pos-emb-head-dim)",
          marks=False),
    sized("--enable-shared-expert", "switch", "the qwen1.5/qwen2 models' gated shared expert"),
    sized("--shared-moe-ffn-hidden-size", "int", "that shared expert's FFN"),
    passed("--max-padding-length", "int", "padded sample length"),
    passed("--dataset", "str", "dataset kind"),
    passed("--train-mode", "str", "pretrain or finetune"),
    passed("--epochs", "int", "epochs"),
    passed("--keep-last", "switch", "data"),
    passed("--data-dir", "str", "data"),
    passed("--train-data", "strs", "data"),
    passed("--valid-data", "strs", "data"),
    passed("--dataset-config", "str", "data"),
    passed("--dataloader-save", "str", "data"),
    passed("--transformer-type", "str", "legacy transformer kind"),
    passed("--transformer-timers", "switch", "timers"),
    passed("--num-shared-experts", "int", "not read by Pai's models (see --shared-moe-ffn-...)"),
    passed("--optimizer-offload-policy", "str", "optimizer offload"),
    passed("--optimizer-offload-auto-threshold", "int", "optimizer offload"),
    passed("--optimizer-offload-chunk-size", "int", "optimizer offload"),
    passed("--cpu-offloading", "switch", "activation offload"),
    passed("--cpu-offloading-num-layers", "int", "activation offload"),
    passed("--rotary-scale-factor", "int", "RoPE scaling"),
    passed("--use-llama2-rotary-position-embeddings", "switch", "RoPE kind"),
    passed("--use-mistral-rotary-position-embeddings", "switch", "RoPE kind"),
    passed("--sliding-window", "int", "attention window", marks=False),
    passed("--z-loss-weight", "float", "loss"),
    passed("--disable-parallel-output", "switch", "output gathering"),
    passed("--use-te", "switch", "Transformer Engine"),
    passed("--special-tokens", "strs", "tokenizer"),
    refused("--n-head-kv", "int", "legacy models' key/value heads"),
    refused("--intermediate-size", "int", "legacy models' FFN"),
    refused("--use-normhead", "switch", "a normalised output head"),
    refused("--glu-activation", "str", "legacy models' GLU MLP"),
    refused("--attention-head-type", "str", "multi-query attention of legacy models"),
    refused("--embed-layernorm", "switch", "a norm after the embedding", marks=False),
    refused("--position-encoding-2d", "switch", "GLM's 2-D positions"),
    refused("--use-alibi-mask", "switch", "legacy models' ALiBi"),
    refused("--moe", "switch", "Pai's legacy MoE"),
    refused("--moe-topk", "int", "Pai's legacy MoE"),
    refused("--router-type", "str", "Pai's legacy MoE"),
    refused("--expert-interval", "int", "Pai's legacy MoE", marks=False),
    refused("--moe-expert-parallel-size", "int", "Pai's legacy MoE", marks=False),
    refused("--disable-bias-linear-fc", "switch", "legacy models' MLP biases"),
    refused("--disable-bias-attn-fc", "switch", "legacy models' attention biases"),
    refused("--vision-tower", "str", "a vision encoder"),
    refused("--vision-model-type", "str", "a vision encoder"),
    refused("--mm-projector-type", "str", "a vision projector"),
)  # fmt: skip

ENTRY_POINTS = (
    "pretrain_deepseek.py",
    "pretrain_qwen.py",
    "pretrain_qwen2_moe.py",
    "pretrain_qwen3_next.py",
    "pretrain_llama.py",
    "pretrain_mcore_mistral.py",
    "pretrain_mcore_qwen.py",
    "pretrain_mcore_llama.py",
)
_NOT_SIZED = {  # entry points whose models megatron-core's flags do not describe
    "pretrain_qwen3_next.py": "Qwen3-Next's gated DeltaNet layers",
}


def read(context: ReadContext) -> DialectReading:
    """The model a Pai entry point builds from its flags, as this project's fields."""
    parsed, source = context.parsed, context.source
    refuse(FLAGS, parsed, NAME, source)
    entry = context.entry_point.rsplit("/", 1)[-1]
    if entry in _NOT_SIZED:
        raise ConfigError(
            f"{source}: {entry} builds {_NOT_SIZED[entry]}, which this tool does not size"
        )
    values: dict[str, Any] = {}
    notes: list[str] = []
    if parsed.get("enable_shared_expert"):
        width = parsed.get("shared_moe_ffn_hidden_size")
        if not width:
            raise ConfigError(
                f"{source}: --enable-shared-expert needs --shared-moe-ffn-hidden-size"
            )
        values |= {"moe_shared_expert_intermediate_size": width, "moe_shared_expert_gate": True}
    elif entry == "pretrain_qwen2_moe.py" and parsed.get("moe_shared_expert_intermediate_size"):
        values["moe_shared_expert_gate"] = True
    values |= _deepseek_v2_layers(context, notes)
    notes += _mla_dims(parsed, source)
    vocabulary, vocab_notes = _vocabulary(context)
    return DialectReading(values=values | vocabulary, notes=(*notes, *vocab_notes))


def _deepseek_v2_layers(context: ReadContext, notes: list[str]) -> dict[str, Any]:
    """``--moe-layer-freq N`` (an integer) of Pai's deepseek_v2 entry: the first N layers dense.
    That entry builds MLA; an entry point this reader was not told is taken for it with MLA."""
    parsed, source, path = context.parsed, context.source, context.entry_point
    text, layers = parsed.get("moe_layer_freq"), parsed.get("num_layers")
    entry = path.rsplit("/", 1)[-1]
    v2 = entry == "pretrain_deepseek.py" and "deepseek_v3" not in path
    unknown = not path and parsed.get("multi_latent_attention")
    try:
        dense = integer(str(text).strip())  # None, a list expression: not this entry's form
    except ValueError:
        return {}
    if dense < 0 or not isinstance(layers, int):
        return {}
    if not (v2 or unknown) or not parsed.get("num_experts"):
        return {}
    where = "" if path else " (taken for it: a Pai MLA model with an integer frequency)"
    notes.append(
        f"{source}: --moe-layer-freq {dense}: Pai's deepseek_v2 pretrain_deepseek.py{where} builds "
        f"the first {dense} layer{'s' * (dense != 1)} dense and the rest MoE"
    )
    return {"moe_layer_freq": [int(i >= dense) for i in range(layers)]}


def _mla_dims(parsed: Any, source: str) -> list[str]:
    """Pai's MLA head-width flags, which its megatron-core model does not read: a note where they
    differ from the widths it builds."""
    notes = []
    for pai, core, default in (
        ("qk_nope_head_dim", "qk_head_dim", 128),
        ("qk_rope_head_dim", "qk_pos_emb_head_dim", 64),
    ):
        given, built = parsed.get(pai), parsed.get(core, default)
        if given is not None and given != built:
            notes.append(
                f"{source}: --{pai.replace('_', '-')} {given} is read by Pai's converters only: "
                f"megatron-core's MLA builds --{core.replace('_', '-')} {built}"
            )
    return notes


def _vocabulary(context: ReadContext) -> tuple[dict[str, Any], list[str]]:
    """--padded-vocab-size as built; else the tokenizer's vocabulary (our --vocab-size, or the
    script's taken for it) plus --extra-vocab-size, unpadded."""
    parsed, source = context.parsed, context.source
    tokenizer, extra = parsed.get("patch_tokenizer_type"), parsed.get("extra_vocab_size", 0)
    padded = parsed.get("padded_vocab_size")
    notes: list[str] = []
    if padded:
        vocab = padded
    elif tokenizer is None:
        return {}, []
    elif parsed.get("vocab_size") is None:
        raise ConfigError(
            f"{source}: give --vocab-size N: Pai's {tokenizer} is the HF tokenizer in --load "
            f"(the model has its N tokens + --extra-vocab-size {extra})"
        )
    else:
        vocab = parsed["vocab_size"] + extra
        if "vocab_size" not in context.given:
            notes.append(
                f"{source}: Pai's {tokenizer} reads the vocabulary from the tokenizer in --load; "
                f"the script's --vocab-size {parsed['vocab_size']} is taken as its (give "
                "--vocab-size N if it is not)"
            )
    tp = parsed.get("tensor_model_parallel_size", 1)
    if isinstance(tp, int) and tp > 0 and vocab % tp:
        raise ConfigError(
            f"{source}: Pai's vocabulary {vocab} (not padded) is not divisible by TP {tp}"
        )
    return {"vocab_size": vocab, "make_vocab_size_divisible_by": 1}, notes


PAI = Dialect(NAME, FLAGS, read, ENTRY_POINTS)
