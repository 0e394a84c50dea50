"""Every model field's facts in one table: its Megatron flag, kind, default, bounds and, where all
Hugging Face families name it alike, its ``config.json`` key.

``spec.build_recipe`` checks and defaults the loaders' flat fields from :data:`MODEL_FIELDS`,
``megatron_recipe`` reads them off a command line by the same names (Megatron's ``dest``), and
``launchers.megatron`` writes a model back as flags with :func:`model_flags`.  Adding a field is
one entry here plus its meaning (docs/adding_a_model_field.md).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ray_layout.errors import ConfigError, quoted

if TYPE_CHECKING:
    from ray_layout.model.spec import ModelSpec

# Bounds far above any real model or cluster: a typo (a billion layers, a 20-digit size) ends in
# one line naming the field, not in a MemoryError, an OverflowError or an hour of work.
MAX_LAYERS = 1_024  # decoder layers, and MTP layers
MAX_DIMENSION = 2**24  # any other size of a model or a batch: hidden, FFN, vocabulary, sequence
MAX_PARALLEL_SIZE = 65_536  # GPUs in one parallel dimension, sequences in a micro-batch
MAX_PIPELINE_STAGES = 1_024  # PP x VPP: the stages a layout cuts the model into
MAX_WORLD_SIZE = 2**20  # GPUs of one run: TP x CP x DP x PP

REQUIRED = object()  # a field's default when a loader must give it
DERIVED = None  # a field's default when build_recipe works it out from others


@dataclass(frozen=True)
class ModelField:
    """One key of the loaders' flat model vocabulary (Megatron's argument ``dest``).

    ``flag`` is Megatron's switch for it (None: not a Megatron flag); ``negated`` flags say the
    opposite of the field (``--disable-bias-linear``).  ``megatron_default``: a command line that
    leaves it out means Megatron's default, not this project's.  ``omit_zero``: 0 means unset and
    writes no flag.  ``argument`` derives the flag's value from the model where it is not the
    field itself (None leaves the flag out).  ``mla``: a field of ``MLAConfig``."""

    name: str
    kind: type
    default: Any = DERIVED
    flag: str | None = None
    minimum: int | None = None
    maximum: int = MAX_DIMENSION
    megatron_default: bool = False
    negated: bool = False
    omit_zero: bool = False
    mla: bool = False
    hf_key: str | None = None
    argument: Callable[[ModelSpec], object] | None = None

    @property
    def required(self) -> bool:
        return self.default is REQUIRED


def moe_layer_freq_flag(pattern: Sequence[bool]) -> str:
    """Megatron's ``--moe-layer-freq`` for a dense/MoE pattern: N when every N-th layer from layer
    0 is MoE, else a list expression of runs such as ``([0]*3+[1]*58)``."""
    for every in range(1, len(pattern) + 1):
        if tuple(pattern) == tuple(i % every == 0 for i in range(len(pattern))):
            return str(every)
    runs = [f"[{int(moe)}]*{len(list(run))}" for moe, run in itertools.groupby(pattern)]
    return f"({'+'.join(runs)})"


def _gqa(m: ModelSpec) -> bool:
    return m.num_query_groups < m.num_attention_heads


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _field(name: str, kind: type, default: Any = DERIVED, **facts: Any) -> ModelField:
    """An entry whose Megatron flag is its name's (``num_layers`` -> ``--num-layers``)."""
    return ModelField(name, kind, default, flag=facts.pop("flag", _flag(name)), **facts)


