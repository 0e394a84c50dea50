"""An arguments block as the ``pretrain_gpt.py`` command line that makes the same run, in the
flags of the run's own Megatron: core's, or a fork's (``ray_layout.model.dialects``).

The block prints every attribute of Megatron's ``args`` after ``validate_args``, so it holds more
than a command line:

- the fork: a block is a fork's when it holds a key of the fork's model flags, set (every
  Megatron-DeepSpeed block prints ``topk``); those keys are always written, so the loader takes
  the command line for the same fork, and read with its table;
- what Megatron derives itself is left out: the launcher's ``rank`` and ``world_size``,
  ``data_parallel_size`` (the loader takes DP from the world), ``encoder_num_layers`` and
  ``encoder_seq_length`` (which Megatron refuses next to ``--num-layers``/``--seq-length``), the
  weight decay of a constant schedule, the p2p overlap it turns off without VPP, the VPP size;
- a key of the table becomes its flag where the value differs from the table's default: a switch
  bare (``--swiglu``) or in its negated form (``--disable-bias-linear`` for ``add_bias_linear
  False``), a list as its words, an enum by its member, ``None`` never;
- older Megatron-LM's keys with an exact meaning in core become core's flags
  (``use_rotary_position_embeddings``, ``checkpoint_activations``, ...);
- a key of another model (a teacher, RETRO's encoder, a vision tower) is never written;
- any other key is in no table: left out, and named in one note when it was set; one whose name
  says it may size the model (layers, hidden, heads, experts, vocab, ...) is an error naming it
  and its line, never a silent wrong size.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from types import MappingProxyType
from typing import Any

from ray_layout.errors import ConfigError, quoted
from ray_layout.model.dialects import CORE, DIALECTS, Dialect, looks_like_shape
from ray_layout.model.fields import MODEL_KEYS
from ray_layout.model.megatron_args import FlagUse, parse_flags, typed_value
from ray_layout.model.spec import Recipe

# Set by Megatron (validate_args, the launcher), never by a flag.
_DERIVED = frozenset({
    "rank", "local_rank", "world_size", "data_parallel_size", "encoder_num_layers",
    "encoder_seq_length", "transformer_pipeline_model_parallel_size", "params_dtype",
    "consumed_train_samples", "consumed_valid_samples", "consumed_train_tokens",
    "skipped_train_samples", "variable_seq_lengths", "ds_pipeline_enabled",
})  # fmt: skip
# What the loader reads off a command line: a value of these that the table refuses is an error,
# not a flag left out.
_READ = MODEL_KEYS | {
    "tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
    "expert_model_parallel_size", "expert_tensor_parallel_size", "micro_batch_size",
    "global_batch_size", "use_distributed_optimizer", "pipeline_model_parallel_layout",
    "decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers",
    "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split",
    "num_layers_per_virtual_pipeline_stage", "num_virtual_stages_per_pipeline_rank",
}  # fmt: skip
# Older Megatron's names for core's dests, same meaning.
_RENAMED = {"apply_layernorm_1p": "layernorm_zero_centered_gamma"}
# Not in core's table, and deciding the model or the split: an error when set.
_REFUSED = frozenset({"standalone_embedding_stage", "retro_add_retriever", "num_experts_switch"})
# Keys of another model than the GPT trained (vision, retrieval, a distillation teacher) or of a
# checkpoint conversion's target (Pai's ``target_*``).
_OTHER_MODELS = ("retro_", "dino_", "kd_", "target_", "vision_", "img_", "biencoder_", "ict_")
_OFF = frozenset({"None", "none", "False", "0", "0.0", "", "[]", "()"})
_TORCH_DTYPES = {"torch.float32": "fp32", "torch.float16": "fp16", "torch.bfloat16": "bf16"}
_TORCH_DTYPES |= {"torch.uint8": "fp8"}
_ENUM = re.compile(r"[A-Z]\w*\.(?P<member>\w+)")
# A fork's store_false switch whose table entry names another dest: key -> its flag.
_STORED_FALSE = {"moe_token_dropping": "--disable-moe-token-dropping"}  # Megatron-DeepSpeed's
# Megatron-DeepSpeed's MoE keys and their defaults there (its megatron/arguments.py).
_DEEPSPEED_MOE = {"expert_interval": "2", "topk": "1", "mlp_type": "standard"}
_DEEPSPEED_MOE |= {"moe_expert_parallel_size": "1"}

Keys = dict[str, tuple[str, int]]  # name -> (value as printed, its line)


@dataclass(frozen=True)
class DeepSpeedMoE:
    """What Megatron-DeepSpeed's MoE keys say the run built, to check the loader's reading."""

    experts: tuple[int, ...]  # routed experts of each decoder layer, 1 for a dense one
    topk: int
    residual: bool  # mlp_type residual: PR-MoE's dense MLP beside the experts
    ep: int
    given: Mapping[str, tuple[str, int]] = field(hash=False)  # key -> (value, line)


@dataclass(frozen=True)
class BlockFlags:
    """The block as command-line words, each flag's line in the log (to place an error), what
    loading should say, and Megatron-DeepSpeed's MoE as its keys state it."""

    words: tuple[str, ...]
    lines: Mapping[str, int] = field(hash=False)  # flag -> line
    notes: tuple[str, ...] = ()
    deepspeed_moe: DeepSpeedMoE | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "lines", MappingProxyType(dict(self.lines)))


