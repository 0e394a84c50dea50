"""The Megatron flags that train a Hugging Face model as it was released: router, rotary, norm.

A ``config.json`` fixes more than the shapes :mod:`ray_layout.model.hf_config` sizes: how the
router scores and picks experts, the rotary base, scaling and share of each head, the norm
epsilon.  Megatron's defaults differ (softmax routing without expert bias, rotary base 10000,
epsilon 1e-5, YaRN x40 for MLA), so a profiling run without them would time another model.  They
become flags of Megatron core_v0.16.1 that the recipe carries as its own, ahead of the user's
``megatron_args``, which win.

Where the file is silent a key takes the default of the family's HF config class, or what its
modeling code hard-wires (GLM-4.5 routes by sigmoid with a score-correction bias, whatever the
file says).  Of transformers' RoPE scalings Megatron 0.16.1 trains llama3 (``--use-rope-scaling``),
linear by a whole factor (``--rotary-seq-len-interpolation-factor``) and, for MLA only, YaRN
(``--rope-type yarn``); dynamic NTK scaling is plain RoPE up to ``max_position_embeddings``.
What it has no flag for, :func:`rotary_notes` says in the recipe's note: YaRN outside MLA,
longrope, any scaling but YaRN for MLA, a fractional linear factor, YaRN's ``beta_fast``,
``beta_slow`` and ``original_max_position_embeddings`` where they differ from the 32, 1 and
4096 Megatron fixes, llama3's frequency factors and original length where they differ from its 1,
4 and 8192; an unknown ``rope_type`` is an error.  Left out without a note: sigmoid top-k weights
left unnormalized (Megatron normalizes them), and DeepSeek-V2's max-score group choice (Megatron
ranks a group by the sum of its top topk/group_topk scores, which for DeepSeek-V3's top-8 over 4
chosen groups is its top-2 sum).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ray_layout.errors import ConfigError, quoted
from ray_layout.model.config_values import Bound
from ray_layout.model.config_values import integer as config_integer
from ray_layout.model.config_values import number as config_number
from ray_layout.model.fields import MAX_DIMENSION, ModelSpec
from ray_layout.model.megatron_args import megatron_flag_table

Flag = tuple[str, ...]  # one option and its values, as on a command line


@dataclass(frozen=True)
class Defaults:
    """One model type's values where its ``config.json`` is silent, from its HF config class and
    modeling code; ``fixed`` names the keys that code never reads (it hard-wires the default)."""

    rope_theta: float = 10_000.0
    rms_norm_eps: float = 1e-6
    partial_rotary_factor: float = 1.0
    scoring_func: str = "softmax"
    topk_method: str = "greedy"  # noaux_tc: sigmoid scores plus e_score_correction_bias
    norm_topk_prob: bool = True
    n_group: int = 1
    topk_group: int = 1
    routed_scaling_factor: float = 1.0
    fixed: frozenset[str] = frozenset()


DEEPSEEK_V3 = Defaults(
    scoring_func="sigmoid",
    topk_method="noaux_tc",
    n_group=8,
    topk_group=4,
    routed_scaling_factor=2.5,
)
GLM4_MOE = Defaults(
    rms_norm_eps=1e-5,
    partial_rotary_factor=0.5,
    scoring_func="sigmoid",
    topk_method="noaux_tc",
    fixed=frozenset({"scoring_func", "topk_method"}),
)
UNNORMALIZED_SOFTMAX = Defaults(norm_topk_prob=False)  # DeepSeek-V2, Qwen2/3-MoE, OLMoE
_HARD_WIRED_ROUTER = frozenset({"scoring_func", "topk_method", "norm_topk_prob"})
# gpt-oss: the softmax of the top-k logits, as Megatron's default router takes it.
GPT_OSS = Defaults(rope_theta=150_000.0, rms_norm_eps=1e-5, fixed=_HARD_WIRED_ROUTER)
# Llama 4: the sigmoid of the top-1 logit, unnormalized (Megatron leaves one weight as it is).
LLAMA4 = Defaults(
    rope_theta=500_000.0,
    rms_norm_eps=1e-5,
    scoring_func="sigmoid",
    norm_topk_prob=False,
    fixed=_HARD_WIRED_ROUTER,
)
# MiniMax-M2: sigmoid scores with a score-correction bias (use_routing_bias), like DeepSeek-V3.
MINIMAX_M2 = Defaults(rope_theta=5_000_000.0, scoring_func="sigmoid", topk_method="noaux_tc")
MIXTRAL = Defaults(rope_theta=1e6, rms_norm_eps=1e-5, fixed=frozenset({"norm_topk_prob"}))

_SCORING = ("softmax", "sigmoid")
_TOPK_METHODS = ("greedy", "group_limited_greedy", "noaux_tc")


def training_flags(
    raw: Mapping[str, Any], model: ModelSpec, defaults: Defaults, source: str
) -> tuple[str, ...]:
    """The flags ``raw`` implies beyond the model's shape, for the ``model`` it was read as."""
    epsilon = number("rms_norm_eps", raw.get("rms_norm_eps"), defaults.rms_norm_eps, source)
    flags = [
        *_router(raw, model, defaults, source),
        *_rotary(raw, model, defaults, source),
        ("--norm-epsilon", flag_text(epsilon)),
    ]
    return tuple(word for flag in flags for word in flag)