# In the order a profiling run's command line gives them.
MODEL_FIELDS: tuple[ModelField, ...] = (
    ModelField("name", str, "model"),
    _field("num_layers", int, REQUIRED, minimum=1, maximum=MAX_LAYERS, hf_key="num_hidden_layers"),
    _field("hidden_size", int, REQUIRED, minimum=1, hf_key="hidden_size"),
    _field("ffn_hidden_size", int, minimum=1, hf_key="intermediate_size"),
    _field("num_attention_heads", int, REQUIRED, minimum=1, hf_key="num_attention_heads"),
    _field("group_query_attention", bool, megatron_default=True, argument=_gqa),
    _field("num_query_groups", int, minimum=1, megatron_default=True,
           hf_key="num_key_value_heads",
           argument=lambda m: m.num_query_groups if _gqa(m) else None),
    _field("kv_channels", int, minimum=1, hf_key="head_dim"),
    _field("swiglu", bool, True, megatron_default=True),
    _field("quick_geglu", bool, False),
    _field("normalization", str, "RMSNorm", megatron_default=True),
    _field("add_bias_linear", bool, False, flag="--disable-bias-linear", negated=True,
           megatron_default=True),
    _field("add_qkv_bias", bool, False),
    _field("qk_layernorm", bool, False),
    _field("softmax_type", str, "vanilla",
           argument=lambda m: None if m.softmax_type == "vanilla" else m.softmax_type),
    _field("position_embedding_type", str, "rope", megatron_default=True),
    _field("seq_length", int, REQUIRED, minimum=1),
    # Required by Megatron whatever the position embedding; >= seq_length.
    _field("max_position_embeddings", int, minimum=1,
           argument=lambda m: m.max_position_embeddings or m.seq_length),
    _field("untie_embeddings_and_output_weights", bool, False),
    _field("make_vocab_size_divisible_by", int, 128, minimum=1),
    _field("vocab_size", int, REQUIRED, minimum=1, hf_key="vocab_size"),
    _field("num_experts", int, 0, omit_zero=True),  # < 0: build_recipe says why
    _field("moe_ffn_hidden_size", int, minimum=1, omit_zero=True),
    _field("moe_router_topk", int, 2, omit_zero=True),
    _field("moe_shared_expert_intermediate_size", int, 0, minimum=0, omit_zero=True),
    _field("moe_shared_expert_gate", bool, False),
    _field("moe_layer_freq", int | str | list, argument=lambda m: (
        moe_layer_freq_flag(m.moe_layer_pattern) if m.num_experts else None)),
    # The forks' model facts (ray_layout/model/dialects): no megatron-core flag says them.
    ModelField("moe_layer_experts", list, ()),
    ModelField("moe_block", str, "megatron"),
    ModelField("moe_residual", bool, False),
    ModelField("noop_layers", list, ()),
    _field("mtp_num_layers", int, 0, maximum=MAX_LAYERS, omit_zero=True),
    _field("multi_latent_attention", bool, False, argument=lambda m: m.mla is not None),
    _field("q_lora_rank", int, minimum=1, mla=True),
    _field("kv_lora_rank", int, REQUIRED, minimum=1, megatron_default=True, mla=True),
    _field("qk_head_dim", int, REQUIRED, minimum=1, megatron_default=True, mla=True),
    _field("qk_pos_emb_head_dim", int, REQUIRED, minimum=1, megatron_default=True, mla=True),
    _field("v_head_dim", int, REQUIRED, minimum=1, megatron_default=True, mla=True),
)  # fmt: skip
FIELD = {f.name: f for f in MODEL_FIELDS}
MODEL_KEYS = frozenset(FIELD)
MEGATRON_DEFAULTS = frozenset(f.name for f in MODEL_FIELDS if f.megatron_default)
HF_FIELDS = tuple(f for f in MODEL_FIELDS if f.hf_key)


def checked(
    key: str,
    value: Any,
    kind: type,
    *,
    source: str,
    minimum: int | None = None,
    maximum: int = MAX_DIMENSION,
) -> Any:
    """``value`` of ``key`` as ``kind`` (an integral float as an int), or a one-line ConfigError."""
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        if not (isinstance(value, float) and value.is_integer()):
            raise ConfigError(f"{source}: {key} must be an integer, got {quoted(value)}")
        value = int(value)
    if kind is int and abs(value) > maximum:
        raise ConfigError(f"{source}: {key} must be <= {maximum:,}, got {quoted(value)}")
    if kind is int and minimum is not None and value < minimum:
        raise ConfigError(f"{source}: {key} must be >= {minimum}, got {value}")
    if kind is bool and not isinstance(value, bool):
        raise ConfigError(f"{source}: {key} must be true or false, got {quoted(value)}")
    if kind is str and not isinstance(value, str):
        raise ConfigError(f"{source}: {key} must be a string, got {quoted(value)}")
    return value


def take(raw: Mapping[str, Any], key: str, *, source: str, default: Any = REQUIRED) -> Any:
    """The model field ``key`` of ``raw`` checked by its entry; absent, the entry's default (or
    ``default``); a required one missing, or not positive, is an error."""
    entry = FIELD[key]
    fallback = entry.default if default is REQUIRED else default
    if raw.get(key) is None:
        if fallback is REQUIRED:
            raise ConfigError(f"{source}: missing required field {key}")
        return fallback
    minimum = entry.minimum
    value = checked(
        key,
        raw[key],
        entry.kind,
        source=source,
        maximum=entry.maximum,
        minimum=None if entry.required else minimum,
    )
    if entry.required and value <= 0:
        raise ConfigError(f"{source}: {key} must be positive, got {value}")
    return value


def model_flags(model: ModelSpec) -> dict[str, object]:
    """``{Megatron flag: value}`` of a model, in table order: True a bare switch, False or None
    no flag."""
    flags: dict[str, object] = {}
    for entry in MODEL_FIELDS:
        if entry.flag is None:
            continue
        if entry.argument is not None:
            value = entry.argument(model)
        elif entry.mla:
            value = getattr(model.mla, entry.name) if model.mla else None
        else:
            value = getattr(model, entry.name)
        if entry.negated:
            value = not value
        if entry.omit_zero and value == 0:
            value = None
        flags[entry.flag] = value
    return flags
