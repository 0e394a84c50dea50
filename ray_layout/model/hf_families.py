"""The MoE families of 2025-2026 in a Hugging Face ``config.json``: gpt-oss, Llama 4, MiniMax-M2.

Each reads onto Megatron's model fields as the older families do (:mod:`hf_config`), plus the
Megatron core_v0.16.1 flags that train it as released (gpt-oss's sliding window, sinks and
clamped GeGLU; Llama 4's NoPE layers, L2 QK norm and router applied to the expert input).

Where the tool or Megatron falls short of the released model, loading says so in one note
naming it; where megatron-core cannot build the model at all (MiniMax's lightning attention, a
gpt-oss without attention biases) it is a one-line error.  The facts behind each choice:

* gpt-oss: biases on q/k/v/o, the router and every expert (Megatron's ``--add-bias-linear``
  builds exactly these), one learnable sink per head (``--softmax-type learnable``), experts
  ``(up + 1) * quick_gelu(gate)`` with both halves clamped at ``swiglu_limit``
  (``--quick-geglu``, ``--glu-linear-offset 1.0``, ``--activation-func-clamp-value``), a
  sliding window of ``sliding_window`` tokens, self included, on the ``layer_types`` that say
  so (``--window-size W-1,0``, ``--window-attn-skip-freq``).
* Llama 4 (``llama4`` reads its ``text_config``): MoE on ``moe_layers`` (else every
  ``interleave_moe_layer_step``-th layer, the last of each step), a shared expert as wide as
  a routed one, dense layers of ``intermediate_size_mlp``, a parameter-free L2 norm on q and k,
  NoPE layers where ``no_rope_layers`` holds 0 (Megatron's ``--no-rope-freq`` marks them 1).
  transformers builds the L2 norm on the RoPE layers only; megatron-core's ``--qk-l2-norm``
  builds it on every layer, and its llama3 RoPE scaling fixes the frequency factors at 1 and 4
  (Scout's are 1 and 1): the note says where a file differs.
* MiniMax-M2: every layer MoE, sigmoid routing with a correction bias, QK norm, partial rotary
  (``rotary_dim`` of ``head_dim``).  Its ``num_mtp_modules`` MTP modules (``use_mtp``) are left
  out, as MiniMax left them out: the released checkpoint holds layers 0 to 61 and no MTP weights,
  transformers builds none, and the published 230B total is the model without them (with three
  MTP layers of Megatron's kind it would be 239.8B).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from ray_layout.errors import ConfigError, quoted
from ray_layout.model import hf_flags
from ray_layout.model.fields import MAX_LAYERS, ModelSpec
from ray_layout.model.hf_keys import (
    Family,
    Raw,
    boolean,
    experts,
    integer,
    layer_flags,
    layer_indices,
)

_SLIDING, _FULL = "sliding_attention", "full_attention"


def _pattern_flag(marked: Sequence[bool], every: int | None) -> str:
    """Megatron's per-layer pattern argument (``--window-attn-skip-freq``, ``--no-rope-freq``):
    ``every`` when the pattern is its own int form, else a list expression of runs."""
    if every is not None:
        return str(every)
    runs = [f"[{int(mark)}]*{len(list(run))}" for mark, run in itertools.groupby(marked)]
    return f"({'+'.join(runs)})"


def _every(marked: Sequence[bool], layer_is_marked: Any) -> int | None:
    """The N whose int form of a pattern (``layer_is_marked(number, N)``, 1-based) is ``marked``."""
    count = len(marked)
    for n in range(1, count + 1):
        if count % n == 0 and all(layer_is_marked(i + 1, n) == m for i, m in enumerate(marked)):
            return n
    return None


# gpt-oss


def _gpt_oss(raw: Raw, num_layers: int, source: str) -> dict[str, Any]:
    if not boolean(raw, "attention_bias", source, default=True):
        raise ConfigError(
            f"{source}: attention_bias false: Megatron's --add-bias-linear gives "
            "gpt-oss's router and experts their biases and the attention its own; it has no "
            "switch for one without the other"
        )
    return experts(raw, "num_local_experts", "intermediate_size", source) | {
        "swiglu": False,
        "quick_geglu": True,
        "add_bias_linear": True,
        "softmax_type": "learnable",
    }


def _windowed_layers(raw: Raw, num_layers: int, source: str) -> tuple[int, list[bool]]:
    """(the window in tokens, 0 for none; which layers it applies to) from ``sliding_window`` and
    ``layer_types`` (GptOssConfig's default: every other layer from the first)."""
    window = integer(raw, "sliding_window", source, default=0, minimum=0)
    if raw.get("layer_types") is None:
        marked = [i % 2 == 0 for i in range(num_layers)]
    else:
        kinds = layer_flags(raw, "layer_types", num_layers, source, (_SLIDING, _FULL))
        marked = [kind == _SLIDING for kind in kinds]
    return (window, marked) if window and any(marked) else (0, [False] * num_layers)


def _gpt_oss_flags(raw: Raw, model: ModelSpec, source: str) -> tuple[str, ...]:
    limit = hf_flags.number("swiglu_limit", raw.get("swiglu_limit"), 7.0, source)
    flags = [
        "--glu-linear-offset",
        "1.0",
        "--activation-func-clamp-value",
        hf_flags.flag_text(limit),
        "--no-bias-dropout-fusion",  # TEGroupedMLP refuses the fusion with biased experts
    ]
    window, marked = _windowed_layers(raw, model.num_layers, source)
    if window:
        flags += ["--window-size", f"{window - 1},0"]  # (left, right): W tokens, self included
        if not all(marked):
            every = _every(marked, lambda number, n: number % n != 0)
            flags += ["--window-attn-skip-freq", _pattern_flag(marked, every)]
    return tuple(flags)


def _gpt_oss_notes(raw: Raw, model: ModelSpec) -> tuple[str, ...]:
    window, marked = _windowed_layers(raw, model.num_layers, "config")
    windowed = (
        f"its {window}-token sliding window on {sum(marked)} of {model.num_layers} layers and "
    )
    return (
        f"{model.name}: {windowed if window else ''}its attention sinks train as released, but "
        "FLOPs count full causal attention on every layer (as Megatron's own count does)",
    )


# Llama 4


def _llama4(raw: Raw, num_layers: int, source: str) -> dict[str, Any]:
    if boolean(raw, "attention_bias", source):
        raise ConfigError(
            f"{source}: attention_bias true: Megatron has no bias on q/k/v and the "
            "output projection without one on every MLP"
        )
    fields: dict[str, Any] = experts(raw, "num_local_experts", "intermediate_size", source)
    moe = _llama4_moe_layers(raw, num_layers, source)
    return fields | {
        "ffn_hidden_size": integer(raw, "intermediate_size_mlp", source, default=16384),
        "moe_shared_expert_intermediate_size": fields["moe_ffn_hidden_size"],
        "moe_layer_freq": [int(i in moe) for i in range(num_layers)],
    }


def _llama4_moe_layers(raw: Raw, num_layers: int, source: str) -> frozenset[int]:
    """``moe_layers``, else every ``interleave_moe_layer_step``-th layer."""
    listed = layer_indices(raw, "moe_layers", num_layers, source)
    if listed is not None:
        return listed
    step = integer(raw, "interleave_moe_layer_step", source, default=1)
    return frozenset(range(step - 1, num_layers, step))


def _llama4_flags(raw: Raw, model: ModelSpec, source: str) -> tuple[str, ...]:
    flags = ["--moe-apply-probs-on-input"]  # the top-1 score scales the expert's input
    if boolean(raw, "use_qk_norm", source, default=True):
        flags.append("--qk-l2-norm")
    no_rope = _no_rope_layers(raw, model.num_layers, source)
    if any(no_rope):
        every = _every(no_rope, lambda number, n: number % n == 0)
        flags += ["--no-rope-freq", _pattern_flag(no_rope, every)]
    return tuple(flags)


def _no_rope_layers(raw: Raw, num_layers: int, source: str) -> list[bool]:
    """Which layers skip RoPE: ``no_rope_layers`` 0 (a list; empty means the default), else the
    last of every ``no_rope_layer_interval`` layers (Llama4TextConfig's default, 4)."""
    if raw.get("no_rope_layers"):
        return [not uses for uses in layer_flags(raw, "no_rope_layers", num_layers, source, (0, 1))]
    interval = integer(raw, "no_rope_layer_interval", source, default=4)
    return [(i + 1) % interval == 0 for i in range(num_layers)]


def _llama4_notes(raw: Raw, model: ModelSpec) -> tuple[str, ...]:
    chunk = raw.get("attention_chunk_size")
    chunked = f"chunked attention ({quoted(chunk)} tokens on its RoPE layers) and " if chunk else ""
    parts = [
        f"{chunked}the attention temperature of its NoPE layers have no Megatron core_v0.16.1 "
        "flag: they train, and FLOPs count them, as full causal attention"
    ]
    no_rope = _no_rope_layers(raw, model.num_layers, "config")
    if boolean(raw, "use_qk_norm", "config", default=True) and any(no_rope):
        parts.append(
            f"its L2 QK norm, on its {no_rope.count(False)} RoPE layers only, is applied on all "
            f"{model.num_layers} (--qk-l2-norm has no per-layer pattern)"
        )
    if raw.get("vision_config"):
        parts.append("its vision encoder is not read")
    return (f"{model.name}: {'; '.join(parts)}",)


# MiniMax-M2


def _minimax_m2(raw: Raw, num_layers: int, source: str) -> dict[str, Any]:
    kinds = raw.get("attn_type_list")
    if kinds is not None:
        kinds = layer_flags(raw, "attn_type_list", num_layers, source, (0, 1))
        if not all(kinds):
            linear = [i for i, kind in enumerate(kinds) if not kind]
            raise ConfigError(
                f"{source}: attn_type_list marks layer {linear[0]} (and {len(linear) - 1} more) as "
                "lightning (linear) attention, which megatron-core 0.16.1 cannot build"
            )
    _minimax_mtp(raw, source)  # checked here; the note names them
    fields: dict[str, Any] = experts(raw, "num_local_experts", "intermediate_size", source)
    return fields | {
        "moe_shared_expert_intermediate_size": integer(
            raw, "shared_intermediate_size", source, default=0, minimum=0
        ),
        "qk_layernorm": boolean(raw, "use_qk_norm", source, default=True),
    }


def _minimax_mtp(raw: Raw, source: str) -> tuple[int, int]:
    """(MTP modules, transformer layers in each) that the file declares; (0, 0) without
    ``use_mtp``."""
    if not boolean(raw, "use_mtp", source):
        return 0, 0
    modules = integer(raw, "num_mtp_modules", source, default=0, minimum=0, maximum=MAX_LAYERS)
    layers = integer(raw, "mtp_transformer_layers", source, default=1, maximum=MAX_LAYERS)
    return (modules, layers) if modules else (0, 0)


def _minimax_router_keys(raw: Raw) -> Raw:
    """``use_routing_bias`` as ``topk_method``, ``rotary_dim`` as ``partial_rotary_factor``."""
    keys = dict(raw)
    if isinstance(raw.get("use_routing_bias"), bool):
        keys.setdefault("topk_method", "noaux_tc" if raw["use_routing_bias"] else "greedy")
    rotary, head = raw.get("rotary_dim"), raw.get("head_dim")
    if type(rotary) is int and type(head) is int and head > 0:
        keys.setdefault("partial_rotary_factor", rotary / head)
    return keys


def _minimax_notes(raw: Raw, model: ModelSpec) -> tuple[str, ...]:
    parts = []
    if model.qk_layernorm and raw.get("qk_norm_type", "per_layer") == "per_layer":
        fewer = (model.num_attention_heads + model.num_query_groups - 2) * model.kv_channels
        parts.append(
            "its QK norm spans all heads where Megatron's --qk-layernorm normalizes each head "
            f"({fewer:,} parameters a layer fewer here)"
        )
    modules, layers = _minimax_mtp(raw, "config")
    if modules:
        each = "one layer" if layers == 1 else f"{layers} layers"
        parts.append(
            f"its {modules} MTP modules ({each} each) are left out, as its released weights and "
            "published total leave them out (no --mtp-num-layers)"
        )
    return (f"{model.name}: {'; '.join(parts)}",) if parts else ()


FAMILIES: dict[str, Family] = {
    "gpt_oss": Family(_gpt_oss, hf_flags.GPT_OSS, _gpt_oss_flags, _gpt_oss_notes),
    "llama4_text": Family(_llama4, hf_flags.LLAMA4, _llama4_flags, _llama4_notes),
    "minimax_m2": Family(
        _minimax_m2, hf_flags.MINIMAX_M2, notes=_minimax_notes, router_keys=_minimax_router_keys
    ),
}
"""The families this module reads; ``llama4`` is ``llama4_text`` in its ``text_config``."""
