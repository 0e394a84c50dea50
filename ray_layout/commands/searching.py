"""What ``plan``, ``simulate`` and ``profile-layouts`` share: the unit costs a search runs on,
the micro-batch count, and the search's own settings."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ray_layout.commands.flags import Settings
from ray_layout.errors import ConfigError
from ray_layout.model.costs import (
    FLOPS_TFLOPS,
    TFLOPS_RANGE,
    UnitCosts,
    costs_from_flops,
    costs_warnings,
    load_costs,
    provenance_mismatches,
)
from ray_layout.model.dialects import deepspeed_moe
from ray_layout.model.layout import check_interleaving
from ray_layout.model.sizing import DECODER_UNITS
from ray_layout.model.spec import Recipe
from ray_layout.options.checks import (
    MAX_LAYER_PLACEMENTS,
    MAX_MICROBATCHES,
    MAX_SAMPLED_PASSES,
    MAX_SAMPLES,
    MAX_SCHEDULE_SLOTS,
    at_least,
    between,
    costs_file,
    finite,
    positive,
)
from ray_layout.options.flag_fields import option
from search.combined import rule_violations
from search.pipeline_ops import ScheduleShape
from search.planner import Candidate, PlanOptions, SearchSpec

MICROBATCHES_HELP = "micro-batches per step (default: global / (micro-batch x DP))"


def hbm_flag(help: str = "GPU memory limit in GiB") -> Any:
    return option(None, help=help, checks=[positive, finite])


def microbatches_flag(help: str | None = MICROBATCHES_HELP) -> Any:
    return option(None, help=help, checks=[between(1, MAX_MICROBATCHES)])


def tflops_flag() -> Any:
    return option(
        FLOPS_TFLOPS,
        help="achieved bf16 TFLOP/s per GPU that FLOP-derived costs assume",
        checks=[finite, between(*TFLOPS_RANGE)],
    )


@dataclass(frozen=True, kw_only=True)
class SearchFlags(Settings):
    """Unit costs, the step's micro-batches, memory and Monte Carlo: the search's inputs."""

    costs: str = option(
        help="COSTS.json (docs/costs.md), or 'flops' to derive from FLOPs", checks=[costs_file]
    )
    micro_batches: int | None = microbatches_flag()
    group_size: int | None = option(
        None,
        help="micro-batch group size of the interleaved schedule (default PP)",
        checks=[between(1, MAX_MICROBATCHES)],
    )
    hbm_gb: float | None = hbm_flag()
    samples: int = option(256, help="Monte Carlo samples", checks=[between(1, MAX_SAMPLES)])
    seed: int = option(0, checks=[at_least(0)])
    allow_cost_mismatch: bool = option(
        False, help="use a COSTS.json measured on another model shape, with a warning"
    )
    tflops: float = tflops_flag()


def unit_costs(
    costs: str, recipe: Recipe, allow_mismatch: bool = False, tflops: float = FLOPS_TFLOPS
) -> UnitCosts:
    """``--costs``: a COSTS.json, or costs derived from FLOPs at ``tflops`` (with a warning on
    stderr).

    A COSTS.json measured on another shape (model, sequence, micro-batch, TP/CP/EP,
    vocabulary) times other work: refused, or a warning where ``allow_mismatch``."""
    if costs == "flops":
        print(
            "warning: --costs flops derives unit costs from FLOPs at "
            f"{tflops:g} TFLOP/s per GPU (--tflops); measured costs differ (the MTP and output "
            "layers most), so profile and fit before trusting a pick",
            file=sys.stderr,
        )
        return costs_from_flops(recipe.model, recipe.parallel, tflops)
    loaded = load_costs(costs)
    if problem := unusable_costs(loaded):
        raise ConfigError(f"{costs}: {problem}")
    if implausible := costs_warnings(loaded):
        print(f"warning: {costs} looks broken: {'; '.join(implausible)}", file=sys.stderr)
    if mismatches := provenance_mismatches(loaded, recipe.model, recipe.parallel):
        what = f"{costs} was measured on another shape: {'; '.join(mismatches)}"
        if not allow_mismatch:
            raise ConfigError(f"{what} (--allow-cost-mismatch uses it anyway)")
        print(f"warning: {what}", file=sys.stderr)
    return loaded


MAX_COST = 1e7  # ms (2.8 hours), GiB or a factor: above any real value, far below overflow


def unusable_costs(costs: UnitCosts) -> str | None:
    """What makes checked costs unfit to simulate a step with: a layer that takes no time (every
    step 0 ms, speed-ups divide by it) or a value so large that sums overflow to inf and NaN."""
    numbers = {
        f"{name}.{unit}": value
        for name in ("forward_ms", "backward_ms", "jitter_cv", "memory_calibration")
        for unit, value in getattr(costs, name).items()
    } | {
        name: getattr(costs, name)
        for name in (
            "p2p_intra_node_ms",
            "p2p_inter_node_ms",
            "grad_sync_ms_per_gparam",
            "optimizer_ms_per_gparam",
            "memory_overhead_gib",
            "mtp_standalone_factor",
            "tail_fixed_ms",
        )
    }
    for name, value in numbers.items():
        if value > MAX_COST:
            return f"{name} must be <= {MAX_COST:g}, got {value:g}"
    idle = sorted(
        unit
        for unit, ms in costs.forward_ms.items()
        if unit in DECODER_UNITS and ms + costs.backward_ms[unit] <= 0
    )
    if idle:
        return f"decoder unit(s) {', '.join(idle)} take 0 ms forward and backward"
    return None


def microbatch_count(recipe: Recipe, given: int | None, group_size: int | None = None) -> int:
    """The micro-batches of a step: ``given``, else the recipe's; checked against the schedule."""
    parallel = recipe.parallel
    microbatches = given if given is not None else parallel.num_microbatches_or_none
    if microbatches is None:
        raise ConfigError(
            "the number of micro-batches is unknown: give --micro-batches, or "
            "--global-batch-size (micro-batches = global / (micro-batch size x DP))"
        )
    if not 1 <= microbatches <= MAX_MICROBATCHES:
        raise ConfigError(
            f"a step of {microbatches:,} micro-batches: it must have between 1 and "
            f"{MAX_MICROBATCHES:,}"
        )
    slots = parallel.pp * parallel.vpp * microbatches
    if slots > MAX_SCHEDULE_SLOTS:
        raise ConfigError(
            f"{microbatches:,} micro-batches x PP {parallel.pp} x VPP {parallel.vpp} = {slots:,} "
            f"forward passes per step, more than the {MAX_SCHEDULE_SLOTS:,} a search simulates; "
            "give fewer micro-batches"
        )
    flags = recipe.flags
    check_interleaving(parallel.pp, parallel.vpp, overlap_p2p_comm=flags.p2p_overlap)
    violations = rule_violations(
        flags.ep_overlap,
        pp=parallel.pp,
        vpp=parallel.vpp,
        ep=parallel.ep,
        mtp_num_layers=recipe.model.mtp_num_layers,
        recompute_granularity=flags.memory.recompute_granularity,
    )
    if violations:
        raise ConfigError("; ".join(violations))
    try:
        ScheduleShape(parallel.pp, parallel.vpp, microbatches, group_size)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return microbatches


