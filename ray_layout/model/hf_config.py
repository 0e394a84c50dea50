"""Load a Hugging Face ``config.json`` of a (MoE) causal LM as the model Megatron would build.

Each supported ``model_type`` names its experts, expert FFN and dense/MoE layer split with its own
keys; they are mapped onto Megatron's argument names and go through ``build_recipe`` like every
other loader.  What the modeling code hard-wires instead of configuring is filled in per family:
RMSNorm, gated MLPs (SwiGLU for ``hidden_act: silu``), rotary positions, Qwen2's q/k/v bias, and
QK norm for Qwen3, OLMoE and DeepSeek's MLA (its q/kv latent norms are Megatron's qk_layernorm).
Where a key is missing it takes the default of the family's HF config class (Qwen3's ``head_dim``
128, GLM-4.5's one shared expert and one dense layer).  gpt-oss, Llama 4 (a ``llama4`` file is
read through its ``text_config``) and MiniMax-M2 live in :mod:`ray_layout.model.hf_families`,
with their own flags and the one-line notes of what the tool leaves out.

What the model needs to be trained as released beyond its shape (router, rotary, norm epsilon)
becomes the recipe's own Megatron flags (:mod:`ray_layout.model.hf_flags`), ahead of the file's
``"megatron_args"``, which win.

The vocabulary is padded as Megatron pads it (``make_vocab_size_divisible_by`` 128, Megatron's
default): a checkpoint converted to Megatron carries that padding, so memory and FLOPs follow it.
The HF ``vocab_size`` of most of these models is already a multiple of 128 (Llama 4's 202,048 is
padded to 202,112); with TP > 1 Megatron pads further to a multiple of 128 x TP, which a divisor
of 1 would hide.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

from ray_layout.errors import ConfigError, quoted
from ray_layout.model import hf_flags
from ray_layout.model.fields import HF_FIELDS, MAX_LAYERS
from ray_layout.model.files import read_mapping
from ray_layout.model.hf_families import FAMILIES
from ray_layout.model.hf_flags import rotary_notes, training_flags, with_user_flags
from ray_layout.model.hf_keys import Family, boolean, experts, integer, layer_indices, optional_int
from ray_layout.model.spec import Recipe, build_recipe, megatron_args_of

DEFAULT_SEQ_LENGTH = 4096
_QK_LAYERNORM = frozenset({"olmoe", "qwen3", "qwen3_moe"})  # and MLA's latent norms (_deepseek)
_QKV_BIAS = frozenset({"qwen2", "qwen2_moe"})
# Qwen3Config defaults head_dim to 128; Qwen3MoeConfig has no head_dim, so its attention (like
# every other family's here) falls back to hidden_size / num_attention_heads.
_HEAD_DIM = {"qwen3": 128}
# Keys of fields.HF_FIELDS a config.json may leave out: its KV heads are its heads, head_dim above.
_HF_OPTIONAL = frozenset({"num_query_groups", "kv_channels"})


def load_hf_config(
    config: str | Path | Mapping[str, Any],
    *,
    source: str | None = None,
    seq_length: int | None = None,
) -> Recipe:
    """A recipe (default parallel sizes) from a ``config.json`` path or its parsed mapping, with
    the Megatron flags that train it as released and the file's own ``"megatron_args"`` after
    them.

    ``seq_length`` is the training sequence length, which a ``config.json`` does not record; it
    defaults to 4096 (the pretraining length of these models), capped by
    ``max_position_embeddings``.
    """
    raw, name, source = _read(config, source)
    if raw.get("model_type") == "llama4":
        raw, source = _text_model(raw, source)
    model_type = raw.get("model_type")
    family = _FAMILIES.get(model_type) if isinstance(model_type, str) else None
    if family is None:
        supported = ", ".join(sorted(_FAMILIES))
        raise ConfigError(
            f"{source}: model_type {quoted(model_type)} is not supported ({supported})"
        )
    hidden_act = raw.get("hidden_act", "silu")
    if hidden_act not in ("silu", "swish"):
        raise ConfigError(
            f"{source}: hidden_act {quoted(hidden_act)} is not supported; Megatron's gated MLP is "
            "SwiGLU (silu)"
        )
    tied = boolean(raw, "tie_word_embeddings", source)
    if seq_length is None:
        seq_length = min(DEFAULT_SEQ_LENGTH, integer(raw, "max_position_embeddings", source))
    # Every count is checked against its bound here, before a family builds anything per layer.
    shared = {f.name: optional_int(raw, f.hf_key, source, maximum=f.maximum) for f in HF_FIELDS}
    missing = [f.hf_key for f in HF_FIELDS if shared[f.name] is None and f.name not in _HF_OPTIONAL]
    if missing:
        raise ConfigError(f"{source}: missing key {missing[0]}")
    model = shared | {
        "name": name,
        "group_query_attention": True,
        "num_query_groups": shared["num_query_groups"] or shared["num_attention_heads"],
        "kv_channels": shared["kv_channels"] or _HEAD_DIM.get(model_type),
        "make_vocab_size_divisible_by": 128,
        "seq_length": seq_length,
        "swiglu": True,
        "normalization": "RMSNorm",
        "position_embedding_type": "rope",
        "add_bias_linear": False,
        "add_qkv_bias": model_type in _QKV_BIAS,
        "qk_layernorm": model_type in _QK_LAYERNORM,
        "untie_embeddings_and_output_weights": not tied,
    }
    model |= family.shape(raw, model["num_layers"], source)
    recipe = build_recipe(model, source=source)
    derived = (
        *training_flags(family.router_keys(raw), recipe.model, family.defaults, source),
        *family.flags(raw, recipe.model, source),
    )
    user = megatron_args_of(raw.get("megatron_args"), source)
    built = recipe.model
    return replace(
        recipe,
        megatron_args=with_user_flags(derived, user),
        notes=_one_note(family.notes(raw, built), rotary_notes(raw, built), built.name),
    )


def _one_note(lines: tuple[str, ...], phrases: tuple[str, ...], name: str) -> tuple[str, ...]:
    """The family's note with what the rotary flags leave out added to its line: one line a
    model."""
    if not phrases:
        return lines
    if lines:
        return (*lines[:-1], f"{lines[-1]}; {'; '.join(phrases)}")
    return (f"{name}: {'; '.join(phrases)}",)


def _text_model(raw: dict[str, Any], source: str) -> tuple[dict[str, Any], str]:
    """A ``llama4`` config's ``text_config`` as a ``llama4_text`` one: the language model Megatron
    trains; the top level's name and ``megatron_args`` stay, and whether a vision encoder was
    left out."""
    text = raw.get("text_config")
    if not isinstance(text, Mapping):
        raise ConfigError(f"{source}: text_config must be a mapping, got {quoted(text)}")
    kept = {k: raw[k] for k in ("_name_or_path", "megatron_args") if k in raw}
    return {
        **text,
        **kept,
        "model_type": "llama4_text",
        "vision_config": raw.get("vision_config"),
    }, f"{source} text_config"


def _read(
    config: str | Path | Mapping[str, Any], source: str | None
) -> tuple[dict[str, Any], str, str]:
    """(the config, the model's name, the source for messages)."""
    if isinstance(config, Mapping):
        raw = dict(config)
        return raw, _name(raw, str(raw.get("model_type", "model"))), source or "Hugging Face config"
    path = Path(config)
    source = source or str(path)
    raw = read_mapping(path, source)
    folder = path.parent.name if path.name == "config.json" else ""
    return raw, _name(raw, folder or path.stem), source


def _name(raw: dict[str, Any], fallback: str) -> str:
    """The repository name from ``_name_or_path`` (``org/Model`` -> ``Model``), else ``fallback``:
    the folder that holds config.json, the file's stem, or the model type."""
    named = raw.get("_name_or_path")
    if isinstance(named, str) and named.strip("/"):
        return named.rstrip("/").rsplit("/", 1)[-1]
    return fallback


def _deepseek(raw: dict[str, Any], num_layers: int, source: str) -> dict[str, Any]:
    """DeepSeek-V2/V3: MLA, MTP, and routed plus shared experts after the first dense layers.

    Layer i is MoE when ``i >= first_k_dense_replace and i % moe_layer_freq == 0`` (DeepSeek's
    modeling code); the shared experts form one FFN of ``n_shared_experts`` expert widths.
    """
    fields: dict[str, Any] = {
        "multi_latent_attention": True,
        "qk_layernorm": True,  # the q_a and kv_a latent norms
        "q_lora_rank": optional_int(raw, "q_lora_rank", source),
        "kv_lora_rank": integer(raw, "kv_lora_rank", source),
        "qk_head_dim": integer(raw, "qk_nope_head_dim", source),
        "qk_pos_emb_head_dim": integer(raw, "qk_rope_head_dim", source),
        "v_head_dim": integer(raw, "v_head_dim", source),
        "mtp_num_layers": _mtp_layers(raw, source),
    }
    if raw.get("n_routed_experts") is None:  # a dense DeepSeek
        return fields
    fields |= experts(raw, "n_routed_experts", "moe_intermediate_size", source)
    shared = integer(raw, "n_shared_experts", source, default=0, minimum=0)
    first_dense = _first_dense(raw, num_layers, source, default=0)
    every = integer(raw, "moe_layer_freq", source, default=1, **_within(num_layers))
    fields["moe_shared_expert_intermediate_size"] = shared * fields["moe_ffn_hidden_size"]
    fields["moe_layer_freq"] = [int(i >= first_dense and i % every == 0) for i in range(num_layers)]
    return fields


def _glm4_moe(raw: dict[str, Any], num_layers: int, source: str) -> dict[str, Any]:
    """GLM-4.5 / 4.6: attention with q/k/v bias (``attention_bias``) and optional QK norm
    (``use_qk_norm``), routed plus shared experts after the first ``first_k_dense_replace`` dense
    layers, and ``num_nextn_predict_layers`` MTP layers (none where the key is missing, as for
    DeepSeek); Glm4MoeConfig's one shared expert and one dense layer where those are missing."""
    fields: dict[str, Any] = experts(raw, "n_routed_experts", "moe_intermediate_size", source)
    shared = integer(raw, "n_shared_experts", source, default=1, minimum=0)
    first_dense = _first_dense(raw, num_layers, source, default=1)
    return fields | {
        "moe_shared_expert_intermediate_size": shared * fields["moe_ffn_hidden_size"],
        "moe_layer_freq": [int(i >= first_dense) for i in range(num_layers)],
        "mtp_num_layers": _mtp_layers(raw, source),
        "add_qkv_bias": boolean(raw, "attention_bias", source),
        "qk_layernorm": boolean(raw, "use_qk_norm", source),
    }


def _first_dense(raw: dict[str, Any], num_layers: int, source: str, default: int) -> int:
    """``first_k_dense_replace``: the dense layers before the first MoE one, at most all."""
    why = f" (the dense layers before the first MoE one, of the {num_layers})"
    return integer(
        raw, "first_k_dense_replace", source, default, minimum=0, maximum=num_layers, why=why
    )


def _within(num_layers: int) -> dict[str, Any]:
    """The bound of a layer step (``moe_layer_freq``, ``decoder_sparse_step``): past the layer
    count is a typo."""
    return {"maximum": num_layers, "why": f" (a step within the {num_layers} layers)"}


def _mtp_layers(raw: dict[str, Any], source: str) -> int:
    return integer(
        raw, "num_nextn_predict_layers", source, default=0, minimum=0, maximum=MAX_LAYERS
    )


def _qwen_moe(raw: dict[str, Any], num_layers: int, source: str) -> dict[str, Any]:
    """Qwen2-MoE / Qwen3-MoE: layer i is MoE when ``(i + 1) % decoder_sparse_step == 0`` and i is
    not in ``mlp_only_layers``; Qwen2-MoE adds a shared expert of its own width."""
    fields: dict[str, Any] = experts(raw, "num_experts", "moe_intermediate_size", source)
    step = integer(raw, "decoder_sparse_step", source, default=1, **_within(num_layers))
    dense = layer_indices(raw, "mlp_only_layers", num_layers, source) or frozenset()
    fields["moe_shared_expert_intermediate_size"] = integer(
        raw, "shared_expert_intermediate_size", source, default=0, minimum=0
    )
    fields["moe_layer_freq"] = [
        int(i not in dense and (i + 1) % step == 0) for i in range(num_layers)
    ]
    return fields


def _every_layer_moe(
    raw: dict[str, Any], num_layers: int, source: str, *, experts_key: str
) -> dict[str, Any]:
    """Mixtral / OLMoE: every layer is MoE and ``intermediate_size`` is the expert FFN."""
    return experts(raw, experts_key, "intermediate_size", source)


def _dense(raw: dict[str, Any], num_layers: int, source: str) -> dict[str, Any]:
    return {}


_FAMILIES: dict[str, Family] = {
    "deepseek_v2": Family(_deepseek, hf_flags.UNNORMALIZED_SOFTMAX),
    "deepseek_v3": Family(_deepseek, hf_flags.DEEPSEEK_V3),
    "kimi_k2": Family(_deepseek, hf_flags.DEEPSEEK_V3),  # Kimi-K2: the DeepSeek-V3 architecture
    "glm4_moe": Family(_glm4_moe, hf_flags.GLM4_MOE),
    "qwen2_moe": Family(_qwen_moe, hf_flags.UNNORMALIZED_SOFTMAX),
    "qwen3_moe": Family(_qwen_moe, hf_flags.UNNORMALIZED_SOFTMAX),
    "mixtral": Family(partial(_every_layer_moe, experts_key="num_local_experts"), hf_flags.MIXTRAL),
    "olmoe": Family(
        partial(_every_layer_moe, experts_key="num_experts"), hf_flags.UNNORMALIZED_SOFTMAX
    ),
    "llama": Family(_dense),
    "mistral": Family(_dense),
    "qwen2": Family(_dense),
    "qwen3": Family(_dense),
    **FAMILIES,
    "llama4": FAMILIES["llama4_text"],  # read through its text_config
}
"""Each model type: how its config.json reads as Megatron's model fields, its HF defaults, the
flags beyond router and rotary, and what the tool says it leaves out."""
