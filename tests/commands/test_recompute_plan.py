"""``plan``'s layout x recompute search as the user sees it: each setting's short name, the
price of a candidate's recomputation, the reason the search ran, the table of what it tried and
the flags to paste."""

from __future__ import annotations

from rich.console import Console

from ray_layout.commands.recompute_plan import (
    paste_flags,
    print_recompute_search,
    recompute_section,
)
from ray_layout.model.costs import load_costs
from ray_layout.model.spec import load_recipe_file, with_parallel
from search.planner import PlanOptions, Problem, SearchSpec
from search.recompute_search import ASKED, searched_plan
from tests.helpers.commands_cli import handbook_plan, run_json

HANDBOOK = with_parallel(load_recipe_file("configs/handbook_7b_a1b.yaml"), pp=4)
COSTS = load_costs("configs/costs/handbook_h200_example.json")
FULL = ["--recompute-granularity", "full", "--recompute-method", "uniform",
        "--recompute-num-layers", "1"]  # fmt: skip


def problem(hbm_gib: float | None = 30.0) -> Problem:
    return Problem.of(
        HANDBOOK, COSTS, SearchSpec(32), PlanOptions(top=3, samples=8, hbm_gib=hbm_gib)
    )


def test_the_section_reports_each_setting_tried_with_its_bound():
    found, joint, why = searched_plan(problem(), "job")
    section = recompute_section(joint, why, problem())
    assert section["why"] == "the job's own recompute setting (none) fits no layout in 30 GiB"
    assert section["job_recompute"] == [] and section["gap"] == 0.0
    assert [b.candidate.recompute for b in found.baselines if b.candidate] == [(), ()]
    tried = section["tried"]
    assert tried[0]["recompute"] == [] and tried[0]["fitting"] == 0 and tried[0]["planned"]
    assert all(row["bound_ms"] is None or row["bound_ms"] > 0 for row in tried)
    assert found.candidates[0].mean_ms == min(
        row["best_mean_ms"] for row in tried if row["best_mean_ms"] is not None
    )
    assert found.smallest_peak_gib <= 30.0  # the smallest over every setting, not the job's


def test_the_table_names_each_setting_and_the_gap():
    console = Console(width=140, record=True)
    _, joint, why = searched_plan(problem(), "auto")
    section = recompute_section(joint, why, problem())
    print_recompute_search({"recompute_search": section}, console)
    text = console.export_text()
    assert "layout x recompute (asked (--recompute auto))" in text
    assert "full uniform 1" in text and "nothing fits" in text
    assert "the pick is within 0.0% of the optimum" in text


def test_the_flags_to_paste_replace_the_jobs_recompute_flags_only_where_the_pick_changes_them():
    row = {"layout": "Et*5|t*5|t*5|tmL", "recompute": FULL}
    job = ["--recompute-granularity", "selective", "--recompute-modules", "core_attn"]
    pasted = paste_flags({"candidates": [row], "job_recompute": job})
    assert pasted == (
        '--pipeline-model-parallel-layout "Et*5|t*5|t*5|tmL" ' + " ".join(FULL)
        + " (in place of " + " ".join(job) + ")"
    )  # fmt: skip
    same = paste_flags({"candidates": [row], "job_recompute": FULL})
    assert same == '--pipeline-model-parallel-layout "Et*5|t*5|t*5|tmL"'
    dropped = paste_flags({"candidates": [row | {"recompute": []}], "job_recompute": job})
    assert dropped.endswith("(and no recompute flags) (in place of " + " ".join(job) + ")")


def test_recompute_auto_searches_even_where_the_jobs_setting_fits(capsys):
    report = run_json(capsys, *handbook_plan("--recompute", "auto", "--samples", "8", "--top", "2"))
    assert report["recompute_search"]["why"] == ASKED
    assert report["candidates"][0]["recompute"] == []  # no HBM limit: recomputing only costs
    assert report["candidates"][0]["recompute_cost"] == 0.0
