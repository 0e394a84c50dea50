"""``python -m ray_layout plan``: rank every valid layout by simulated step time."""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from rich.console import Console
from rich.table import Table

from ray_layout.commands.checks import MAX_TASKS, at_least, between, comma_integers, each, reachable
from ray_layout.commands.common import Command, ModelSettings, emit, json_flag
from ray_layout.commands.flags import option
from ray_layout.commands.searching import (
    SearchFlags,
    candidate_row,
    check_search_size,
    largest_stage,
    search_spec,
    unchecked_memory_note,
    unit_costs,
)
from ray_layout.errors import ConfigError, InputError
from ray_layout.model.costs import UnitCosts
from ray_layout.model.spec import MAX_PARALLEL_SIZE, Recipe, check_pipeline_stages
from ray_layout.runtime.sharding import ray_map_shards
from search.planner import Plan, PlanOptions, Problem, SearchSpec, plan


@dataclass(frozen=True, kw_only=True)
class PlanSettings(ModelSettings):
    search: SearchFlags = field(default_factory=SearchFlags)
    as_json: bool = json_flag()
    top: int = option(10, help="how many layouts to show", checks=[at_least(1)])
    allow_empty_stages: bool = option(False)
    allow_standalone_mtp: bool = option(False)
    shards: int = option(1, help="Ray tasks for the search", checks=[between(1, MAX_TASKS)])
    ray_address: str | None = option(
        None, help="Ray cluster to shard on (default: start one)", checks=[reachable]
    )
    sweep_vpp: tuple[int, ...] | None = option(
        None,
        help="plan for each VPP in a list such as 1,2,4",
        parse=comma_integers("1,2,4"),
        checks=[each(between(1, MAX_PARALLEL_SIZE))],
    )


def plan_report(recipe: Recipe, result: Plan, spec: SearchSpec) -> dict[str, Any]:
    rows = []
    ties = result.ties or (1,) * len(result.candidates)
    for c, tied in zip(result.candidates, ties, strict=True):
        row = candidate_row(c) | {"ties": tied}
        row["speedup_vs_default"] = result.speedup(c, "Megatron default")
        row["speedup_vs_count_based"] = result.speedup(c, "count-based rule")
        rows.append(row)
    return {
        "model": recipe.model.name,
        "pp": recipe.parallel.pp,
        "vpp": recipe.parallel.vpp,
        "micro_batches": spec.num_microbatches,
        "method": result.method,
        "valid_layouts": result.valid_layouts,
        "space_size": result.space_size,
        "scored": result.scored,
        "monte_carlo": result.sampled,
        "rejected_memory": result.rejected_memory,
        "proven_bound_ms": result.proven_bound_ms,
        "search_complete": result.complete,
        "search_nodes": result.nodes,
        "bound_reason": result.bound_reason,
        "smallest_peak_gib": None
        if math.isinf(result.smallest_peak_gib)
        else result.smallest_peak_gib,
        "candidates": rows,
        "baselines": [
            {"name": b.name, "reason": b.reason}
            | (candidate_row(b.candidate) if b.candidate else {})
            for b in result.baselines
        ],
    }


_SHORT = {"Megatron default": "default", "count-based rule": "count-based"}  # row labels


def _speedup(value: float | None) -> str:
    return f"{value:.2f}x" if value else "-"


def _peak_memory(row: dict[str, Any]) -> str:
    """The largest stage's GiB and its rank: one cell however deep the pipeline (per-stage
    figures are in --json)."""
    rank, peak = largest_stage(row["memory_gib"])
    return f"{peak:.0f} (rank {rank})" + ("" if row["fits"] else " OOM")


