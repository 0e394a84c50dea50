"""``python -m ray_layout plan``: rank every valid layout by simulated step time."""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Literal, NamedTuple

from rich.console import Console
from rich.table import Table

from ray_layout.commands.common import Command, ModelSettings, emit, json_flag
from ray_layout.commands.recompute_plan import (
    paste_flags,
    print_recompute_search,
    recompute_section,
)
from ray_layout.commands.schedule_compare import compare_schedules, print_schedules
from ray_layout.commands.searching import (
    SearchFlags,
    candidate_row,
    check_search_size,
    largest_stage,
    search_spec,
    unchecked_memory_note,
    unit_costs,
)
from ray_layout.commands.tuned_script import comment_line, write_script_flag, write_tuned_script
from ray_layout.errors import ConfigError, InputError
from ray_layout.model.baselines import BaselineName
from ray_layout.model.costs import UnitCosts
from ray_layout.model.fields import MAX_PARALLEL_SIZE
from ray_layout.model.layout import Layout
from ray_layout.model.spec import Recipe, check_pipeline_stages
from ray_layout.options.checks import MAX_TASKS, at_least, between, comma_integers, each, reachable
from ray_layout.options.flag_fields import option
from ray_layout.runtime.sharding import ray_map_shards
from search.planner import Plan, PlanOptions, Problem, SearchSpec
from search.recompute_search import recompute_price, searched_plan, setting_name
from search.what_if import what_ifs


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
    compare_schedules: bool = option(
        False,
        help="also score the listed layouts under blocking and overlapped p2p, and combined "
        "1F1B where the job overlaps EP all-to-alls (VPP > 1)",
    )
    recompute: Literal["job", "auto"] = option(
        "job",
        help="job: plan under the job's own recompute setting, and search layout x recompute "
        "only where it fits no layout in --hbm-gb; auto: always search layout x recompute",
    )
    write_script: str | None = write_script_flag()


class Shown(NamedTuple):
    """How one baseline appears: its candidates' speedup field, its row label, its column."""

    key: str
    label: str
    column: str

    @classmethod
    def of(cls, name: BaselineName) -> Shown:
        """From the baseline's short name: the table takes its first word ("count"), and the
        headings two lines, so that three of them leave the layout its line."""
        word = name.short.partition("-")[0]
        return cls(f"speedup_vs_{name.short.replace('-', '_')}", word, f"vs\n{word}")


SHOWN = {name: Shown.of(name) for name in BaselineName}
LAYOUT_COLUMN, LONGEST_LINE = 1, 40  # a longer layout folds rather than squeeze the figures