def with_user_flags(derived: Sequence[str], user: Sequence[str]) -> tuple[str, ...]:
    """``derived`` less every option whose setting (argparse dest) ``user`` also makes, then
    ``user``: the user's value wins, and no setting is made twice.  ``derived`` is well formed
    (each option followed by its values); ``user`` is checked later, where the recipe is loaded."""
    table = megatron_flag_table()

    def dest(word: str) -> str | None:
        entry = table.get(word.partition("=")[0]) if word.startswith("--") else None
        return None if entry is None else entry["dest"]

    taken = {dest(word) for word in user} - {None}
    kept: list[str] = []
    keep = True
    for word in derived:
        if word.startswith("--"):
            keep = dest(word) not in taken
        if keep:
            kept.append(word)
    return (*kept, *user)


def _router(raw: Mapping[str, Any], model: ModelSpec, d: Defaults, source: str) -> list[Flag]:
    """How the HF router picks and weighs experts, as Megatron's router flags.

    Megatron's softmax router takes the softmax of the top-k logits (the HF softmax-then-top-k
    renormalized) unless ``--moe-router-pre-softmax``, which keeps the weights unnormalized;
    top-1 routing needs it (Megatron refuses softmax over one logit)."""
    if not model.num_experts:
        return []

    def value(key: str) -> Any:
        return getattr(d, key) if key in d.fixed or raw.get(key) is None else raw[key]

    scoring, method = value("scoring_func"), value("topk_method")
    if scoring not in _SCORING:
        raise ConfigError(
            f"{source}: scoring_func must be softmax or sigmoid, got {quoted(scoring)}"
        )
    if method not in _TOPK_METHODS:
        raise ConfigError(
            f"{source}: topk_method must be one of {', '.join(_TOPK_METHODS)}, got {quoted(method)}"
        )
    if method == "noaux_tc" and scoring != "sigmoid":
        raise ConfigError(
            f"{source}: topk_method noaux_tc needs scoring_func sigmoid, got {quoted(scoring)} "
            "(Megatron's expert bias routes by sigmoid scores)"
        )
    normalized = value("norm_topk_prob")
    if not isinstance(normalized, bool):
        raise ConfigError(
            f"{source}: norm_topk_prob must be true or false, got {quoted(normalized)}"
        )
    flags: list[Flag] = [("--moe-router-score-function", scoring)]
    if method == "noaux_tc":
        flags.append(("--moe-router-enable-expert-bias",))
    groups, chosen = _group(value("n_group"), "n_group", source), value("topk_group")
    if method != "greedy" and groups > 1:
        chosen = _group(chosen, "topk_group", source)
        if model.num_experts % groups:
            raise ConfigError(
                f"{source}: n_group {groups} does not divide the {model.num_experts} experts"
            )
        if chosen > groups:
            raise ConfigError(f"{source}: topk_group {chosen} is more than n_group {groups}")
        if model.moe_router_topk < chosen:  # Megatron ranks a group by its top topk/topk_group
            raise ConfigError(
                f"{source}: num_experts_per_tok {model.moe_router_topk} is less than topk_group "
                f"{chosen}"
            )
        flags += [
            ("--moe-router-num-groups", str(groups)),
            ("--moe-router-group-topk", str(chosen)),
        ]
    if scoring == "softmax" and (not normalized or model.moe_router_topk == 1):
        flags.append(("--moe-router-pre-softmax",))
    scaling = number(
        "routed_scaling_factor", raw.get("routed_scaling_factor"), d.routed_scaling_factor, source
    )
    if scaling != 1.0:
        flags.append(("--moe-router-topk-scaling-factor", flag_text(scaling)))
    if model.num_experts > 1:
        flags.append(("--moe-grouped-gemm",))
    return flags