def int_value(
    values: Mapping[str, str], lines: Mapping[str, int], key: str, source: str
) -> int | None:
    """A count of the block (None when absent or printed None), or an error at its line."""
    text = values.get(key)
    if text is None or text == "None":
        return None
    if not re.fullmatch(r"[0-9]{1,9}", text):
        raise ConfigError(f"{source}:{lines[key]}: {key} {quoted(text)} is not a count")
    return int(text)


def block_flags(values: Mapping[str, str], lines: Mapping[str, int], source: str) -> BlockFlags:
    """The command line of the run the block describes (see the module's docstring)."""
    keys: Keys = {name: (value, lines[name]) for name, value in values.items()}
    for name in _DERIVED & keys.keys():
        del keys[name]
    for old, new in _RENAMED.items():
        if old in keys and new not in keys:
            keys[new] = keys.pop(old)
    dialect, marking = _dialect(keys, source)
    if dialect is CORE:
        _positions(keys, source)
        _recompute(keys)
        if keys.get("group_query_attention", ("False", 0))[0] != "True":
            keys.pop("num_query_groups", None)  # core ignores it without GQA
    _pipeline(keys)
    if keys.get("weight_decay_incr_style", ("constant", 0))[0] == "constant":
        for name in ("start_weight_decay", "end_weight_decay"):  # the decay's, asserted unset
            keys.pop(name, None)
    moe = _deepspeed_moe(keys, source) if dialect.name == "Megatron-DeepSpeed" else None
    entries = _by_dest(dialect)
    words: list[str] = []
    flag_lines: dict[str, int] = {}
    left_out = []
    for name, (text, line) in keys.items():
        if _other_model(name):
            _refuse_if_sizing(name, text, line, source)
            continue
        found = entries.get(name)
        got = _words(name, text, found, name in marking, f"{source}:{line}") if found else None
        if name in _STORED_FALSE and text in ("True", "False"):
            got = (_STORED_FALSE[name],) if text == "False" else ()
        if got is None:
            _refuse_if_sizing(name, text, line, source)
            left_out += [] if text in _OFF else [name]
            continue
        words += got
        flag_lines.update(dict.fromkeys((w.partition("=")[0] for w in got[:1]), line))
    notes = [_left_out_note(left_out, dialect, source)] if left_out else []
    return BlockFlags(tuple(words), flag_lines, tuple(notes), moe)


def _dialect(keys: Keys, source: str) -> tuple[Dialect, frozenset[str]]:
    """The fork whose model flags the block sets (core's when none), and those keys: a block
    prints every flag its Megatron has, so a key set there is the fork's own mark."""
    found = []
    for dialect in DIALECTS:
        marking = frozenset(
            flag.key
            for flag in dialect.flags
            if flag.marks and flag.effect == "read" and not _other_model(flag.key)
            if keys.get(flag.key, ("None", 0))[0] not in _OFF
        )
        found += [(dialect, marking)] if marking else []
    if len(found) > 1:
        said = "; ".join(f"{d.name} ({', '.join(sorted(marks)[:3])})" for d, marks in found)
        raise ConfigError(f"{source}: the arguments block has keys of more than one fork: {said}")
    return found[0] if found else (CORE, frozenset())


@cache
def _by_dest(dialect: Dialect) -> Mapping[str, tuple[dict[str, Any], ...]]:
    """A table by dest: every entry that stores into it."""
    by_dest: dict[str, list[dict[str, Any]]] = {}
    for entry in {id(e): e for e in dialect.table().values()}.values():
        if entry["dest"]:
            by_dest.setdefault(entry["dest"], []).append(entry)
    return MappingProxyType({dest: tuple(found) for dest, found in by_dest.items()})