def check_search_size(recipe: Recipe) -> None:
    """The search's memory grows with the layers it places times the stages it places them on:
    refuse a model and pipeline that would take gigabytes before it starts.  A job of a fork
    that takes no layout flag (Megatron-DeepSpeed) has nothing to search: the one line says who
    splits it and how many layers each stage gets."""
    if recipe.dialect == deepspeed_moe.NAME:
        m, args = recipe.model, recipe.megatron_args
        raise ConfigError(
            deepspeed_moe.plan_line(m.num_layers, recipe.parallel.pp, bool(m.num_experts), args)
        )
    layers, parallel = recipe.model.num_layers, recipe.parallel
    placements = layers * parallel.pp * parallel.vpp
    if placements > MAX_LAYER_PLACEMENTS:
        raise ConfigError(
            f"{layers:,} decoder layers x PP {parallel.pp} x VPP {parallel.vpp} = {placements:,} "
            f"layer placements to search, more than {MAX_LAYER_PLACEMENTS:,}; search fewer "
            "pipeline stages"
        )


def check_sampled_work(recipe: Recipe, microbatches: int, samples: int) -> None:
    """Monte Carlo holds every forward and backward pass of a step once per sample: refuse
    what would take gigabytes (memory grows about 1 KiB per sampled pass)."""
    sampled = samples * recipe.parallel.pp * recipe.parallel.vpp * microbatches
    if sampled > MAX_SAMPLED_PASSES:
        raise ConfigError(
            f"--samples {samples:,} x {microbatches:,} micro-batches x PP {recipe.parallel.pp} "
            f"x VPP {recipe.parallel.vpp} = {sampled:,} sampled forward passes, more than "
            f"{MAX_SAMPLED_PASSES:,}; give fewer --samples"
        )


def search_spec(
    recipe: Recipe,
    flags: SearchFlags,
    *,
    top: int = 10,
    allow_standalone_mtp: bool = False,
    allow_empty_stages: bool = False,
    shards: int = 1,
) -> tuple[SearchSpec, PlanOptions]:
    """What the planner searches for ``recipe`` and how it scores and keeps candidates."""
    microbatches = microbatch_count(recipe, flags.micro_batches, flags.group_size)
    check_sampled_work(recipe, microbatches, flags.samples)
    spec = SearchSpec(
        num_microbatches=microbatches,
        group_size=flags.group_size,
        allow_standalone_mtp=allow_standalone_mtp,
        allow_empty_stages=allow_empty_stages,
        shards=shards,
    )
    options = PlanOptions(top=top, samples=flags.samples, seed=flags.seed, hbm_gib=flags.hbm_gb)
    return spec, options


COMMON_GPUS_GIB = {"80 GiB (A100/H100)": 80, "141 GiB (H200)": 141, "192 GiB (B200)": 192}


def largest_stage(memory_gib: Sequence[float]) -> tuple[int, float]:
    """The PP rank with the most memory, and its GiB."""
    rank = max(range(len(memory_gib)), key=memory_gib.__getitem__)
    return rank, memory_gib[rank]


def unchecked_memory_note(memory_gib: Sequence[float]) -> str:
    """What a user without --hbm-gb must know: nothing was filtered, and where the largest stage
    would fit."""
    rank, peak = largest_stage(memory_gib)
    fits = [name for name, gib in COMMON_GPUS_GIB.items() if peak <= gib]
    where = f"fits {', '.join(fits)}" if fits else "fits none of 80, 141 or 192 GiB"
    return (
        f"memory not checked (no --hbm-gb): the largest stage needs {peak:,.1f} GiB "
        f"(PP rank {rank}), which {where}"
    )


def candidate_row(c: Candidate) -> dict[str, Any]:
    return {
        "layout": str(c.layout),
        "mean_ms": c.mean_ms,
        "p90_ms": c.p90_ms,
        "noise_free_ms": c.noise_free_ms,
        "bottleneck_rank": c.bottleneck_rank,
        "near_bottleneck": c.near_bottleneck,
        "memory_gib": list(c.memory_gib),
        "fits": c.fits,
        "mtp_standalone": c.mtp_standalone,
        "recompute": list(c.recompute),
    }
