"""The job's own Megatron flags that change what the tuner models, parsed once into one value.

A recipe's ``megatron_args`` are words; the memory model, the schedule simulator, the emulator
and the notes all need what some of those words mean: the recompute and optimizer settings, p2p
overlap, EP all-to-all overlap, the flags whose schedule is not simulated.  They are read here,
when the recipe is built, so a value Megatron would refuse is one line at load, and every layer
above reads :class:`JobFlags` instead of the words (a rank program still parses its own argv,
as Megatron does).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from ray_layout.model.megatron_args import parse_flags, walk_flags
from ray_layout.model.memory_settings import SOURCE, MemorySettings, memory_settings


@dataclass(frozen=True)
class EpOverlap:
    """The job's EP all-to-all overlap flags (the combined 1F1B schedule's)."""

    on: bool = False  # --overlap-moe-expert-parallel-comm
    delay_wgrad: bool = False  # --delay-wgrad-compute


NO_EP_OVERLAP = EpOverlap()

# Flags that change the schedule in ways not simulated: the plan and the tune say so once
_UNSIMULATED = {
    "overlap_p2p_comm_warmup_flush": "--overlap-p2p-communication-warmup-flush (the warm-up "
    "and cool-down also post early; simulated as without it)",
}
_SCHEDULE = frozenset(
    {"overlap_p2p_comm", "overlap_moe_expert_parallel_comm", "delay_wgrad_compute", *_UNSIMULATED}
)  # the schedule flags read here; a fork's other flags are not typed


@dataclass(frozen=True)
class JobFlags:
    """What the job's flags do to the modelled step and memory; the defaults are a plain run.

    ``p2p_overlap`` is Megatron's ``overlap_p2p_comm``: on unless
    ``--no-overlap-p2p-communication``, and only in effect with interleaving."""

    memory: MemorySettings = field(default_factory=MemorySettings)
    p2p_overlap: bool = True
    ep_overlap: EpOverlap = NO_EP_OVERLAP
    unsimulated: tuple[str, ...] = ()  # the flags kept on the runs whose schedule is not modelled
    cost_words: tuple[str, ...] = ()  # the flags that change unit costs, with their values


# The flags that change what a unit costs, so a study measured without them is another study
_COST_FLAG = re.compile(
    r"--(no-)?(bf16|fp16|fp8|fp4|first-last-layers-bf16|grad-reduce-in-bf16|recompute|"
    r"moe-layer-recompute|attention-backend|moe-router-dtype|transformer-impl|moe-grouped-gemm|"
    r"moe-token-dispatcher-type|use-precision-aware-optimizer)[-\w]*|--[-\w]*overlap[-\w]*"
)


def job_flags(args: Sequence[str], source: str = SOURCE) -> JobFlags:
    """The job's flags, typed; a one-line :class:`ConfigError` for a value Megatron would
    refuse (an unknown recompute module, a full recompute without its method)."""
    schedule = parse_flags(args, source, only=_SCHEDULE)
    return JobFlags(
        memory=memory_settings(args, source),
        p2p_overlap=schedule.get("overlap_p2p_comm", True),
        ep_overlap=EpOverlap(
            on=bool(schedule.get("overlap_moe_expert_parallel_comm")),
            delay_wgrad=bool(schedule.get("delay_wgrad_compute")),
        ),
        unsimulated=tuple(note for dest, note in _UNSIMULATED.items() if schedule.get(dest)),
        cost_words=cost_words(args, source),
    )


def cost_words(args: Sequence[str], source: str = SOURCE) -> tuple[str, ...]:
    """The flags that change unit costs (precision, recompute, fp8, attention backend, router
    dtype, overlap, grouped GEMM, ...), with their values, in order; a fork's own flags too."""
    return tuple(
        word
        for use in walk_flags(args, source, strict=False, keep_unknown=True)  # a fork's words too
        if _COST_FLAG.fullmatch(use.flag)
        for word in (use.flag, *use.values)
    )