def _words(
    dest: str, text: str, entries: tuple[dict[str, Any], ...], always: bool, where: str
) -> tuple[str, ...] | None:
    """The flag words for a printed value: () where it is the default (or None) unless
    ``always``; None where no flag of the table can say it."""
    entry = entries[0]
    if text == "None":
        return ()
    if entry["nargs"] == 0:
        if text not in ("True", "False"):
            return None
        value = text == "True"
        if value == bool(entry["default"]) and not always:
            return ()
        flags = [flag for e in entries for flag in e["flags"]]
        table = {flag: e for e in entries for flag in e["flags"]}
        stored = (parse_flags([f], where, table=table).get(dest) for f in flags)
        return next(((f,) for f, s in zip(flags, stored, strict=True) if s is value), None)
    if _is_default(text, entry["default"]) and not always:
        return ()
    text = _flag_text(text, entry)
    items = [text] if entry["nargs"] is None else _items(text)
    if not items:
        return ()
    use = FlagUse(entry["flags"][0], entry, tuple(items))
    try:
        for item in items:
            typed_value(use, item, where)
    except ConfigError:
        if dest in _READ:
            raise
        return None
    if entry["nargs"] is None and text.startswith("-"):  # a value argparse would take for a flag
        return (f"{entry['flags'][0]}={text}",)
    return (entry["flags"][0], *items)


def _is_default(text: str, default: Any) -> bool:
    """Whether the printed value is the table's default (a number however written)."""
    if default is None:
        return False
    if isinstance(default, int | float) and not isinstance(default, bool):
        try:
            return float(text) == float(default)
        except ValueError:
            return False
    if text == str(default):
        return True
    value = _literal(text)
    return value is not None and value == _literal(str(default))


def _flag_text(text: str, entry: dict[str, Any]) -> str:
    """A printed value as the flag takes it: an enum's member, a torch dtype's short name, a
    choice in its table's spelling (``rmsnorm`` -> ``RMSNorm`` in core's), a list expression
    without blanks (Megatron's ``moe_freq_type`` refuses them)."""
    choices = [str(c) for c in entry["choices"] or ()]
    if (enum := _ENUM.fullmatch(text)) and (not choices or text in choices):
        return enum["member"]
    if text in _TORCH_DTYPES and _TORCH_DTYPES[text] in choices:
        return _TORCH_DTYPES[text]
    spelled = {c.lower(): c for c in choices}
    if choices and text not in choices and text.lower() in spelled:
        return spelled[text.lower()]
    if entry["nargs"] is None and text[:1] in ("[", "("):
        return re.sub(r"\s+", "", text)
    return text


def _items(text: str) -> list[str]:
    """The words of a list value (``['a', 'b']``), or the value itself."""
    value = _literal(text)
    if isinstance(value, list | tuple):
        return [str(item) for item in value]
    return [text]


def _literal(text: str) -> Any:
    """A Python literal as printed, or None."""
    try:
        return ast.literal_eval(text)
    except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
        return None


def _positions(keys: Keys, source: str) -> None:
    """Older Megatron-LM's ``use_rotary_position_embeddings`` and ``add_position_embedding``
    (``--no-position-embedding``) as core's ``position_embedding_type``."""
    rope = keys.pop("use_rotary_position_embeddings", None)
    learned = keys.pop("add_position_embedding", None)
    if "position_embedding_type" in keys:  # core's: validate_args has settled it
        return
    if rope and rope[0] == "True":
        if learned and learned[0] == "True":
            raise ConfigError(
                f"{source}:{learned[1]}: add_position_embedding True with rotary embeddings "
                f"(line {rope[1]}): learned and rotary positions together, which Megatron "
                "core_v0.16.1 cannot build"
            )
        keys["position_embedding_type"] = ("rope", rope[1])
    elif learned and learned[0] == "False":
        keys["position_embedding_type"] = ("none", learned[1])


def _recompute(keys: Keys) -> None:
    """Older Megatron-LM's ``checkpoint_activations`` (full, uniform, ``checkpoint_num_layers``
    a chunk) and ``recompute_activations`` (selective) as core's recompute flags; without a
    granularity the method and count mean nothing."""
    activations = keys.pop("checkpoint_activations", None)
    chunk = keys.pop("checkpoint_num_layers", None)
    selective = keys.pop("recompute_activations", None)
    if keys.get("recompute_granularity", ("None", 0))[0] != "None":
        return
    if activations and activations[0] == "True":
        line = activations[1]
        keys["recompute_granularity"] = ("full", line)
        keys["recompute_method"] = ("uniform", line)
        keys["recompute_num_layers"] = (chunk[0] if chunk else "1", line)
    elif selective and selective[0] == "True":
        keys["recompute_granularity"] = ("selective", selective[1])
    else:
        for name in ("recompute_method", "recompute_num_layers"):
            keys.pop(name, None)


