"""The user's own Megatron flags in a profiling run: which go through, which the tuner owns.

A profiling run must time the user's training job, so every flag of the user's command line
(a launch script's ``pretrain_gpt.py`` arguments, or ``megatron_args:`` of a YAML/JSON/HF config)
goes through unchanged, except the flags in :data:`TUNER_OWNED`: the layout and the split, the
iterations, the data (mock data unless the user keeps theirs), checkpoints, evaluation, and logging
and timers.  Those the tuner sets itself; so are the model shape and parallel sizes it writes from
the recipe (read from the same flags, or overridden by ``--pp`` and friends).  A profiling run
also turns EP all-to-all overlap off (:data:`PROFILING_OFF`).  Every replaced or
removed flag is reported once, as a note (``replaced --train-iters 500000 with 30``).

Flags are matched by their argparse ``dest``, so ``--no-x`` and aliases count as the same flag.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ray_layout.errors import ConfigError, InputError
from ray_layout.model.layout import parse_stages
from ray_layout.model.megatron_args import (
    FlagUse,
    UnresolvedArgument,
    megatron_flag_table,
    typed_value,
    walk_flags,
)
from ray_layout.model.moe_layer_freq import parse_moe_layer_freq

USER_SOURCE = "the user's Megatron flags"
# What the tuner sets in every profiling run, whatever the user's command line says, by group.
TUNER_OWNED: Mapping[str, tuple[str, ...]] = {
    "layout and split": (
        "--pipeline-model-parallel-layout",
        "--decoder-first-pipeline-num-layers",
        "--decoder-last-pipeline-num-layers",
        "--num-layers-per-virtual-pipeline-stage",
        "--num-virtual-stages-per-pipeline-rank",
        "--account-for-embedding-in-pipeline-split",
        "--account-for-loss-in-pipeline-split",
    ),
    "iterations": (
        "--train-iters", "--train-samples", "--lr-warmup-iters", "--lr-warmup-samples",
        "--lr-warmup-fraction", "--lr-decay-iters", "--lr-decay-samples", "--lr-wsd-decay-iters",
        "--lr-wsd-decay-samples", "--exit-interval", "--exit-duration-in-mins",
        "--rampup-batch-size",
    ),
    "data": (
        "--mock-data", "--data-path", "--train-data-path", "--valid-data-path",
        "--test-data-path", "--split", "--data-cache-path", "--data-args-path",
        "--per-split-data-args-path", "--tokenizer-type", "--tokenizer-model", "--vocab-file",
        "--merge-file", "--vocab-size",
    ),
    "checkpoint": (
        "--save", "--load", "--save-interval", "--pretrained-checkpoint",
        "--finetune", "--no-load-optim", "--no-load-rng", "--no-save-optim", "--no-save-rng",
        "--use-checkpoint-args", "--auto-detect-ckpt-format", "--async-save",
        "--non-persistent-save-interval", "--exit-on-missing-checkpoint", "--ckpt-step",
        "--use-dist-ckpt", "--use-persistent-ckpt-worker",
    ),
    "eval": ("--eval-iters", "--eval-interval", "--skip-train", "--full-validation"),
    "logging and timers": (
        "--log-interval", "--timing-log-level", "--timing-log-option", "--log-throughput",
        "--no-barrier-with-level-1-timing", "--tensorboard-dir", "--tensorboard-log-interval",
        "--log-timers-to-tensorboard", "--log-memory-to-tensorboard", "--log-params-norm",
        "--log-num-zeros-in-grad", "--log-validation-ppl-to-tensorboard",
        "--log-world-size-to-tensorboard", "--wandb-project", "--wandb-exp-name",
        "--wandb-save-dir", "--logging-level", "--log-progress", "--record-memory-history",
        "--profile", "--use-pytorch-profiler", "--profile-step-start", "--profile-step-end",
        "--profile-ranks",
    ),
}  # fmt: skip
DATA_GROUP = "data"
# Off in a profiling run, which must time each unit's forward and backward apart: combined 1F1B
# times every merged forward+backward step as forward-compute, and Megatron refuses it on PP > 1
# without VPP (the profile design's runs).  The A/B runs keep them: they time the user's job.
PROFILING_OFF = ("--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute")
PROFILING_OFF_REASON = (
    "EP overlap is off in profiling runs, whose timers must part forward from backward; "
    "the A/B runs keep it"
)


# Flags that change what a unit costs: the study id (the resume key) includes them.
@dataclass(frozen=True)
class MergedArguments:
    """A run's ``pretrain_gpt.py`` arguments and what became of the user's flags."""

    argv: tuple[str, ...]
    notes: tuple[str, ...]  # "replaced --train-iters 500000 with 30", "removed --save ..."


def owned_dests(keep_data: bool, profiling: bool = False) -> dict[str, str]:
    """dest -> why the tuner sets or removes the flag, for every flag it owns (the data group
    only under mock data; EP overlap only in a profiling run)."""
    table = megatron_flag_table()
    owned = {
        table[flag]["dest"]: f"{group}: the tuner's"
        for group, flags in TUNER_OWNED.items()
        if not (keep_data and group == DATA_GROUP)
        for flag in flags
    }
    if profiling:
        owned |= {table[flag]["dest"]: PROFILING_OFF_REASON for flag in PROFILING_OFF}
    return owned


def merge_arguments(
    tuner: Sequence[str],
    defaults: Sequence[str],
    user: Sequence[str],
    *,
    keep_data: bool = False,
    profiling: bool = False,
    unresolved: Sequence[UnresolvedArgument] = (),
) -> MergedArguments:
    """``tuner``'s arguments, then ``defaults`` the user did not set, then the user's flags that
    the tuner neither owns nor writes itself (a flag Megatron's bundled table does not know goes
    through as written); a ``profiling`` run leaves out :data:`PROFILING_OFF`.  ``unresolved``
    are the user's flags whose value only the job's environment has: one the tuner owns is left
    out with a note, any other is a :class:`ConfigError` naming it, its line and the variable."""
    tuner_uses = {use.entry["dest"]: use for use in walk_flags(tuner, "tuner", strict=True)}
    # argparse keeps a repeated flag's last value: so does the run, giving the flag once
    user_uses = list(
        {
            (u.entry["dest"] or u.flag): u
            for u in walk_flags(user, USER_SOURCE, strict=True, keep_unknown=True)
        }.values()
    )
    owned = owned_dests(keep_data, profiling)
    notes = _unresolved_notes(unresolved, set(owned) | set(tuner_uses))
    kept = []
    for use in user_uses:
        dest = use.entry["dest"]
        mine = tuner_uses.get(dest)
        if mine is not None:
            if _differs(use, mine, tuner_uses):
                now = " ".join(mine.values) if mine.flag == use.flag else _words(mine)
                notes.append(f"replaced {_words(use)} with {now}")
        elif dest in owned:
            notes.append(f"removed {_words(use)} ({owned[dest]})")
        else:
            kept += _as_words(use)
    given = {use.entry["dest"] for use in user_uses}
    default_uses = walk_flags(defaults, "tuner defaults", strict=True)
    unset = [w for use in default_uses if not _overridden(use, given) for w in _as_words(use)]
    return MergedArguments((*tuner, *unset, *kept), tuple(dict.fromkeys(notes)))


def _unresolved_notes(unresolved: Sequence[UnresolvedArgument], tuners: set[str]) -> list[str]:
    table = megatron_flag_table()
    groups = owned_dests(keep_data=False)
    notes = []
    for argument in unresolved:
        dest = table.get(argument.flag, {}).get("dest")
        if dest not in tuners:
            raise ConfigError(f"{argument.message}; a run passes it on, so it needs its value")
        reason = groups.get(dest, "set by the tuner: the tuner's")
        notes.append(f"removed {argument.text} ({reason})")
    return notes


# Precision is a choice of one: the tuner's default --bf16 gives way to the user's --fp16.
_SAME_CHOICE = {"bf16": {"bf16", "fp16"}}


def _overridden(default: FlagUse, given: set[str]) -> bool:
    dest = default.entry["dest"]
    return bool(_SAME_CHOICE.get(dest, {dest}) & given)


def _differs(user: FlagUse, tuner: FlagUse, tuner_uses: Mapping[str, FlagUse]) -> bool:
    """Whether two uses of one flag set different values (switches: --x against --no-x); a
    layout and a ``--moe-layer-freq`` are compared by what they mean, not how they are written
    (``Et*2|...`` and ``Ett|...``)."""
    if user.entry["nargs"] == 0:
        return user.flag != tuner.flag
    dest = user.entry["dest"]
    try:
        if dest == "pipeline_model_parallel_layout":
            return parse_stages(user.values[0]) != parse_stages(tuner.values[0])
        if dest == "moe_layer_freq" and "num_layers" in tuner_uses:
            layers = int(tuner_uses["num_layers"].values[0])
            patterns = [
                parse_moe_layer_freq(u.values[0], layers, source=USER_SOURCE) for u in (user, tuner)
            ]
            return patterns[0] != patterns[1]
    except InputError:
        return True
    typed = [
        tuple(typed_value(use, text, USER_SOURCE) for text in use.values) for use in (user, tuner)
    ]
    return typed[0] != typed[1]


def _as_words(use: FlagUse) -> list[str]:
    return [use.flag, *use.values]


def _words(use: FlagUse) -> str:
    return " ".join(_as_words(use))