def plan_report(recipe: Recipe, result: Plan, spec: SearchSpec) -> dict[str, Any]:
    rows = []
    ties = result.ties or (1,) * len(result.candidates)
    for c, tied in zip(result.candidates, ties, strict=True):
        row = candidate_row(c) | {"ties": tied}
        row |= {shown.key: result.speedup(c, name) for name, shown in SHOWN.items()}
        rows.append(row)
    return {
        "model": recipe.model.name,
        "pp": recipe.parallel.pp,
        "vpp": recipe.parallel.vpp,
        "micro_batches": spec.num_microbatches,
        "schedule": result.schedule,
        "schedule_notes": list(recipe.flags.unsimulated),
        "job_recompute": list(recipe.flags.memory.recompute_flags()),
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


def _speedup(value: float | None) -> str:
    return f"{value:.2f}x" if value else "-"


def compared(with_current: bool) -> tuple[Shown, ...]:
    """The speedup columns, in order: the current layout's first, and only where there is one."""
    return tuple(
        shown for name, shown in SHOWN.items() if with_current or name is not BaselineName.CURRENT
    )


def _speedups(row: dict[str, Any], columns: tuple[Shown, ...]) -> list[str]:
    return [_speedup(row.get(shown.key)) for shown in columns]


def _peak_memory(row: dict[str, Any]) -> str:
    """The largest stage's GiB and its rank: one cell however deep the pipeline (per-stage
    figures are in --json)."""
    rank, peak = largest_stage(row["memory_gib"])
    return f"{peak:.0f} (rank {rank})" + (" OOM" if row["fits"] is False else "")


def _cells(label: str, row: dict[str, Any], speedups: list[str], job: list[str]) -> list[str]:
    return [
        label,
        _layout_cell(row, job),
        f"{row.get('ties', 1):,}",
        f"{row['mean_ms']:,.1f}",
        f"{row['p90_ms']:,.1f}",
        f"rank {row['bottleneck_rank']}",
        str(row["near_bottleneck"]),
        _peak_memory(row),
        *speedups,
    ]


def _layout_cell(row: dict[str, Any], job: list[str]) -> str:
    """The layout, and the recompute setting it runs with where that is not the job's own,
    with what recomputing costs it."""
    cell = row["layout"] + (" (MTP standalone)" if row["mtp_standalone"] else "")
    if row.get("recompute", job) != job:
        cell += f" + recompute {setting_name(row['recompute'])}"
        cost = row.get("recompute_cost")
        cell += f" ({cost:+.1%})" if row["recompute"] and cost is not None else ""
    return cell


def layout_width(width: int, headers: list[str], rows: list[list[str]]) -> int:
    """The layout column's width: its longest string up to ``LONGEST_LINE``, less where the other
    columns (each its widest line, a space either side and a border) leave less of ``width``, so
    that the layout folds rather than the table lose its last columns."""

    def widest(column: int) -> int:
        texts = [headers[column], *(row[column] for row in rows)]
        return max(len(line) for text in texts for line in text.splitlines())

    others = sum(widest(c) + 3 for c in range(len(headers)) if c != LAYOUT_COLUMN)
    return max(min(widest(LAYOUT_COLUMN), LONGEST_LINE, width - others - 4), 8)


def print_plan(report: dict[str, Any], console: Console) -> None:
    table = Table(
        title=f"{report['model']}: PP={report['pp']} VPP={report['vpp']}, "
        f"{report['micro_batches']} micro-batches"
    )
    scored = [b for b in report["baselines"] if "layout" in b]
    columns = compared(any(b["name"] == BaselineName.CURRENT for b in scored))
    headers = [
        "#",
        "layout",
        "ties",
        "mean ms",
        "p90 ms",
        "slowest",
        "near",
        "peak GiB",
        *(shown.column for shown in columns),
    ]
    ranked = [
        _cells(str(index), row, _speedups(row, columns), report["job_recompute"])
        for index, row in enumerate(report["candidates"], 1)
    ]
    compared_with = [
        _cells(
            SHOWN[BaselineName(base["name"])].label,
            base,
            [""] * len(columns),
            report["job_recompute"],
        )
        for base in scored
    ]
    width = layout_width(console.width, headers, [*ranked, *compared_with])
    for index, column in enumerate(headers):
        layout = index == LAYOUT_COLUMN
        table.add_column(
            column,
            justify="left" if layout else "right",
            no_wrap=not layout,
            overflow="fold",
            min_width=width if layout else None,
        )
    for cells in ranked:
        table.add_row(*cells)
    table.add_section()
    for cells in compared_with:
        table.add_row(*cells)
    console.print(table)
    for base in report["baselines"]:
        if "layout" not in base:
            console.print(f"{base['name']}: none ({base['reason']})", highlight=False)
    own = "under the job's own recompute setting: " if "recompute_search" in report else ""
    console.print(own + _searched(report), highlight=False)
    for note in report.get("schedule_notes", ()):
        console.print(f"not simulated: {note}", highlight=False, soft_wrap=True)
    if "compare_schedules" in report:
        print_schedules(report["compare_schedules"], console)
    if "recompute_search" in report:
        print_recompute_search(report, console)
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
        console.print(f"flag to paste: {paste_flags(report)}", highlight=False, markup=False)


def _searched(report: dict[str, Any]) -> str:
    """How much the search looked at, and what it proved about the rest."""
    searched = (
        f"{report['scored']:,} layouts simulated{_schedule(report)} by {report['method']}"
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
            searched += _unfinished_claim(bound, report["candidates"])
            if report.get("bound_reason"):
                searched += f" ({report['bound_reason']})"
    return searched


def _unfinished_claim(bound: float, candidates: list[dict[str, Any]]) -> str:
    """What a search cut short proved, and never more: the bound covers the layouts not listed,
    so a pick at or under it is optimal, and one above it is within the gap."""
    claim = f"search budget spent: every layout not listed takes >= {bound:,.1f} ms"
    if not candidates:
        return claim
    pick = candidates[0]["noise_free_ms"]
    if pick <= bound:
        return claim + ", so the pick is optimal (the rest of the top is not proven)"
    return claim + f", so the pick is within {1 - bound / pick:.1%} of the optimum"


def _search(settings: PlanSettings, recipe: Recipe) -> tuple[SearchSpec, PlanOptions]:
    check_search_size(recipe)
    return search_spec(
        recipe,
        settings.search,
        top=settings.top,
        shards=settings.shards,
        allow_standalone_mtp=settings.allow_standalone_mtp,
        allow_empty_stages=settings.allow_empty_stages,
    )


def _planned(
    settings: PlanSettings, recipe: Recipe, costs: UnitCosts, spec: SearchSpec, options: PlanOptions
) -> dict[str, Any]:
    map_shards = None
    if spec.shards > 1:  # the one place the search gets Ray: its shards become Ray tasks
        _start_ray(settings.ray_address, spec.shards)
        map_shards = ray_map_shards
    problem = Problem.of(recipe, costs, spec, options)
    found, joint, why = searched_plan(problem, settings.recompute, _progress, map_shards)
    report = plan_report(recipe, found, spec)
    for row, candidate in zip(report["candidates"], found.candidates, strict=True):
        row["recompute_cost"] = recompute_price(candidate, problem)
    if joint is not None:
        report["recompute_search"] = recompute_section(joint, why, problem)
    return report


def _schedule(report: dict[str, Any]) -> str:
    return f" ({report['schedule']})" if "schedule" in report else ""


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
        try:  # a VPP this schedule or model cannot run is a row, not the end
            report = _planned(settings, run, costs, *_search(settings, run))
        except InputError as exc:
            rows.append({"vpp": vpp, "skipped": str(exc)})
            continue
        best = report["candidates"][0] if report["candidates"] else None
        rows.append(
            {"vpp": vpp, "best": best, "schedule": report["schedule"], "method": report["method"]}
        )
    return {"sweep": rows, "job_recompute": list(recipe.flags.memory.recompute_flags())}


def _print_sweep(report: dict[str, Any], console: Console, title: str) -> None:
    bests = [row["best"] for row in report["sweep"] if row.get("best")]
    columns = compared(any(best.get(SHOWN[BaselineName.CURRENT].key) for best in bests))
    table = Table(title=title)
    for column in ("VPP", "best layout", "mean ms", *(shown.column for shown in columns)):
        table.add_column(column, justify="left" if column == "best layout" else "right")
    for row in report["sweep"]:
        best = row.get("best")
        if best is None:
            skipped = row.get("skipped", "no layout fits")
            table.add_row(str(row["vpp"]), skipped, "", *[""] * len(columns))
            continue
        table.add_row(
            str(row["vpp"]),
            _layout_cell(best, report["job_recompute"]),
            f"{best['mean_ms']:,.1f}",
            *_speedups(best, columns),
        )
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
        if settings.compare_schedules:
            problem = Problem.of(recipe, costs, *_search(settings, recipe))
            report["compare_schedules"] = compare_schedules(problem, report)
        emit(report, settings.as_json, print_plan, console)
        hint = ""
        if settings.search.hbm_gb is not None and not report["candidates"]:
            hint = _what_if(Problem.of(recipe, costs, *_search(settings, recipe)))
        check_memory(report, settings.search.hbm_gb, hint)
        if settings.write_script and report["candidates"]:
            best = report["candidates"][0]
            current, default = SHOWN[BaselineName.CURRENT].key, SHOWN[BaselineName.DEFAULT].key
            over = BaselineName.CURRENT if best.get(current) else BaselineName.DEFAULT
            speedup = best.get(current) or best.get(default)
            layout = Layout.parse(best["layout"], recipe.parallel.pp)
            comment = comment_line("plan", layout, speedup, over)
            write_tuned_script(settings, settings.write_script, layout, comment)
            print(f"plan: wrote {settings.write_script}", file=sys.stderr)


def _what_if(problem: Problem) -> str:
    """Each memory setting the job could add, re-planned: one line each on stderr; the first
    that fits (the cheapest) becomes the error's hint."""
    hbm = problem.options.hbm_gib or 0.0
    found = what_ifs(problem)
    for what_if in found:
        print(f"plan: {what_if.line(hbm)}", file=sys.stderr)
    fitting = [w for w in found if w.layout is not None]
    return fitting[0].line(hbm) if fitting else ""


def check_memory(report: dict[str, Any], hbm_gib: float | None, hint: str = "") -> None:
    """A pick is never shown as fitting when memory was not checked, nor a plan as done when
    nothing fits; ``hint`` (a what-if that fits) replaces the generic advice."""
    if hbm_gib is None and report["candidates"]:
        print(unchecked_memory_note(report["candidates"][0]["memory_gib"]), file=sys.stderr)
    elif hbm_gib is not None and not report["candidates"]:
        smallest = report["smallest_peak_gib"]
        found = (
            f"the smallest peak of any layout scored is {smallest:,.1f} GiB"
            if smallest
            else ("no layout was scored")
        )
        advice = hint or "more EP or TP, activation recompute, or a smaller micro-batch lowers it"
        raise ConfigError(f"no layout fits in --hbm-gb {hbm_gib:g}: {found}; {advice}")


def _start_ray(address: str | None, shards: int) -> None:
    import ray  # here only: the other commands, and plan without shards, run without Ray

    from ray_layout.runtime.local import join

    if not ray.is_initialized():
        if address:
            join(address=address)
        else:
            join(num_cpus=shards, include_dashboard=False, object_store_memory=200 * 2**20)


PLAN = Command("plan", "rank every valid layout by simulated step time", PlanSettings, run_plan)