def _pipeline(keys: Keys) -> None:
    """A VPP size Megatron printed but no flag of the block gives (a fork's
    ``--virtual-pipeline-model-parallel-size``) as core's virtual stages per rank; without VPP,
    no p2p overlap of Megatron's own choosing (validate_args turns it off)."""
    vpp = keys.pop("virtual_pipeline_model_parallel_size", None)
    split = (
        "num_layers_per_virtual_pipeline_stage",
        "num_virtual_stages_per_pipeline_rank",
        "pipeline_model_parallel_layout",
    )
    if any(keys.get(name, ("None", 0))[0] != "None" for name in split):
        return
    if vpp and vpp[0] not in ("None", "1"):
        keys["num_virtual_stages_per_pipeline_rank"] = vpp
    else:
        for name in ("overlap_p2p_comm", "align_param_gather"):
            keys.pop(name, None)


def _deepspeed_moe(keys: Keys, source: str) -> DeepSpeedMoE | None:
    """Megatron-DeepSpeed's MoE as its keys state it: ``num_experts`` one count for every MoE
    layer or one each, experts on every ``expert_interval``-th layer from layer 1
    (``get_num_experts_per_layer``); None for a dense model."""
    text, line = keys.get("num_experts", ("None", 0))
    counts = _literal(text)
    if not isinstance(counts, list) or all(n == 1 for n in counts):
        return None
    if not all(type(n) is int and n > 0 for n in counts):
        raise ConfigError(f"{source}:{line}: num_experts {quoted(text)} is no list of counts")
    given = {key: keys.get(key, (default, line)) for key, default in _DEEPSPEED_MOE.items()}
    layers, interval, topk, ep = (
        _count(keys | given, key, source)
        for key in ("num_layers", "expert_interval", "topk", "moe_expert_parallel_size")
    )
    slots = layers // interval
    if len(counts) not in (1, slots):
        raise ConfigError(
            f"{source}:{line}: num_experts {quoted(text)} is neither one count nor one for each "
            f"of the {slots} MoE layers (every {interval}th of {layers})"
        )
    counts = counts * slots if len(counts) == 1 else counts
    per_layer = [
        counts[(n - 1) // interval] if n % interval == 0 else 1 for n in range(1, layers + 1)
    ]
    residual = given["mlp_type"][0] == "residual"
    return DeepSpeedMoE(
        tuple(per_layer), topk, residual, ep, {**given, "num_experts": (text, line)}
    )


def _count(keys: Keys, key: str, source: str) -> int:
    """A count of at least 1 that the model needs from the block."""
    value, line = keys.get(key, ("None", 0))
    count = int_value({key: value}, {key: line}, key, source)
    if not count:
        raise ConfigError(f"{source}:{line}: {key} {quoted(value)} must be a count of at least 1")
    return count


def check_deepspeed_moe(
    expected: DeepSpeedMoE, recipe: Recipe, overridden: set[str], source: str
) -> None:
    """The loader read Megatron-DeepSpeed's MoE as the run built it, or an error naming the first
    key it did not read: a model sized wrong is refused."""
    m = recipe.model
    wanted = tuple(n if n > 1 else 0 for n in expected.experts)
    got = m.experts_per_layer
    read = {
        "expert_interval": (tuple(map(bool, got)) == tuple(map(bool, wanted)),
                            f"MoE on {sum(map(bool, got))} of {m.num_layers} layers"),
        "num_experts": (got == wanted, f"{', '.join(map(str, sorted(set(got) - {0})))} experts"),
        "topk": (m.moe_router_topk == expected.topk, f"top-{m.moe_router_topk} routing"),
        "mlp_type": (m.moe_residual == expected.residual,
                     "residual" if m.moe_residual else "standard"),
        "moe_expert_parallel_size": ("ep" in overridden or recipe.parallel.ep == expected.ep,
                                     f"EP {recipe.parallel.ep}"),
    }  # fmt: skip
    for key, (right, what) in read.items():
        if not right:
            value, line = expected.given[key]
            raise ConfigError(
                f"{source}:{line}: {key} {value} (Megatron-DeepSpeed's --"
                f"{key.replace('_', '-')}) is not what this tool's model reads ({what}): "
                "refused rather than sized wrong"
            )


def _other_model(name: str) -> bool:
    return (name.startswith(_OTHER_MODELS) and name not in _REFUSED) or name.endswith("_teacher")


def _refuse_if_sizing(name: str, text: str, line: int, source: str) -> None:
    """A key no table carries that is set and may decide the model's size or split."""
    if text in _OFF or (_other_model(name) and name not in _REFUSED):
        return
    if name in _REFUSED or looks_like_shape(name):
        raise ConfigError(
            f"{source}:{line}: {name} {quoted(text)} is in no flag table this tool reads and "
            "may change the model's size or split: refused rather than sized wrong"
        )


def _left_out_note(names: list[str], dialect: Dialect, source: str) -> str:
    shown = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
    table = "Megatron core_v0.16.1's" if dialect is CORE else f"{dialect.name}'s (and core's)"
    return (
        f"{source}: {len(names)} keys of the arguments block set no flag of {table} table and "
        f"are not carried: {shown}"
    )
