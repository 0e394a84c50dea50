"""``plan``'s layout x recompute search: when the job's own recompute setting fits no layout, or
when asked (``--recompute auto``), every setting real jobs use is planned with the layout
(``search.recompute_search``) and the report names each candidate's setting and its price."""

from __future__ import annotations

import math
from typing import Any

from rich.console import Console
from rich.table import Table

from search.planner import Problem
from search.recompute_search import JointPlan, SettingPlan, setting_name


def recompute_section(joint: JointPlan, why: str, problem: Problem) -> dict[str, Any]:
    """The report's ``recompute_search``: why the pair was searched, each setting tried, and
    the joint bound and gap."""
    return {
        "why": why,
        "job_recompute": list(problem.memory.recompute_flags()),
        "tried": [_tried_row(tried) for tried in joint.tried],
        "bound_ms": joint.bound_ms if joint.candidates else None,
        "gap": joint.gap if joint.candidates else None,
    }


def _tried_row(tried: SettingPlan) -> dict[str, Any]:
    best = min((c.mean_ms for c in tried.plan.candidates), default=None) if tried.plan else None
    return {
        "recompute": list(tried.flags),
        "planned": tried.plan is not None,
        "fitting": len(tried.plan.candidates) if tried.plan else 0,
        "best_mean_ms": best,
        "bound_ms": tried.bound_ms if math.isfinite(tried.bound_ms) else None,  # None: none fit
        "complete": bool(tried.plan and tried.plan.complete),
    }


def print_recompute_search(report: dict[str, Any], console: Console) -> None:
    """What the joint search tried, each setting's best fitting step, and its gap."""
    section = report["recompute_search"]
    table = Table(title=f"layout x recompute ({section['why']})")
    for column in ("recompute", "fitting", "best mean ms", "no layout faster than"):
        table.add_column(column, justify="left" if column == "recompute" else "right")
    for row in section["tried"]:
        best = row["best_mean_ms"]
        shown = "skipped" if not row["planned"] else "-" if best is None else f"{best:,.1f}"
        bound = row["bound_ms"]
        floor = "nothing fits" if bound is None else f"{bound:,.1f} ms"
        table.add_row(setting_name(row["recompute"]), str(row["fitting"]), shown, floor)
    console.print(table)
    if not all(row["planned"] for row in section["tried"]):
        console.print(
            "skipped: no layout under the setting can beat the pick (its ideal step, all compute "
            "spread evenly with no bubble, is slower)",
            highlight=False,
        )
    if section["gap"] is not None:
        console.print(
            f"no layout x recompute pair that fits is faster than {section['bound_ms']:,.1f} ms: "
            f"the pick is within {section['gap']:.1%} of the optimum",
            highlight=False,
        )


def paste_flags(report: dict[str, Any]) -> str:
    """The pick's layout flag, and its recompute flags where they are not the job's (they
    replace the job's own)."""
    best = report["candidates"][0]
    flags = f'--pipeline-model-parallel-layout "{best["layout"]}"'
    if best["recompute"] != report["job_recompute"]:
        instead = " ".join(report["job_recompute"])
        flags += " " + (" ".join(best["recompute"]) or "(and no recompute flags)")
        flags += f" (in place of {instead})" if instead else ""
    return flags