def _rotary(raw: Mapping[str, Any], model: ModelSpec, d: Defaults, source: str) -> list[Flag]:
    """The rotary base, share of each head and scaling.  transformers 5 keeps them in
    ``rope_parameters``, earlier files at the top level and in ``rope_scaling``."""
    if model.position_embedding_type != "rope":
        return []
    params, where = _rope_parameters(raw, source)
    theta = number(
        "rope_theta", raw.get("rope_theta", params.get("rope_theta")), d.rope_theta, source
    )
    if not theta.is_integer():
        raise ConfigError(
            f"{source}: rope_theta {theta:g} is not a whole number; Megatron's --rotary-base "
            "takes an integer"
        )
    flags: list[Flag] = [("--rotary-base", str(int(theta)))]
    kind = _rope_kind(params, where, source)
    if model.mla is not None:  # MLA ropes its own qk_pos_emb_head_dim; it defaults to YaRN x40
        if kind != "yarn":
            return [*flags, ("--rope-type", "rope"), ("--no-rope-fusion",)]  # fusion needs YaRN
        _differences(params, where, kind, source)  # checks the keys it has no flag for
        return [*flags, *_yarn(params, where, source)]
    share = raw.get("partial_rotary_factor", params.get("partial_rotary_factor"))
    share = number("partial_rotary_factor", share, d.partial_rotary_factor, source)
    if share > 1:
        raise ConfigError(f"{source}: partial_rotary_factor must be at most 1, got {share:g}")
    if share != 1.0:
        flags.append(("--rotary-percent", flag_text(share)))
    if kind == "llama3":
        _differences(params, where, kind, source)
        flags += [
            ("--use-rope-scaling",),
            ("--rope-scaling-factor", flag_text(_factor(params, where, source))),
        ]
    if kind == "linear" and (factor := _factor(params, where, source)).is_integer():
        # positions divided by the factor, as transformers' linear scaling divides inv_freq
        flags.append(("--rotary-seq-len-interpolation-factor", str(int(factor))))
    return flags


# transformers' rope types (ROPE_INIT_FUNCTIONS)
ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "longrope", "llama3")
# What Megatron fixes and has no flag for: llama3 scaling's (RotaryEmbedding._apply_scaling) and
# MLA's YaRN's (TransformerConfig's beta_fast, beta_slow, original_max_position_embeddings).
FIXED = {
    "llama3": {
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192.0,
    },
    "yarn": {"beta_fast": 32.0, "beta_slow": 1.0, "original_max_position_embeddings": 4096.0},
}


def _rope_kind(params: Mapping[str, Any], where: str, source: str) -> str:
    kind = params.get("rope_type", params.get("type")) or "default"
    if kind not in ROPE_TYPES:
        raise ConfigError(
            f"{source}: {where} rope_type {quoted(kind)} is not one of {', '.join(ROPE_TYPES)}"
        )
    return kind


def _differences(params: Mapping[str, Any], where: str, kind: str, source: str) -> list[str]:
    """Where a scaling's keys differ from what Megatron fixes, one phrase each (``high_freq_factor
    1 (Megatron's is 4)``); none for a missing key."""
    differences = []
    for key, fixed in FIXED.get(kind, {}).items():
        value = number(f"{where} {key}", params.get(key), fixed, source)
        if value != fixed:
            differences.append(f"{key} {value:g} (Megatron's is {fixed:g})")
    return differences


