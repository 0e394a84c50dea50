"""A recipe from a Megatron-LM launch script, model file or command line: the model, the parallel
sizes, the split the job runs today, and the user's own flags and environment.

Megatron takes the world size from the launcher, so DP comes from torchrun's
``--nproc_per_node`` and ``--nnodes`` when the command has them; otherwise it is the smallest DP
that Megatron's expert grid allows (1 without expert parallelism), to be overridden once the real
world size is known.  ``Overrides`` (the commands' ``--env``, ``--pp``, ``--seq-length``, ...)
go in *before* anything is checked: a script whose ``--nnodes`` comes from the job's
environment is read with ``--env NNODES=4`` or ``--dp``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ray_layout.errors import ConfigError, LayoutError
from ray_layout.model.dialects import CORE, Dialect, ReadContext, dialect_of, looks_like_shape
from ray_layout.model.fields import MEGATRON_DEFAULTS, MODEL_FIELDS, MODEL_KEYS
from ray_layout.model.files import read_text
from ray_layout.model.megatron_args import (
    FlagTable,
    FlagUse,
    UnresolvedArgument,
    megatron_flag_table,
    parse_flags,
    unknown_flags_note,
    walk_flags,
)
from ray_layout.model.spec import PARALLEL_KEYS, Recipe, build_recipe
from ray_layout.model.split import PipelineSplit, current_layout, virtual_pipeline_size
from ray_layout.shell.launch import LaunchReading, read_launch
from ray_layout.shell.refusal import ShellError
from ray_layout.shell.values import ExpandedWord

_PARALLEL_FIELDS = {
    "tensor_model_parallel_size": "tp",
    "pipeline_model_parallel_size": "pp",
    "context_parallel_size": "cp",
    "expert_model_parallel_size": "ep",
    "expert_tensor_parallel_size": "etp",
    "micro_batch_size": "micro_batch_size",
    "global_batch_size": "global_batch_size",
    "use_distributed_optimizer": "use_distributed_optimizer",
}
_SPLIT_FIELDS = {
    "pipeline_model_parallel_layout": "layout",
    "decoder_first_pipeline_num_layers": "first_stage_layers",
    "decoder_last_pipeline_num_layers": "last_stage_layers",
    "account_for_embedding_in_pipeline_split": "account_for_embedding",
    "account_for_loss_in_pipeline_split": "account_for_loss",
    "num_layers_per_virtual_pipeline_stage": "layers_per_virtual_stage",
    "num_virtual_stages_per_pipeline_rank": "virtual_stages",
}
# Megatron's defaults for these differ from this project's (which follow modern MoE models), so a
# command line that leaves them out means what Megatron means: taken from the flag table.
_MEGATRON_DEFAULTS = MEGATRON_DEFAULTS | {"use_distributed_optimizer"}
_REQUIRED = tuple(f.name for f in MODEL_FIELDS if f.required and not f.mla)
_ASKED_AS = {"seq_length": "--seq-length N", "vocab_size": "--vocab-size N"}  # on our commands
_DIVISORS = (  # sizes this module divides by; build_recipe checks the others
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
    "context_parallel_size",
    "expert_model_parallel_size",
    "expert_tensor_parallel_size",
    "num_layers_per_virtual_pipeline_stage",
    "num_virtual_stages_per_pipeline_rank",
)
_USED = MODEL_KEYS | set(_PARALLEL_FIELDS) | set(_SPLIT_FIELDS)
_LAUNCHER_SIZES = {"--nproc_per_node": "nproc", "--nproc-per-node": "nproc", "--nnodes": "nnodes"}


@dataclass(frozen=True)
class Overrides:
    """What the user says on our command line about a config: the job's environment
    (``--env``), and sizes that replace the config's (``ParallelConfig`` field names, plus
    ``seq_length`` and ``vocab_size``)."""

    environment: Mapping[str, str] = field(default_factory=dict)
    sizes: Mapping[str, int] = field(default_factory=dict)
    arguments: tuple[str, ...] | None = None  # the script's own ($1 ...), given after --


_OVERRIDE_DESTS = {field: dest for dest, field in _PARALLEL_FIELDS.items()} | {
    "seq_length": "seq_length",
    "vocab_size": "vocab_size",
    "vpp": "num_virtual_stages_per_pipeline_rank",
}


def load_megatron_command_line(
    text: str, source: str = "command line", overrides: Overrides | None = None
) -> Recipe:
    """A recipe from the text of a ``pretrain_gpt.py`` command line (or a whole launch script)."""
    return _load(text, source, "megatron-cmdline", overrides or Overrides())


def load_megatron_script(path: str | Path, overrides: Overrides | None = None) -> Recipe:
    """A recipe from a launch script or model file; named after the file."""
    path = Path(path)
    text = read_text(path, str(path))
    return _load(text, str(path), path.stem, overrides or Overrides())


def _without_vanished(
    arguments: tuple[ExpandedWord, ...], table: FlagTable
) -> tuple[ExpandedWord, ...]:
    """The launch's words as bash passes them: an unset variable alone (``$EXTRA_ARGS``) is no
    word, unless it stands where a flag's value goes (``--nnodes $NNODES``), where it stays,
    for the error to name it."""
    kept: list[ExpandedWord] = []
    for word in arguments:
        before = kept[-1].text if kept else ""
        takes_value = table.get(before, {}).get("nargs", 0) != 0 and "=" not in before
        if word.vanishes and not takes_value:
            continue
        kept.append(word)
    return tuple(kept)


def sourced_file(path: str) -> str | None:
    """A file the script ``source``s, read as every input file is; None where there is none
    (the reader then says what it may have set is unknown)."""
    if not Path(path).is_file():
        return None
    return read_text(Path(path), path)


def _load(text: str, source: str, name: str, overrides: Overrides) -> Recipe:
    """The recipe, carrying the script's flags as the user's own (``Recipe.megatron_args``: a
    profiling run is the user's job) and what the job's environment gets
    (``Recipe.environment``: NCCL and CUDA settings change what a run measures)."""
    try:
        launch = read_launch(text, source, overrides.environment, overrides.arguments, sourced_file)
    except ShellError as exc:
        raise ConfigError(str(exc)) from None
    words = [w.text for w in launch.arguments]
    unresolved = [w.unknown is not None for w in launch.arguments]  # `--x=$UNSET` too
    entry_point = _entry_point(launch)
    dialect = dialect_of(words, entry_point, source)
    table = dialect.table()
    launch = replace(launch, arguments=_without_vanished(launch.arguments, table))
    words = [w.text for w in launch.arguments]
    unresolved = [w.unknown is not None for w in launch.arguments]
    parsed = parse_flags(words, source, unresolved, table)
    notes = list(launch.notes)
    parsed, split_note = _with_overrides(parsed, overrides)
    notes += [split_note] if split_note else []
    given = frozenset(_OVERRIDE_DESTS[k] for k in overrides.sizes if k in _OVERRIDE_DESTS)
    reading = dialect.read(ReadContext(parsed, given, entry_point, source))
    parsed = {**parsed, **reading.values}
    if dialect is not CORE:
        said = ", ".join(dialect.marks(words, entry_point)[:3])
        notes.append(f"{source}: read as {dialect.name}'s command line ({said})")
    notes += reading.notes
    if parsed.get("spec"):  # the user's own layer classes: their parameters are theirs
        spec = (
            " ".join(map(str, parsed["spec"]))
            if isinstance(parsed["spec"], list)
            else parsed["spec"]
        )
        notes.append(
            f"{source}: --spec {spec} builds layers of its own: sized as megatron-core's "
            "standard GPT layers of the same flags"
        )
    world = None if "dp" in overrides.sizes else _world_size(launch.launcher, source)
    recipe = _recipe(parsed, world, name, source, launch, overrides, table, reading.parallel)
    if "dp" in overrides.sizes:
        recipe = replace(recipe, parallel=replace(recipe.parallel, dp=overrides.sizes["dp"]))
    flags, unknown, left_out = _user_flags(launch.arguments, source, table)
    notes += _unknown_flags(unknown, dialect, source)
    if launch.prefixed:
        notes.append(
            f"{source}: the launch line sets {', '.join(launch.prefixed)} for the job: "
            "they go into every rank's environment, as its exports do"
        )
    return replace(
        recipe,
        megatron_args=flags,
        environment=launch.environment,
        unresolved_environment=launch.unresolved_environment,
        unresolved_arguments=left_out,
        notes=tuple(notes),
        dialect="" if dialect is CORE else dialect.name,
    )


def _entry_point(launch: LaunchReading) -> str:
    """The Python file the launch runs (a fork's entry point tells its model code apart); ""
    for a model file."""
    return launch.entry.text if launch.entry is not None else ""


def _unknown_flags(unknown: Sequence[str], dialect: Dialect, source: str) -> list[str]:
    """Flags no table knows: one whose name speaks of the model's shape is an error (the model
    may be another than the one sized), the rest one note."""
    shaped = [flag for flag in unknown if looks_like_shape(flag)]
    if shaped:
        whose = "Megatron core_v0.16.1's flag table" if dialect is CORE else f"{dialect.name}'s"
        raise ConfigError(
            f"{source}: {shaped[0]} is not in {whose} flags and may change the model's size "
            "(its name says so); this tool cannot size it"
        )
    return [unknown_flags_note(unknown, source)] if unknown else []


def _with_overrides(
    parsed: dict[str, Any], overrides: Overrides
) -> tuple[dict[str, Any], str | None]:
    """The parsed flags with the user's sizes in place; a split the new PP (or VPP) cannot
    keep is dropped, with the note that says so."""
    given = {_OVERRIDE_DESTS[k]: v for k, v in overrides.sizes.items() if k in _OVERRIDE_DESTS}
    merged = parsed | given
    note = None
    pp_changed = "pipeline_model_parallel_size" in given and given[
        "pipeline_model_parallel_size"
    ] != parsed.get("pipeline_model_parallel_size", 1)
    vpp_given = "num_virtual_stages_per_pipeline_rank" in given
    split = {dest for dest in _SPLIT_FIELDS if dest in parsed}
    if split and (pp_changed or vpp_given):
        dropped = sorted(split - ({"num_virtual_stages_per_pipeline_rank"} if vpp_given else set()))
        merged = {k: v for k, v in merged.items() if k not in dropped}
        if dropped:
            what = "--pp" if pp_changed else "--vpp"
            flags = ", ".join("--" + d.replace("_", "-") for d in dropped)
            note = f"{what} replaces the script's pipeline split ({flags}): no current layout"
    return merged, note


def _user_flags(
    arguments: Sequence[ExpandedWord], source: str, table: FlagTable | None = None
) -> tuple[tuple[str, ...], tuple[str, ...], tuple[UnresolvedArgument, ...]]:
    """(the user's flags as words, the flags the table does not know, and the flags whose value
    the job's environment gives)."""
    words = [w.text for w in arguments]
    flags: list[str] = []
    left_out: list[UnresolvedArgument] = []
    unknown: list[str] = []
    taken: set[int] = set()
    for use, reason in _uses(arguments, source, table):
        taken.update(use.span)
        if reason:
            text = " ".join(words[i] for i in use.span)
            where = f"{source}:{arguments[use.position].line}"
            left_out.append(UnresolvedArgument(use.flag, text, where, reason))
            continue
        if not use.known:
            unknown.append(use.flag)
        flags += [words[use.position]] if use.inline else [use.flag, *use.values]
    for index, word in enumerate(arguments):
        if index not in taken and word.unresolved:
            left_out.append(
                UnresolvedArgument("", word.text, f"{source}:{word.line}", word.unresolved)
            )
    return tuple(flags), tuple(dict.fromkeys(unknown)), tuple(left_out)


def _world_size(launcher: Sequence[ExpandedWord], source: str) -> int | None:
    """Processes started by torchrun's --nproc_per_node and --nnodes; None when neither is given."""
    sizes: dict[str, int] = {}
    for i, word in enumerate(launcher):
        flag, has_inline, inline = word.text.partition("=")
        if flag not in _LAUNCHER_SIZES:
            continue
        value = word if has_inline else (launcher[i + 1] if i + 1 < len(launcher) else None)
        text = inline if has_inline else (value.text if value else "")
        if value is not None and value.unknown:
            raise ConfigError(f"{source}:{word.line}: torchrun {flag} uses {_or_dp(value.unknown)}")
        size = int(text) if text.isascii() and text.isdigit() and len(text) <= 9 else 0
        if size < 1:
            raise ConfigError(
                f"{source}:{word.line}: torchrun {flag} {text!r} is not a fixed count, so the "
                "world size is unknown: give --dp"
            )
        sizes[_LAUNCHER_SIZES[flag]] = size
    return math.prod(sizes.values()) if sizes else None


def _or_dp(reason: str) -> str:
    """Why a torchrun size is unknown, with --dp as the other way to give it."""
    if reason.endswith("=VALUE)"):
        return reason.removesuffix(")") + ", or --dp)"
    return f"{reason}: give --dp"


def _recipe(
    parsed: dict[str, Any],
    world: int | None,
    name: str,
    source: str,
    launch: LaunchReading,
    overrides: Overrides,
    table: FlagTable | None = None,
    forks_parallel: Mapping[str, Any] | None = None,
) -> Recipe:
    """Megatron's parsed arguments as this project's model, parallel and split fields (with a
    fork's parallel facts, ``forks_parallel``, in place)."""
    lines = _flag_lines(launch.arguments, table)
    for dest, value in parsed.items():
        if dest in _USED and isinstance(value, str) and dest in lines and lines[dest][1]:
            line, reason = lines[dest]
            raise ConfigError(f"{source}:{line}: {_flag(dest)} uses {reason}")
        if dest in _DIVISORS and isinstance(value, int) and value < 1:
            raise ConfigError(f"{source}: {_flag(dest)} must be >= 1, got {value}")
    missing = [dest for dest in _REQUIRED if dest not in parsed]
    if missing:
        raise ConfigError(_missing_message(missing, parsed, source, launch.is_model_file))
    table = megatron_flag_table().values()
    values = {e["dest"]: e["default"] for e in table if e["dest"] in _MEGATRON_DEFAULTS} | parsed
    model = {key: value for key, value in values.items() if key in MODEL_KEYS} | {"name": name}
    if values.get("tokenizer_type") == "NullTokenizer" and "vocab_size" not in overrides.sizes:
        model["vocab_size"] += 1  # NullTokenizer adds an end-of-document token to --vocab-size
    parallel = {field: values[dest] for dest, field in _PARALLEL_FIELDS.items() if dest in values}
    parallel |= forks_parallel or {}
    parallel.setdefault("etp", parallel.get("tp", 1))  # Megatron: expert TP defaults to TP
    split = PipelineSplit(**{f: values[d] for d, f in _SPLIT_FIELDS.items() if d in values})
    pp = parallel.get("pp", 1)
    try:
        vpp = virtual_pipeline_size(split, values["num_layers"], pp)
    except LayoutError as exc:
        where = f"{_flag('pipeline_model_parallel_layout')}: " if split.layout else ""
        raise ConfigError(f"{source}: {where}{exc}") from None
    if vpp is not None:
        parallel["vpp"] = vpp
    model_parallel = parallel.get("tp", 1) * parallel.get("cp", 1) * pp
    if world is None:  # unknown: the smallest DP that the expert grid allows (1 without EP)
        grid = parallel["etp"] * pp  # DeepSpeed's expert groups split each TP rank's DP
        grid = model_parallel if parallel.get("expert_groups") == "deepspeed" else grid
        world = math.lcm(model_parallel, grid * parallel.get("ep", 1))
    if world % model_parallel:
        raise ConfigError(
            f"{source}: torchrun world size {world} is not divisible by TP·CP·PP = {model_parallel}"
        )
    parallel["dp"] = world // model_parallel
    recipe = build_recipe(
        model, {k: v for k, v in parallel.items() if k in PARALLEL_KEYS}, source=source
    )
    m = recipe.model
    try:
        current_layout(
            m.num_layers,
            m.mtp_num_layers,
            pp,
            recipe.parallel.vpp,
            split,
            tied_embeddings=m.tied_embeddings,
        )
    except LayoutError as exc:
        raise ConfigError(f"{source}: the script's pipeline split: {exc}") from None
    return replace(recipe, split=split)


def _flag_lines(
    arguments: Sequence[ExpandedWord], table: FlagTable | None = None
) -> dict[str, tuple[int, str | None]]:
    """dest -> (line, why its value is unknown, or None) of each known flag's last use."""
    return {
        use.entry["dest"]: (arguments[use.position].line, reason)
        for use, reason in _uses(arguments, "arguments", table, missing_too=True)
        if use.known
    }


def _uses(
    arguments: Sequence[ExpandedWord],
    source: str,
    table: FlagTable | None = None,
    *,
    missing_too: bool = False,
) -> Iterator[tuple[FlagUse, str | None]]:
    """Each flag of the arguments as Megatron's argparse takes it, with why one of its words is
    not known here (a value the job's environment gives), if so; ``missing_too``: also a word
    with a variable nothing set in it (``--x=$UNSET``, a value this tool needs).  Passed on, such
    a word is what bash would pass."""
    words = [w.text for w in arguments]
    for use in walk_flags(words, source, strict=False, table=table, keep_unknown=True):
        reasons = (
            arguments[i].unknown if missing_too else arguments[i].unresolved for i in use.span
        )
        yield use, next((reason for reason in reasons if reason), None)


def _missing_message(
    missing: Sequence[str], parsed: dict[str, Any], source: str, model_file: bool
) -> str:
    """What the config lacks, asked for by the flag our commands take."""
    structural = [d for d in missing if d not in _ASKED_AS]
    if structural:
        where = "the model file" if model_file else "the command line"
        return f"{source}: {where} has no {_flag(structural[0])}"
    asked = " and ".join(_ASKED_AS[d] for d in missing)
    reason = ""
    if "vocab_size" in missing and parsed.get("tokenizer_type"):
        reason = f" (Megatron reads the vocabulary from the {parsed['tokenizer_type']}, which "
        reason += "this tool does not load)"
    return f"{source}: give {asked}{reason}"


def _flag(dest: str) -> str:
    """The option string of a dest this module uses (they all follow argparse's naming)."""
    return "--" + dest.replace("_", "-")