def print_plan(report: dict[str, Any], console: Console) -> None:
    table = Table(
        title=f"{report['model']}: PP={report['pp']} VPP={report['vpp']}, "
        f"{report['micro_batches']} micro-batches"
    )
    rows = [*report["candidates"], *(b for b in report["baselines"] if "layout" in b)]
    # a layout up to 40 characters keeps its line; a longer one folds rather than squeeze the
    # figures beside it
    widest = min(max((len(row["layout"]) for row in rows), default=6), 40)
    for column in ("#", "layout", "ties", "mean ms", "p90 ms", "slowest", "near",
                   "peak GiB", "vs default", "vs count"):  # fmt: skip
        layout = column == "layout"
        table.add_column(column, justify="left" if layout else "right", no_wrap=not layout,
                         overflow="fold", min_width=widest if layout else None)  # fmt: skip

    def add(label: str, row: dict[str, Any], vs_default: str, vs_count: str) -> None:
        table.add_row(
            label,
            row["layout"] + (" (MTP standalone)" if row["mtp_standalone"] else ""),
            f"{row.get('ties', 1):,}",
            f"{row['mean_ms']:,.1f}",
            f"{row['p90_ms']:,.1f}",
            f"rank {row['bottleneck_rank']}",
            str(row["near_bottleneck"]),
            _peak_memory(row),
            vs_default,
            vs_count,
        )

    for index, row in enumerate(report["candidates"], 1):
        add(str(index), row, _speedup(row["speedup_vs_default"]),
            _speedup(row["speedup_vs_count_based"]))  # fmt: skip
    table.add_section()
    for base in report["baselines"]:
        if "layout" in base:
            add(_SHORT.get(base["name"], base["name"]), base, "", "")
    console.print(table)
    for base in report["baselines"]:
        if "layout" not in base:
            console.print(f"{base['name']}: none ({base['reason']})", highlight=False)
    console.print(_searched(report), highlight=False)
    tied = sum(row.get("ties", 1) - 1 for row in report["candidates"])
    if tied:
        console.print(
            f"{tied:,} more layouts predict exactly a listed step (column ties); each row shows "
            "the one with the fewest critical stages, then the most memory headroom, then the "
            "shortest string",
            highlight=False,
            soft_wrap=True,
        )
    if report["candidates"]:
        best = report["candidates"][0]["layout"]
        flags = f'--pipeline-model-parallel-layout "{best}"'
        console.print(f"flag to paste: {flags}", highlight=False, markup=False)


def _searched(report: dict[str, Any]) -> str:
    """How much the search looked at, and what it proved about the rest."""
    searched = (
        f"{report['scored']:,} layouts simulated by {report['method']}"
        f" of {report['space_size']:,} in the space ({report['valid_layouts']:,} valid), "
        f"{report['monte_carlo']:,} with Monte Carlo jitter"
    )
    if report["rejected_memory"]:
        searched += f", {report['rejected_memory']:,} over the HBM limit"
    if report["proven_bound_ms"] is not None:
        bound = report["proven_bound_ms"]
        searched += f" ({report['search_nodes']:,} search nodes); "
        if report["search_complete"]:
            searched += f"proven: every layout not listed takes >= {bound:,.1f} ms"
        else:
            searched += f"search budget spent: no layout is faster than {bound:,.1f} ms"
            if report["candidates"]:
                gap = 1 - bound / report["candidates"][0]["noise_free_ms"]
                searched += f", so the pick is within {max(gap, 0):.1%} of the optimum"
            if report.get("bound_reason"):
                searched += f" ({report['bound_reason']})"
    return searched


def _search(settings: PlanSettings, recipe: Recipe) -> tuple[SearchSpec, PlanOptions]:
    check_search_size(recipe)
    return search_spec(
        recipe, settings.search, top=settings.top, shards=settings.shards,
        allow_standalone_mtp=settings.allow_standalone_mtp,
        allow_empty_stages=settings.allow_empty_stages,
    )  # fmt: skip


def _planned(
    settings: PlanSettings, recipe: Recipe, costs: UnitCosts, spec: SearchSpec, options: PlanOptions
) -> dict[str, Any]:
    map_shards = None
    if spec.shards > 1:  # the one place the search gets Ray: its shards become Ray tasks
        _start_ray(settings.ray_address, spec.shards)
        map_shards = ray_map_shards
    found = plan(
        Problem(recipe.model, recipe.parallel, costs, spec, options),
        progress=_progress,
        map_shards=map_shards,
    )
    return plan_report(recipe, found, spec)


