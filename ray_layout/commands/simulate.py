"""``python -m ray_layout simulate``: one layout's step in detail, with a Gantt chart."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, replace
from typing import Any

from rich.console import Console
from rich.table import Table

from ray_layout.commands.common import Command, ModelSettings, emit, json_flag
from ray_layout.commands.config_layout import config_layout
from ray_layout.commands.searching import (
    SearchFlags,
    candidate_row,
    search_spec,
    unchecked_memory_note,
    unit_costs,
)
from ray_layout.commands.validate import LAYOUT_HELP
from ray_layout.errors import ConfigError
from ray_layout.model.layout import Layout, validate_buildable
from ray_layout.options.checks import new_file
from ray_layout.options.flag_fields import argument, option
from ray_layout.report.plots import draw_timeline
from search.planner import Problem, simulate_given

TIMELINE_SUFFIXES = (".png", ".svg", ".pdf")


@dataclass(frozen=True, kw_only=True)
class SimulateSettings(ModelSettings):
    layout: str | None = argument(
        help=f"{LAYOUT_HELP} (default: the config's own, else Megatron's default)", default=None
    )
    search: SearchFlags = field(default_factory=SearchFlags)
    as_json: bool = json_flag()
    timeline: str | None = option(
        None,
        help="write a Gantt chart (PNG, SVG or PDF)",
        checks=[new_file(TIMELINE_SUFFIXES)],
    )


def run_simulate(settings: SimulateSettings, console: Console) -> None:
    recipe = settings.recipe()
    if settings.layout is None:
        layout, source = config_layout(recipe)
    else:
        layout, source = Layout.parse(settings.layout, recipe.parallel.pp), "given"
    model = recipe.model
    validate_buildable(
        layout, model.num_layers, model.mtp_num_layers, tied_embeddings=model.tied_embeddings
    )
    given_vpp = settings.parallel.vpp
    if given_vpp is not None and given_vpp != layout.vpp:
        raise ConfigError(
            f"--vpp {given_vpp} contradicts the layout {layout}, which has VPP={layout.vpp} "
            f"({layout.pp * layout.vpp} stages on PP={layout.pp}): give one of them"
        )
    recipe = replace(recipe, parallel=replace(recipe.parallel, vpp=layout.vpp))
    search = settings.search
    costs = unit_costs(search.costs, recipe, search.allow_cost_mismatch, search.tflops)
    spec, options = search_spec(recipe, settings.search)
    result = simulate_given(layout, Problem.of(recipe, costs, spec, options))
    if settings.timeline:
        draw_timeline(
            result.events,
            result.tail_ms,
            settings.timeline,
            f"{layout}  ({spec.num_microbatches} micro-batches)",
        )
    report = candidate_row(result.candidate) | {
        "busy_ms": list(result.busy_ms),
        "idle_ms": list(result.idle_ms),
        "tail_ms": list(result.tail_ms),
        "bubble_fraction": result.bubble_fraction,
        "timeline": settings.timeline,
        "layout_source": source,
    }

    def show(report: dict[str, Any], console: Console) -> None:
        shown = "" if settings.layout else f" ({source})"
        console.print(
            f"{layout}{shown}: mean {report['mean_ms']:,.1f} ms, p90 {report['p90_ms']:,.1f} ms, "
            f"noise-free {report['noise_free_ms']:,.1f} ms; "
            f"bubble {report['bubble_fraction']:.1%}",
            highlight=False,
        )
        table = Table()
        for column in ("PP rank", "units", "busy ms", "idle ms", "tail ms", "GiB"):
            table.add_column(column, justify="right")
        for rank in range(layout.pp):
            table.add_row(
                str(rank),
                "|".join(layout.rank_chunks(rank)),
                f"{report['busy_ms'][rank]:,.1f}",
                f"{report['idle_ms'][rank]:,.1f}",
                f"{report['tail_ms'][rank]:,.1f}",
                f"{report['memory_gib'][rank]:.1f}",
            )
        console.print(table)
        if settings.timeline:
            console.print(f"timeline written to {settings.timeline}", highlight=False)

    emit(report, settings.as_json, show, console)
    if settings.search.hbm_gb is None:
        print(unchecked_memory_note(report["memory_gib"]), file=sys.stderr)


SIMULATE = Command(
    "simulate", "simulate one layout's step in detail", SimulateSettings, run_simulate
)
