"""``plan --compare-schedules``: the listed layouts scored under each schedule the job could
run (blocking and overlapped p2p, combined 1F1B where the job overlaps EP all-to-alls)."""

from __future__ import annotations

import pytest
import yaml
from rich.console import Console

from ray_layout.commands.schedule_compare import compare_schedules, print_schedules
from ray_layout.errors import ConfigError
from ray_layout.model.costs import load_costs
from ray_layout.model.spec import load_recipe_file
from search.planner import PlanOptions, Problem, SearchSpec
from tests.helpers.commands_cli import handbook_plan, run_json
from tests.helpers.paths import ROOT


def test_plan_json_names_the_schedule_the_flags_select_and_compares_p2p_modes(capsys):
    """VPP 2 keeps Megatron's p2p overlap unless the job's flags turn it off; with
    --compare-schedules each listed layout is scored under both p2p modes."""
    options = ("--vpp", "2", "--top", "2", "--samples", "8", "--compare-schedules")
    report = run_json(capsys, *handbook_plan(*options))
    assert report["schedule"] == "interleaved-overlap-p2p" and report["schedule_notes"] == []
    compared = report["compare_schedules"]
    assert [row["layout"] for row in compared] == [c["layout"] for c in report["candidates"]]
    for row in compared:
        assert row["interleaved-overlap-p2p"] <= row["interleaved"]
    assert run_json(capsys, *handbook_plan("--top", "1", "--samples", "8"))["schedule"] == "1f1b"


def test_compare_schedules_adds_combined_1f1b_where_the_job_overlaps_ep(capsys, tmp_path):
    """The handbook at PP 4, VPP 2 with EP overlap (FLOP costs, whose all-to-alls are 0.89 ms
    each): the pick is combined 1F1B's, and scored as each other schedule it is slower."""
    raw = yaml.safe_load((ROOT / "configs" / "handbook_7b_a1b.yaml").read_text())
    raw["megatron_args"] = ["--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute"]
    config = tmp_path / "handbook_ep.yaml"
    config.write_text(yaml.safe_dump(raw))
    options = ("--pp", "4", "--vpp", "2", "--costs", "flops", "--top", "2", "--samples", "8")
    report = run_json(capsys, "plan", str(config), *options, "--compare-schedules")
    assert report["schedule"] == "combined-1f1b"
    pick, row = report["candidates"][0], report["compare_schedules"][0]
    assert row["combined-1f1b"] == pytest.approx(pick["mean_ms"])
    assert row["combined-1f1b"] < row["interleaved-overlap-p2p"] < row["interleaved"]


def test_1f1b_has_no_p2p_overlap_to_compare():
    recipe = load_recipe_file("configs/handbook_7b_a1b.yaml")
    costs = load_costs("configs/costs/handbook_h200_example.json")
    problem = Problem.of(recipe, costs, SearchSpec(32), PlanOptions(top=1))
    with pytest.raises(ConfigError, match="needs VPP > 1"):
        compare_schedules(problem, {"candidates": []})


def test_the_table_shows_what_each_overlap_saves():
    console = Console(width=120, record=True)
    rows = [{"layout": "Et*2|t*3", "interleaved": 100.0, "interleaved-overlap-p2p": 90.0}]
    print_schedules(rows, console)
    text = console.export_text()
    assert "Et*2|t*3" in text and "+10.0%" in text and "EP overlap" not in text