def _progress(line: str) -> None:
    """A long search's progress, on stderr so that --json output stays one document."""
    print(f"plan: {line}", file=sys.stderr, flush=True)


def _sweep_vpp(settings: PlanSettings, recipe: Recipe, costs: UnitCosts) -> dict[str, Any]:
    """Plan once per VPP and compare the picks (the micro-batch count stays the same)."""
    deepest = max(settings.sweep_vpp or (1,))
    check_pipeline_stages(recipe.parallel.pp, deepest, source=f"--sweep-vpp {deepest}")
    rows: list[dict[str, Any]] = []
    for vpp in settings.sweep_vpp or ():
        run = replace(recipe, parallel=replace(recipe.parallel, vpp=vpp))
        try:
            search = _search(settings, run)
        except InputError as exc:  # a VPP this schedule cannot run is a row, not the end
            rows.append({"vpp": vpp, "skipped": str(exc)})
            continue
        report = _planned(settings, run, costs, *search)
        best = report["candidates"][0] if report["candidates"] else None
        rows.append({"vpp": vpp, "best": best, "method": report["method"]})
    return {"sweep": rows}


def _print_sweep(report: dict[str, Any], console: Console, title: str) -> None:
    table = Table(title=title)
    for column in ("VPP", "best layout", "mean ms", "vs default", "vs count"):
        table.add_column(column, justify="left" if column == "best layout" else "right")
    for row in report["sweep"]:
        best = row.get("best")
        if best is None:
            table.add_row(str(row["vpp"]), row.get("skipped", "no layout fits"), "", "", "")
            continue
        table.add_row(str(row["vpp"]), best["layout"], f"{best['mean_ms']:,.1f}",
                      _speedup(best["speedup_vs_default"]),
                      _speedup(best["speedup_vs_count_based"]))  # fmt: skip
    console.print(table)


def run_plan(settings: PlanSettings, console: Console) -> None:
    recipe = settings.recipe()
    search = settings.search
    costs = unit_costs(search.costs, recipe, search.allow_cost_mismatch, search.tflops)
    if settings.sweep_vpp:
        title = f"{recipe.model.name}: PP={recipe.parallel.pp}, VPP sweep"
        show = partial(_print_sweep, title=title)
        emit(_sweep_vpp(settings, recipe, costs), settings.as_json, show, console)
    else:
        report = _planned(settings, recipe, costs, *_search(settings, recipe))
        emit(report, settings.as_json, print_plan, console)
        check_memory(report, settings.search.hbm_gb)


def check_memory(report: dict[str, Any], hbm_gib: float | None) -> None:
    """A pick is never shown as fitting when memory was not checked, nor a plan as done when
    nothing fits."""
    if hbm_gib is None and report["candidates"]:
        print(unchecked_memory_note(report["candidates"][0]["memory_gib"]), file=sys.stderr)
    elif hbm_gib is not None and not report["candidates"]:
        smallest = report["smallest_peak_gib"]
        found = (
            f"the smallest peak of any layout scored is {smallest:,.1f} GiB"
            if smallest
            else ("no layout was scored")
        )
        raise ConfigError(
            f"no layout fits in --hbm-gb {hbm_gib:g}: {found}; more EP or TP, activation "
            "recompute, or a smaller micro-batch lowers it"
        )


def _start_ray(address: str | None, shards: int) -> None:
    import ray  # here only: the other commands, and plan without shards, run without Ray

    if not ray.is_initialized():
        if address:
            ray.init(address=address, logging_level="ERROR")
        else:
            ray.init(num_cpus=shards, include_dashboard=False, logging_level="ERROR",
                     object_store_memory=200 * 2**20)  # fmt: skip


PLAN = Command("plan", "rank every valid layout by simulated step time", PlanSettings, run_plan)
