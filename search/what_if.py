"""When no layout fits: which of the memory flags real jobs use would make which layout fit.

"Try recompute" is no answer a user can act on; re-planning under each setting is. Each what-if
adds one set of flags to the job's own (``ray_layout.model.memory_settings``), plans again under
the same HBM limit and reports the pick, its largest stage and what recomputing costs its step,
or the smallest peak still left.
The steps go from what costs the least step time (selective recompute of the cheap modules, a
bf16 optimizer state) to what costs the most (full recompute of every layer).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ray_layout.model.fields import ModelSpec
from ray_layout.model.layout import Layout
from ray_layout.model.memory_settings import MemorySettings
from search.planner import Problem, plan
from search.recompute_search import recompute_price

WHAT_IF_TIME_S = 2.0  # per re-plan: an answer in seconds beats a proven optimum here


@dataclass(frozen=True)
class WhatIf:
    """One setting re-planned: its flags, and the pick it allows (None: still nothing fits)."""

    flags: tuple[str, ...]
    layout: Layout | None
    largest_stage_gib: float  # the pick's largest stage, or the smallest peak of any layout
    mean_ms: float | None = None
    recompute_cost: float = 0.0  # the pick's step over its layout's without recomputation

    def line(self, hbm_gib: float) -> str:
        with_flags = f"with `{' '.join(self.flags)}`"
        if self.layout is None:
            return (
                f"{with_flags} still no layout fits in {hbm_gib:g} GiB: the smallest peak is "
                f"{self.largest_stage_gib:,.1f} GiB"
            )
        priced = f", {self.recompute_cost:+.1%} for recomputation" if self.recompute_cost else ""
        return (
            f"{with_flags} the pick {self.layout} fits: its largest stage is "
            f"{self.largest_stage_gib:,.1f} GiB (step {self.mean_ms:,.1f} ms{priced})"
        )


def _selective(model: ModelSpec, settings: MemorySettings) -> MemorySettings | None:
    """Selective recompute of the modules that cost least to redo: the routed experts'
    activation, MLA's up-projections and the unfused norms (Megatron's own recipes' choice)."""
    if settings.recompute_granularity == "full":
        return None
    cheap = {"layernorm"}
    cheap |= {"moe_act"} if any(model.moe_layer_pattern) else set()
    cheap |= {"mla_up_proj"} if model.mla is not None else set()
    modules = settings.selective | cheap
    if modules == settings.selective:
        return None
    return replace(settings, recompute_granularity="selective", recompute_modules=modules)


def _bf16_optimizer(settings: MemorySettings) -> MemorySettings | None:
    """The precision-aware optimizer with bf16 moments: 6 bytes a parameter instead of 12."""
    lowered = replace(settings, precision_aware=True, exp_avg_bytes=2, exp_avg_sq_bytes=2)
    return (
        None if lowered.optimizer_bytes_per_param >= settings.optimizer_bytes_per_param else lowered
    )


def _full(settings: MemorySettings) -> MemorySettings | None:
    """Full recompute, one layer per checkpoint: the least memory, the most recomputation."""
    full = replace(
        settings, recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1
    )
    return None if full == settings else full


def _added(before: MemorySettings, after: MemorySettings) -> tuple[str, ...]:
    """The flags ``after`` sets that ``before`` does not: what the user would add."""
    recompute = (
        after.recompute_flags() if after.recompute_flags() != before.recompute_flags() else ()
    )
    optimizer = (
        after.optimizer_flags() if after.optimizer_flags() != before.optimizer_flags() else ()
    )
    return recompute + optimizer


def steps(model: ModelSpec, settings: MemorySettings) -> list[MemorySettings]:
    """The settings to try, cheapest first; each one the job does not already use."""
    selective, optimizer = _selective(model, settings), _bf16_optimizer(settings)
    both = _bf16_optimizer(selective) if selective is not None else None
    tried = [selective, optimizer, both, _full(settings)]
    return [s for s in dict.fromkeys(tried) if s is not None]


def what_ifs(problem: Problem) -> list[WhatIf]:
    """Each step re-planned under the problem's HBM limit (one shard, a short search)."""
    spec = replace(
        problem.spec, shards=1, time_limit_s=min(problem.spec.time_limit_s, WHAT_IF_TIME_S)
    )
    found = []
    for settings in steps(problem.model, problem.memory):
        result = plan(replace(problem, memory=settings, spec=spec))
        flags = _added(problem.memory, settings)
        if result.candidates:
            pick = result.candidates[0]
            cost = recompute_price(pick, replace(problem, memory=settings))
            found.append(WhatIf(flags, pick.layout, pick.peak_memory_gib, pick.mean_ms, cost))
        else:
            found.append(WhatIf(flags, None, result.smallest_peak_gib))
    return found
