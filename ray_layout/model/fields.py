"""Every model field's facts, written once: ``ModelSpec`` and ``MLAConfig`` declare each field
with :func:`model_field`, which keeps its Megatron flag, default, bounds and, where all Hugging
Face families name it alike, its ``config.json`` key in the field's metadata.  :data:`MODEL_FIELDS`
(the loaders' flat vocabulary) is read off them, with the three keys a loader gives that the model
keeps in another form (``_INPUTS``).

``spec.build_recipe`` checks and defaults the loaders' flat fields from :data:`MODEL_FIELDS`,
``megatron_recipe`` reads them off a command line by the same names (Megatron's ``dest``), and
``launchers.megatron`` writes a model back as flags with :func:`model_flags`.  Adding a field is
one ``model_field`` here plus its meaning (docs/adding_a_model_field.md).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, get_args, get_origin, get_type_hints

from ray_layout.errors import ConfigError, one_line, quoted
from ray_layout.model.config_values import integer

# Bounds far above any real model or cluster: a typo (a billion layers, a 20-digit size) ends in
# one line naming the field, not in a MemoryError, an OverflowError or an hour of work.
MAX_LAYERS = 1_024  # decoder layers, and MTP layers
MAX_DIMENSION = 2**24  # any other size of a model or a batch: hidden, FFN, vocabulary, sequence
MAX_PARALLEL_SIZE = 65_536  # GPUs in one parallel dimension, sequences in a micro-batch
MAX_PIPELINE_STAGES = 1_024  # PP x VPP: the stages a layout cuts the model into
MAX_WORLD_SIZE = 2**20  # GPUs of one run: TP x CP x DP x PP

REQUIRED = object()  # a field's default when a loader must give it
DERIVED = None  # a field's default when build_recipe works it out from others
_FACTS = "model_field"  # the metadata key of a field's facts


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


def model_field(default: Any = DERIVED, **facts: Any) -> Any:
    """A dataclass field carrying its ``ModelField`` facts but name and kind (the field's own
    name and type).  Its default is the model's and the loaders' alike; a REQUIRED or DERIVED
    field has none in the class, as every model holds a value.  Its flag is its name's
    (``num_layers`` -> ``--num-layers``) unless ``flag`` says another (None: no flag)."""
    unset = default is REQUIRED or default is DERIVED
    return field(
        default=MISSING if unset else default, metadata={_FACTS: {"default": default, **facts}}
    )


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


@dataclass(frozen=True)
class MLAConfig:
    """Multi-latent attention (DeepSeek-V2/V3): low-rank query and key/value projections."""

    q_lora_rank: int | None = model_field(minimum=1)
    kv_lora_rank: int = model_field(REQUIRED, minimum=1, megatron_default=True)
    qk_head_dim: int = model_field(REQUIRED, minimum=1, megatron_default=True)
    qk_pos_emb_head_dim: int = model_field(REQUIRED, minimum=1, megatron_default=True)
    v_head_dim: int = model_field(REQUIRED, minimum=1, megatron_default=True)


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """The shape of a GPT-style (MoE) model as Megatron builds it.  The fields keep the order a
    model's ``repr`` has always had: a store's model hash and a study's id digest it."""

    name: str = model_field("model", flag=None)
    num_layers: int = model_field(
        REQUIRED, minimum=1, maximum=MAX_LAYERS, hf_key="num_hidden_layers"
    )
    hidden_size: int = model_field(REQUIRED, minimum=1, hf_key="hidden_size")
    num_attention_heads: int = model_field(REQUIRED, minimum=1, hf_key="num_attention_heads")
    ffn_hidden_size: int = model_field(minimum=1, hf_key="intermediate_size")
    num_query_groups: int = model_field(
        minimum=1,
        megatron_default=True,
        hf_key="num_key_value_heads",
        argument=lambda m: m.num_query_groups if _gqa(m) else None,
    )
    kv_channels: int = model_field(minimum=1, hf_key="head_dim")
    seq_length: int = model_field(REQUIRED, minimum=1)
    vocab_size: int = model_field(REQUIRED, minimum=1, hf_key="vocab_size")
    make_vocab_size_divisible_by: int = model_field(128, minimum=1)
    swiglu: bool = model_field(True, megatron_default=True)
    # gpt-oss's clamped GeGLU with quick GELU: gated, as SwiGLU is
    quick_geglu: bool = model_field(False)
    normalization: str = model_field("RMSNorm", megatron_default=True)
    add_bias_linear: bool = model_field(
        False, flag="--disable-bias-linear", negated=True, megatron_default=True
    )
    add_qkv_bias: bool = model_field(False)
    qk_layernorm: bool = model_field(False)
    # "learnable": attention sinks, one parameter per head
    softmax_type: str = model_field(
        "vanilla", argument=lambda m: None if m.softmax_type == "vanilla" else m.softmax_type
    )
    position_embedding_type: str = model_field("rope", megatron_default=True)
    # Learned positions' table (0 for any other); Megatron requires the flag whatever the
    # position embedding, >= seq_length.
    max_position_embeddings: int = model_field(
        0, minimum=1, argument=lambda m: m.max_position_embeddings or m.seq_length
    )
    untie_embeddings_and_output_weights: bool = model_field(False)
    num_experts: int = model_field(0, omit_zero=True)  # < 0: build_recipe says why
    # On a dense model the MoE sizes are 0; a MoE model that leaves them out has ffn_hidden_size
    # and Megatron's top-2 (build_recipe).
    moe_ffn_hidden_size: int = model_field(0, minimum=1, omit_zero=True)
    moe_router_topk: int = model_field(0, omit_zero=True)
    moe_shared_expert_intermediate_size: int = model_field(0, minimum=0, omit_zero=True)
    # a learned gate on the shared expert: h weights
    moe_shared_expert_gate: bool = model_field(False)
    moe_layer_pattern: tuple[bool, ...] = ()  # from moe_layer_freq
    mtp_num_layers: int = model_field(0, maximum=MAX_LAYERS, omit_zero=True)
    mla: MLAConfig | None = None  # from multi_latent_attention and MLAConfig's fields
    # What Megatron's forks build beyond megatron-core (ray_layout/model/dialects), which no
    # megatron-core flag says: DeepSpeed-MoE's routed experts of each MoE layer in order, where
    # they differ (PR-MoE's pyramid); () is num_experts on every MoE layer, and num_experts is
    # the largest.
    moe_layer_experts: tuple[int, ...] = model_field((), flag=None)
    # Whose MoE block: "megatron" (megatron-core's MoELayer) or "deepspeed"
    # (deepspeed.moe.layer.MoE: a TopKGate without bias, experts outside TP).
    moe_block: str = model_field("megatron", flag=None)
    # DeepSpeed's PR-MoE: a dense MLP beside the experts, mixed 2-way
    moe_residual: bool = model_field(False, flag=None)
    noop_layers: tuple[int, ...] = model_field((), flag=None)  # MindSpeed's no-op layers (0-based)

    @property
    def gated_linear_unit(self) -> bool:
        """Whether the MLP's first projection is doubled (gate and up): Megatron sets
        ``gated_linear_unit`` for ``--swiglu`` and for ``--quick-geglu`` alike."""
        return self.swiglu or self.quick_geglu

    @property
    def tied_embeddings(self) -> bool:
        """The output layer shares the embedding's weights (Megatron's default)."""
        return not self.untie_embeddings_and_output_weights

    @property
    def num_moe_layers(self) -> int:
        return sum(self.moe_layer_pattern)

    @property
    def mtp_layer_is_moe(self) -> bool:
        """Megatron builds each MTP layer with the spec of the last decoder layer."""
        return bool(self.moe_layer_pattern) and self.moe_layer_pattern[-1]

    @property
    def experts_per_layer(self) -> tuple[int, ...]:
        """The routed experts of each decoder layer (0 for a dense one): num_experts on every
        MoE layer, or DeepSpeed-MoE's count of each in order."""
        counts = iter(self.moe_layer_experts or (self.num_experts,) * self.num_moe_layers)
        return tuple(next(counts) if moe else 0 for moe in self.moe_layer_pattern)

    def padded_vocab_size(self, tensor_parallel: int = 1) -> int:
        """Megatron pads the vocabulary to a multiple of make_vocab_size_divisible_by x TP."""
        multiple = self.make_vocab_size_divisible_by * tensor_parallel
        return -(-self.vocab_size // multiple) * multiple


def _kind(hint: Any) -> Any:
    """The kind a loader gives a field of type ``hint`` in: a tuple as a list, ``int | None`` as
    an int."""
    if get_origin(hint) is tuple:
        return list
    given = [arg for arg in get_args(hint) if arg is not type(None)]
    return given[0] if given else hint


def _declared(cls: type, **common: Any) -> list[ModelField]:
    """The entries of ``cls``'s fields declared with :func:`model_field`, in declaration order."""
    hints = get_type_hints(cls)
    return [
        ModelField(f.name, _kind(hints[f.name]), **{"flag": _flag(f.name), **common, **facts})
        for f in fields(cls)
        if (facts := f.metadata.get(_FACTS)) is not None
    ]


# What a loader gives that the model keeps in another form: GQA as num_query_groups, the MoE
# layers' frequency as moe_layer_pattern, MLA as mla.
_INPUTS = (
    ModelField(
        "group_query_attention",
        bool,
        flag="--group-query-attention",
        megatron_default=True,
        argument=_gqa,
    ),
    ModelField(
        "moe_layer_freq",
        int | str | list,
        flag="--moe-layer-freq",
        argument=lambda m: moe_layer_freq_flag(m.moe_layer_pattern) if m.num_experts else None,
    ),
    ModelField(
        "multi_latent_attention",
        bool,
        False,
        flag="--multi-latent-attention",
        argument=lambda m: m.mla is not None,
    ),
)
# The flags' order on a profiling run's command line, which the run's id digests (a resumed tune
# finds its runs by it); a field not named here follows them in declaration order.
_FLAG_ORDER = (
    "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "group_query_attention",
    "num_query_groups", "kv_channels", "swiglu", "quick_geglu", "normalization", "add_bias_linear",
    "add_qkv_bias", "qk_layernorm", "softmax_type", "position_embedding_type", "seq_length",
    "max_position_embeddings", "untie_embeddings_and_output_weights",
    "make_vocab_size_divisible_by", "vocab_size", "num_experts", "moe_ffn_hidden_size",
    "moe_router_topk", "moe_shared_expert_intermediate_size", "moe_shared_expert_gate",
    "moe_layer_freq", "mtp_num_layers", "multi_latent_attention", "q_lora_rank", "kv_lora_rank",
    "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim",
)  # fmt: skip
_DECLARED = {
    entry.name: entry
    for entry in (*_declared(ModelSpec), *_INPUTS, *_declared(MLAConfig, mla=True))
}
MODEL_FIELDS: tuple[ModelField, ...] = (
    *(_DECLARED[name] for name in _FLAG_ORDER),
    *(entry for entry in _DECLARED.values() if entry.name not in _FLAG_ORDER),
)
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
    """``value`` of ``key`` as ``kind`` (an integral float as an int), or a one-line ConfigError;
    text is kept printable (a name's terminal escape sequence is shown, never acted on)."""
    if kind is int:
        low = -maximum if minimum is None else minimum
        return integer(value, key, source, low=low, high=maximum, whole_floats=True)
    if kind is bool and not isinstance(value, bool):
        raise ConfigError(f"{source}: {key} must be true or false, got {quoted(value)}")
    if kind is str:
        if not isinstance(value, str):
            raise ConfigError(f"{source}: {key} must be a string, got {quoted(value)}")
        return one_line(value)
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
