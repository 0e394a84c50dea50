"""ModelSpec and ParallelConfig: the model shape and parallel sizes everything else reads
(ModelSpec is declared with its fields' facts in ``fields.py``).

Field names follow Megatron's argument names (``--num-query-groups`` -> ``num_query_groups``) so
that the three loaders (this project's YAML/JSON, a Megatron command line, a Hugging Face
``config.json``) all land on one vocabulary.  Every loader ends in :func:`build_recipe`, which
fills Megatron's defaults and rejects contradictions with one-line :class:`ConfigError` messages.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from ray_layout.errors import ConfigError, clipped, quoted
from ray_layout.model.fields import (
    FIELD,
    MAX_DIMENSION,
    MAX_PARALLEL_SIZE,
    MAX_PIPELINE_STAGES,
    MAX_WORLD_SIZE,
    MODEL_KEYS,
    MLAConfig,
    ModelSpec,
    checked,
    take,
)
from ray_layout.model.files import read_mapping
from ray_layout.model.fork_fields import check_fork_fields
from ray_layout.model.job_flags import JobFlags, job_flags
from ray_layout.model.megatron_args import UnresolvedArgument
from ray_layout.model.memory_settings import SOURCE
from ray_layout.model.moe_layer_freq import parse_moe_layer_freq
from ray_layout.model.split import PipelineSplit


@dataclass(frozen=True)
class ParallelConfig:
    """Parallel sizes and batch shape of one run (global_batch_size 0: not given).

    ``etp`` defaults to 1, as MoE recipes set it; Megatron's own default is TP.
    """

    tp: int = 1
    pp: int = 1
    vpp: int = 1
    cp: int = 1
    ep: int = 1
    etp: int = 1
    dp: int = 1
    micro_batch_size: int = 1
    global_batch_size: int = 0
    use_distributed_optimizer: bool = True
    # Whose expert groups: "megatron" (megatron-core's grid of ETP x EP x expert-DP x PP over the
    # world) or "deepspeed" (deepspeed/utils/groups.py: each TP rank's DP group split into EP x
    # expert-DP, the experts whole on every TP rank).
    expert_groups: str = "megatron"

    @property
    def world_size(self) -> int:
        return self.tp * self.cp * self.dp * self.pp

    @property
    def expert_dp(self) -> int:
        """Data-parallel size of the expert parameters, over which the distributed optimizer (or
        DeepSpeed's ZeRO) shards their state: world / (ETP x EP x PP) in megatron-core, DP / EP
        in DeepSpeed, whose expert-data-parallel groups hold one TP rank each."""
        if self.expert_groups == "deepspeed":
            return self.dp // self.ep
        return self.world_size // (self.etp * self.ep * self.pp)

    @property
    def num_microbatches_or_none(self) -> int | None:
        """Micro-batches per step, when the global batch size is known."""
        if not self.global_batch_size:
            return None
        return self.global_batch_size // (self.micro_batch_size * self.dp)

    def as_row(self) -> dict[str, int | None]:
        """The run shape as the ``runs`` table and the report hold it, in one place: every size,
        the batch (None where not given) and the micro-batches it makes."""
        return {
            "pp": self.pp,
            "vpp": self.vpp,
            "tp": self.tp,
            "cp": self.cp,
            "ep": self.ep,
            "etp": self.etp,
            "dp": self.dp,
            "micro_batch_size": self.micro_batch_size,
            "global_batch_size": self.global_batch_size or None,
            "num_microbatches": self.num_microbatches_or_none,
        }


@dataclass(frozen=True)
class Recipe:
    """A model together with the parallel sizes its configuration asked for, how it splits the
    model over pipeline stages, and the user's own Megatron flags (a launch script's, or
    ``megatron_args:``) and the variables a launch script exports, which profiling runs pass
    on."""

    model: ModelSpec
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    megatron_args: tuple[str, ...] = ()
    environment: tuple[tuple[str, str], ...] = ()  # (name, value), sorted by name
    unresolved_environment: tuple[str, ...] = ()  # exported without a plain value in the script
    split: PipelineSplit = field(default_factory=PipelineSplit)  # the config's own split flags
    notes: tuple[str, ...] = ()  # what loading decided that the user should hear once
    # the user's flags whose value the job's environment gives: left out of megatron_args; a run
    # refuses them unless the tuner owns them
    unresolved_arguments: tuple[UnresolvedArgument, ...] = ()
    dialect: str = ""  # the Megatron fork whose command line it is ("" for Megatron-LM's)
    # what megatron_args mean to the models, parsed once with every construction (and replace)
    flags: JobFlags = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "flags", job_flags(self.megatron_args))
        memory = self.flags.memory
        if any(u.flag == "--fp8-recipe" for u in self.unresolved_arguments):
            memory = replace(memory, fp8_recipe=None)  # its recipe unknown: no rule of it holds
        refused = memory.recompute_refusal(
            mla=self.model.mla is not None, mtp=bool(self.model.mtp_num_layers)
        )
        if refused:
            raise ConfigError(f"{SOURCE}: {refused}")


# The ModelSpec fields a loader gives as they are (the table's entries; the rest are derived).
_SPEC_KEYS = tuple(f.name for f in fields(ModelSpec) if f.name in FIELD)
PARALLEL_KEYS = frozenset(f.name for f in fields(ParallelConfig))
# The integer sizes of a run's shape, as a ``runs`` row holds them (without the batch).
PARALLEL_SIZES = ("tp", "pp", "vpp", "cp", "ep", "etp", "dp")


def build_recipe(
    raw_model: Mapping[str, Any], raw_parallel: Mapping[str, Any] | None = None, *, source: str
) -> Recipe:
    """Fill Megatron's defaults into flat model and parallel fields and check them together.

    Each field is checked and defaulted by its entry in ``fields.MODEL_FIELDS``; what follows is
    only what fields mean together."""
    raw = dict(raw_model)
    unknown = sorted(set(raw) - MODEL_KEYS)
    if unknown:
        raise ConfigError(f"{source}: unknown model field(s): {clipped(', '.join(unknown))}")
    v = {key: take(raw, key, source=source) for key in _SPEC_KEYS}
    hidden, heads = v["hidden_size"], v["num_attention_heads"]
    if v["quick_geglu"] and raw.get("swiglu") is None:  # this project's SwiGLU default yields
        v["swiglu"] = False
    if v["ffn_hidden_size"] is None:  # Megatron's: 4h, or 2/3 of it rounded down to 64 (SwiGLU)
        v["ffn_hidden_size"] = int(4 * hidden * 2 / 3 / 64) * 64 if v["swiglu"] else 4 * hidden
    if v["swiglu"] and v["quick_geglu"]:
        raise ConfigError(f"{source}: swiglu and quick_geglu are both set; Megatron takes one")
    if v["softmax_type"] not in _SOFTMAX_TYPES:
        choices, shown = ", ".join(_SOFTMAX_TYPES), quoted(v["softmax_type"])
        raise ConfigError(f"{source}: softmax_type must be one of {choices}, not {shown}")
    if v["kv_channels"] is None:
        if hidden % heads:
            raise ConfigError(
                f"{source}: hidden_size {hidden} is not divisible by num_attention_heads {heads}; "
                "set kv_channels"
            )
        v["kv_channels"] = hidden // heads
    gqa = take(raw, "group_query_attention", source=source, default="num_query_groups" in raw)
    groups = v["num_query_groups"] = (v["num_query_groups"] if gqa else None) or heads
    if heads % groups:
        raise ConfigError(
            f"{source}: num_attention_heads {heads} is not divisible by num_query_groups {groups}"
        )
    if v["normalization"] not in ("LayerNorm", "RMSNorm"):
        shown = quoted(v["normalization"])
        raise ConfigError(f"{source}: normalization must be LayerNorm or RMSNorm, not {shown}")
    position = v["position_embedding_type"]
    if position not in ("rope", "learned_absolute", "none"):
        raise ConfigError(f"{source}: unknown position_embedding_type {quoted(position)}")
    learned = position == "learned_absolute"  # the only one with a table of positions
    v["max_position_embeddings"] = (v["max_position_embeddings"] or v["seq_length"]) * learned
    num_experts, mtp = v["num_experts"], v["mtp_num_layers"]
    if num_experts < 0 or mtp < 0:
        raise ConfigError(f"{source}: num_experts and mtp_num_layers cannot be negative")
    if mtp and learned:
        raise ConfigError(
            f"{source}: MTP needs position_embedding_type rope or none (Megatron rejects "
            "learned_absolute with mtp_num_layers)"
        )
    pattern = _moe_pattern(raw, v, source)
    check_fork_fields(v, pattern, source)
    mla = None
    if take(raw, "multi_latent_attention", source=source):
        names = [f.name for f in fields(MLAConfig)]
        mla = MLAConfig(**{key: take(raw, key, source=source) for key in names})
    model = ModelSpec(**v, moe_layer_pattern=pattern, mla=mla)
    parallel = build_parallel(model, raw_parallel or {}, source=source)
    return Recipe(model=model, parallel=parallel)


_SOFTMAX_TYPES = ("vanilla", "off-by-one", "learnable")  # Megatron's --softmax-type choices
_MOE_ONLY = (
    "moe_router_topk",
    "moe_shared_expert_intermediate_size",
    "moe_layer_freq",
    "moe_shared_expert_gate",
    "moe_residual",
    "moe_layer_experts",
)


def _moe_pattern(raw: dict[str, Any], v: dict[str, Any], source: str) -> tuple[bool, ...]:
    """Which layers are MoE; the MoE fields of ``v`` settled: 0 on a dense model, where setting
    one is an error; on a MoE model the expert FFN is ffn_hidden_size and top-k Megatron's 2
    unless given."""
    num_layers, num_experts = v["num_layers"], v["num_experts"]
    if not num_experts:
        moe_only = [k for k in _MOE_ONLY if raw.get(k)]  # 0, false and [] are unset
        if moe_only:
            raise ConfigError(f"{source}: {', '.join(moe_only)} set but num_experts is 0")
        v.update(dict.fromkeys((*_MOE_ONLY[:2], "moe_ffn_hidden_size"), 0))
        return (False,) * num_layers
    v["moe_ffn_hidden_size"] = v["moe_ffn_hidden_size"] or v["ffn_hidden_size"]
    if raw.get("moe_router_topk") is None:
        v["moe_router_topk"] = 2  # Megatron's --moe-router-topk default
    if not 1 <= v["moe_router_topk"] <= num_experts:
        raise ConfigError(
            f"{source}: moe_router_topk {v['moe_router_topk']} must be between 1 and num_experts "
            f"{num_experts}"
        )
    freq = raw.get("moe_layer_freq")
    return parse_moe_layer_freq(1 if freq is None else freq, num_layers, source=source)


def build_parallel(
    model: ModelSpec, raw: Mapping[str, Any], *, source: str = "parallel"
) -> ParallelConfig:
    """Parallel sizes checked against the model (experts divide by EP, heads by TP, ...)."""
    unknown = sorted(set(raw) - PARALLEL_KEYS)
    if unknown:
        raise ConfigError(f"{source}: unknown parallel field(s): {clipped(', '.join(unknown))}")
    sizes = {}
    for f in fields(ParallelConfig):
        if f.name in ("use_distributed_optimizer", "expert_groups"):
            continue
        bound = MAX_DIMENSION if f.name == "global_batch_size" else MAX_PARALLEL_SIZE
        given = raw.get(f.name)
        value = (
            f.default
            if given is None
            else checked(f.name, given, int, source=source, maximum=bound)
        )
        minimum = 0 if f.name == "global_batch_size" else 1
        if value < minimum:
            raise ConfigError(f"{source}: {f.name} must be >= {minimum}, got {value}")
        sizes[f.name] = value
    given = raw.get("use_distributed_optimizer")
    distopt = (
        True if given is None else checked("use_distributed_optimizer", given, bool, source=source)
    )
    groups = raw.get("expert_groups") or "megatron"
    if groups not in _EXPERT_GROUPS:
        shown = quoted(groups)
        raise ConfigError(f"{source}: expert_groups must be megatron or deepspeed, not {shown}")
    parallel = ParallelConfig(**sizes, use_distributed_optimizer=distopt, expert_groups=groups)
    check_parallel(model, parallel, source=source)
    return parallel


_EXPERT_GROUPS = ("megatron", "deepspeed")


def check_parallel(model: ModelSpec, parallel: ParallelConfig, *, source: str) -> None:
    p = parallel
    if model.num_attention_heads % p.tp:
        raise ConfigError(
            f"{source}: num_attention_heads {model.num_attention_heads} not divisible by TP {p.tp}"
        )
    if model.num_query_groups % p.tp:
        raise ConfigError(
            f"{source}: num_query_groups {model.num_query_groups} not divisible by TP {p.tp}"
        )
    if p.ep > 1 and not model.num_experts:
        raise ConfigError(f"{source}: expert parallel size {p.ep} set on a model without experts")
    for experts in sorted(set(model.moe_layer_experts or (model.num_experts,))):
        if experts and experts % p.ep:
            raise ConfigError(f"{source}: num_experts {experts} not divisible by EP {p.ep}")
    if p.expert_groups == "deepspeed" and p.dp % p.ep:  # deepspeed/utils/groups.py
        raise ConfigError(
            f"{source}: DeepSpeed's expert groups split DP {p.dp} by EP {p.ep}: not divisible"
        )
    if p.world_size % (p.etp * p.ep * p.pp):
        raise ConfigError(
            f"{source}: world size {p.world_size} (TP·CP·DP·PP) not divisible by "
            f"ETP·EP·PP = {p.etp * p.ep * p.pp}"
        )
    check_pipeline_stages(p.pp, p.vpp, source=source)
    if p.world_size > MAX_WORLD_SIZE:
        raise ConfigError(
            f"{source}: TP x CP x DP x PP = {p.world_size:,} GPUs, more than {MAX_WORLD_SIZE:,}"
        )
    if p.vpp > 1 and p.pp == 1:
        raise ConfigError(f"{source}: virtual pipeline size {p.vpp} needs PP > 1")
    if p.global_batch_size and p.global_batch_size % (p.micro_batch_size * p.dp):
        raise ConfigError(
            f"{source}: global_batch_size {p.global_batch_size} not divisible by "
            f"micro_batch_size x DP = {p.micro_batch_size * p.dp}"
        )


def check_pipeline_stages(pp: int, vpp: int, *, source: str) -> None:
    """PP x VPP stages no more than a layout may have (counting layouts is quadratic in them)."""
    if pp * vpp > MAX_PIPELINE_STAGES:
        raise ConfigError(
            f"{source}: PP {pp} x VPP {vpp} makes {pp * vpp:,} pipeline stages, "
            f"more than {MAX_PIPELINE_STAGES:,}"
        )


def with_parallel(recipe: Recipe, **overrides: int | None) -> Recipe:
    """The recipe with some parallel sizes replaced (None leaves a size as it was)."""
    merged = {f.name: getattr(recipe.parallel, f.name) for f in fields(ParallelConfig)}
    merged.update({k: v for k, v in overrides.items() if v is not None})
    return replace(recipe, parallel=build_parallel(recipe.model, merged, source="parallel sizes"))


def load_recipe_file(path: str | Path) -> Recipe:
    """This project's schema: a YAML or JSON mapping of model fields plus a ``parallel`` section."""
    path = Path(path)
    source = str(path)
    raw = read_mapping(path, source)
    parallel = raw.pop(
        "parallel", None
    )  # 'parallel:' left empty is no section; false is no mapping
    if parallel is None:
        parallel = {}
    if not isinstance(parallel, dict):
        raise ConfigError(f"{source}: parallel must be a mapping, got {quoted(parallel)}")
    raw.setdefault("name", path.stem)
    megatron_args = megatron_args_of(raw.pop("megatron_args", None), source)
    return replace(build_recipe(raw, parallel, source=source), megatron_args=megatron_args)


def megatron_args_of(value: Any, source: str) -> tuple[str, ...]:
    """A config's ``megatron_args:``: a list of words (flags and values) as on a command line."""
    if value is None:
        return ()
    if not isinstance(value, list) or not all(
        isinstance(w, str | int | float) and not isinstance(w, bool) for w in value
    ):
        raise ConfigError(f"{source}: megatron_args must be a list of flags and values")
    return tuple(str(word) for word in value)
