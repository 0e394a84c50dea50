"""``plan --compare-schedules``: the listed layouts under each pipeline schedule the job could
run, so that what each overlap buys is a number, not a guess."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from rich.console import Console
from rich.table import Table

from ray_layout.errors import ConfigError
from ray_layout.model.job_flags import NO_EP_OVERLAP
from ray_layout.model.layout import Layout
from search.pipeline_ops import COMBINED_1F1B, INTERLEAVED, INTERLEAVED_OVERLAP_P2P
from search.planner import Problem, score_given


def compare_schedules(problem: Problem, report: dict[str, Any]) -> list[dict[str, Any]]:
    """The listed layouts' mean steps under blocking and overlapped p2p, and under combined 1F1B
    where the job overlaps its EP all-to-alls: what each overlap buys."""
    if problem.parallel.vpp == 1:
        raise ConfigError("--compare-schedules needs VPP > 1: 1F1B has no p2p overlap")
    variants = {
        INTERLEAVED: replace(problem, p2p_overlap=False, ep_overlap=NO_EP_OVERLAP),
        INTERLEAVED_OVERLAP_P2P: replace(problem, p2p_overlap=True, ep_overlap=NO_EP_OVERLAP),
    }
    if problem.ep_overlap.on:  # with the job's own p2p mode
        variants[COMBINED_1F1B] = problem
    rows = []
    for row in report["candidates"]:
        layout = Layout.parse(row["layout"], problem.parallel.pp)
        steps = {name: score_given(layout, variant).mean_ms for name, variant in variants.items()}
        rows.append({"layout": row["layout"], **steps})
    return rows


def print_schedules(rows: list[dict[str, Any]], console: Console) -> None:
    combined = bool(rows) and COMBINED_1F1B in rows[0]
    schedules = [INTERLEAVED, INTERLEAVED_OVERLAP_P2P, *([COMBINED_1F1B] if combined else [])]
    table = Table(title="the same layouts under each schedule (mean ms)")
    for column in ("layout", *schedules, "p2p overlap saves"):
        table.add_column(column, justify="left" if column == "layout" else "right")
    if combined:
        table.add_column("EP overlap saves", justify="right")
    for row in rows:
        blocking, overlapped = row[INTERLEAVED], row[INTERLEAVED_OVERLAP_P2P]
        cells = [f"{row[name]:,.1f}" for name in schedules]
        cells.append(f"{1 - overlapped / blocking:+.1%}")
        if combined:  # against the fastest p2p mode without it
            cells.append(f"{1 - row[COMBINED_1F1B] / min(blocking, overlapped):+.1%}")
        table.add_row(row["layout"], *cells)
    console.print(table)