def rotary_notes(raw: Mapping[str, Any], model: ModelSpec) -> tuple[str, ...]:
    """What the file's RoPE scaling asks that no Megatron core_v0.16.1 flag carries, one phrase
    each: profiling runs train the model without it (its sizes are the same).  ``raw`` has been
    read by :func:`training_flags`, which refused what is malformed."""
    if model.position_embedding_type != "rope":
        return ()
    params, where = _rope_parameters(raw, "config")
    kind, mla = _rope_kind(params, where, "config"), model.mla is not None
    # the factor was read where the flag takes it: a non-MLA linear scaling's
    whole = kind == "linear" and not mla and float(params["factor"]).is_integer()
    if {"default": True, "llama3": not mla, "yarn": mla, "linear": whole}.get(kind, False):
        differences = _differences(params, where, kind, "config")
        return (
            (f"its {kind} RoPE scaling's {', '.join(differences)} has no Megatron flag: it trains "
             "with Megatron's",)
            if differences
            else ()
        )  # fmt: skip
    if kind == "dynamic":
        return (
            "its dynamic NTK RoPE scaling has no Megatron flag; it acts only past "
            f"max_position_embeddings ({quoted(raw.get('max_position_embeddings'))} tokens), "
            "and up to there it is plain RoPE, as the runs train it",
        )
    if mla:
        why = " for MLA"
    elif kind == "linear":
        why = f" (--rotary-seq-len-interpolation-factor takes an integer, not {params['factor']:g})"
    else:
        why = " outside MLA" if kind == "yarn" else ""
    return (
        f"its {kind} RoPE scaling has no Megatron core_v0.16.1 flag{why}: the runs train plain "
        "RoPE",
    )


def _rope_parameters(raw: Mapping[str, Any], source: str) -> tuple[dict[str, Any], str]:
    """``rope_scaling`` over ``rope_parameters``, and the key to name in messages."""
    merged: dict[str, Any] = {}
    where = "rope_scaling"
    for key in ("rope_parameters", "rope_scaling"):
        value = raw.get(key)
        if value is None:
            continue
        if not isinstance(value, Mapping):
            raise ConfigError(f"{source}: {key} must be a mapping, got {quoted(value)}")
        merged |= value
        where = key
    return merged, where


def _yarn(params: Mapping[str, Any], where: str, source: str) -> list[Flag]:
    """MLA's YaRN: the factor and the attention-scale exponents (DeepSeek's defaults: 1 and 0)."""
    mscale = number(f"{where} mscale", params.get("mscale"), 1.0, source)
    all_dim = params.get("mscale_all_dim")
    all_dim = number(f"{where} mscale_all_dim", all_dim, 0.0, source, zero=True)
    return [
        ("--rope-type", "yarn"),
        ("--rotary-scaling-factor", flag_text(_factor(params, where, source))),
        ("--mscale", flag_text(mscale)),
        ("--mscale-all-dim", flag_text(all_dim)),
    ]


def _factor(params: Mapping[str, Any], where: str, source: str) -> float:
    if params.get("factor") is None:
        raise ConfigError(f"{source}: {where} has no factor")
    return number(f"{where} factor", params["factor"], 1.0, source)


def _group(value: Any, key: str, source: str) -> int:
    return config_integer(value, key, source, low=1, high=MAX_DIMENSION)


# Above any released model's rotary base (500,000 to 5e6), scaling factor or epsilon: a typo.
HF_NUMBER_LIMIT = 1e12
_POSITIVE = Bound(0.0, HF_NUMBER_LIMIT, above=True)
_NOT_NEGATIVE = Bound(0.0, HF_NUMBER_LIMIT)


def number(name: str, value: Any, default: float, source: str, *, zero: bool = False) -> float:
    """``value`` as a finite number > 0 (>= 0 with ``zero``) up to HF_NUMBER_LIMIT; ``default``
    for a missing one."""
    if value is None:
        return default
    return config_number(value, name, source, _NOT_NEGATIVE if zero else _POSITIVE)


def flag_text(value: float) -> str:
    """A float as Megatron's argparse reads it back exactly: 2.5, 1e-06, 32.0."""
    return repr(float(value))
