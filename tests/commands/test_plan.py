"""``plan``: every valid layout ranked by simulated step time, against the baselines, with the
flag to paste; the VPP sweep; the table at deep pipelines; and the refusals, each one line."""

from __future__ import annotations

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console

from ray_layout.commands.main import main
from ray_layout.commands.plan import (
    LONGEST_LINE,
    SHOWN,
    check_memory,
    compared,
    layout_width,
    print_plan,
)
from ray_layout.errors import ConfigError
from tests.helpers.commands_cli import (
    COSTS,
    CURRENT,
    DEEPSEEK,
    HANDBOOK,
    handbook_plan,
    run_json,
    with_split,
)
from tests.helpers.paths import ROOT


def test_plan_prints_the_pick_baselines_and_flag(capsys):
    assert main(handbook_plan("--hbm-gb", "131", "--top", "3", "--samples", "32")) == 0
    out = capsys.readouterr().out
    assert 'flag to paste: --pipeline-model-parallel-layout "Et*5|t*6|t*5|mL"' in out
    assert "│ default │ Et*4|t*4|t*4|t*4mL" in out and "│   count │ Et*4|t*5|t*5|t*2mL" in out
    assert "680 layouts simulated (1f1b) by enumeration" in out
    assert "current" not in out  # the config states no split: no current layout to compare


def test_plan_compares_with_the_configs_current_layout_first(capsys, monkeypatch):
    with_split(monkeypatch, layout=CURRENT)
    argv = handbook_plan("--hbm-gb", "131", "--top", "2", "--samples", "16")
    report = run_json(capsys, *argv)
    assert [b["name"] for b in report["baselines"]] == [
        "current",
        "Megatron default",
        "count-based rule",
    ]
    current, best = report["baselines"][0], report["candidates"][0]
    assert current["layout"] == CURRENT
    assert best["speedup_vs_current"] == pytest.approx(current["mean_ms"] / best["mean_ms"])
    assert best["speedup_vs_current"] > 1.1 and best["speedup_vs_default"] > 1.3
    assert main(argv) == 0
    out = capsys.readouterr().out
    heading = next(line for line in out.splitlines() if "layout" in line)
    assert heading.index("current") < heading.index("default") < heading.index("count")
    assert f"│ current │ {CURRENT}" in out and f"{best['speedup_vs_current']:.2f}x" in out


def test_plan_collapses_exact_ties_and_states_the_tie_break(capsys):
    report = run_json(capsys, *handbook_plan("--hbm-gb", "131", "--samples", "16"))
    ties = [row["ties"] for row in report["candidates"]]
    assert all(t >= 1 for t in ties) and sum(ties) > len(ties)  # this space has exact ties
    steps = [row["noise_free_ms"] for row in report["candidates"]]
    assert len(set(steps)) == len(steps)  # one row per distinct prediction
    assert main(handbook_plan("--hbm-gb", "131", "--samples", "16")) == 0
    out = capsys.readouterr().out
    assert f"{sum(ties) - len(ties)} more layouts predict exactly a listed step" in out
    assert "fewest critical stages, then the most memory headroom" in out


def test_plan_without_hbm_says_memory_was_not_checked(capsys):
    assert main(handbook_plan("--top", "1", "--samples", "8")) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("memory not checked (no --hbm-gb)")
    assert "80 GiB (A100/H100)" in err[0]


def test_plan_where_no_layout_fits_names_the_smallest_peak_and_exits_2(capsys):
    assert main(handbook_plan("--hbm-gb", "20", "--samples", "8")) == 2
    (error,) = capsys.readouterr().err.strip().splitlines()  # a refusal is one line
    assert error.startswith("error: no layout fits in --hbm-gb 20: ")
    assert "smallest peak of any layout scored is " in error and "recompute" in error


def test_plan_where_the_jobs_setting_fits_nothing_searches_layout_and_recompute(capsys):
    """At 30 GiB no layout fits without recomputation: the plan picks a pair that fits, names
    its flags per candidate with their price, and pastes them with the layout."""
    report = run_json(capsys, *handbook_plan("--hbm-gb", "30", "--samples", "8", "--top", "3"))
    search = report["recompute_search"]
    assert search["why"] == "the job's own recompute setting (none) fits no layout in 30 GiB"
    assert report["job_recompute"] == [] and search["tried"][0]["fitting"] == 0
    for row in report["candidates"]:
        assert row["fits"] and row["recompute"][0] == "--recompute-granularity"
        assert row["recompute_cost"] > 0
    assert search["gap"] is not None and 0 <= search["gap"] < 0.5
    assert main(handbook_plan("--hbm-gb", "30", "--samples", "8", "--top", "1")) == 0
    shown = capsys.readouterr().out
    assert "layout x recompute" in shown and "recompute full block" in shown
    pick = report["candidates"][0]
    assert f'"{pick["layout"]}" {" ".join(pick["recompute"])}' in " ".join(shown.split())


def test_plan_where_nothing_fits_under_any_recompute_says_so_in_one_line(capsys):
    assert main(handbook_plan("--hbm-gb", "20", "--samples", "8")) == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("error: no layout fits in --hbm-gb 20: the smallest peak of any ")


def test_plan_json_speedups_and_memory(capsys):
    report = run_json(
        capsys, *handbook_plan("--top", "2", "--samples", "16", "--micro-batches", "16")
    )
    best = report["candidates"][0]
    assert report["micro_batches"] == 16
    assert best["speedup_vs_default"] > 1.3 and best["speedup_vs_count_based"] > 1.05
    assert len(best["memory_gib"]) == 4 and best["p90_ms"] >= best["noise_free_ms"] * 0.99
    assert [b["layout"] for b in report["baselines"]] == [
        "Et*4|t*4|t*4|t*4mL",
        "Et*4|t*5|t*5|t*2mL",
    ]
    assert best["speedup_vs_current"] is None  # the config states no split


def test_plan_baselines_take_the_runs_vpp_and_the_configs_split(capsys, monkeypatch):
    argv = handbook_plan("--top", "1", "--samples", "8")
    report = run_json(capsys, *argv, "--vpp", "2")
    baselines = {b["name"]: b["layout"] for b in report["baselines"]}
    assert baselines == {
        "Megatron default": "Ett|(tt|)*6t*2mL",
        "count-based rule": "Ett|t*3|t*3|(tt|)*4mL",
    }
    with_split(monkeypatch, first_stage_layers=3, last_stage_layers=3)
    report = run_json(capsys, *argv)
    baselines = {b["name"]: b["layout"] for b in report["baselines"]}
    assert baselines["current"] == baselines["Megatron default"] == "Et*3|t*5|t*5|t*3mL"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            handbook_plan(costs="missing.json"),
            "--costs missing.json: no such file",
        ),
        (
            handbook_plan("--micro-batches", "0"),
            "--micro-batches must be >= 1",
        ),
        (
            ["plan", HANDBOOK, "--pp", "4", "--vpp", "2", "--costs", COSTS, "--micro-batches", "3"],
            "needs micro-batches",
        ),
        (handbook_plan("--hbm-gb", "-1"), "positive"),
        (["simulate", HANDBOOK, "Et*5|t*6|t*5|L", "--costs", COSTS], "MTP layers"),
        (
            ["plan", DEEPSEEK, "--pp", "4", "--costs", COSTS, "--micro-batches", "8"],
            "measured on another shape: model handbook_7b_a1b (costs) vs DeepSeek-V3 (recipe)",
        ),
    ],
)
def test_plan_errors_are_one_line(capsys, argv, message):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_plan_sweeps_vpp(capsys):
    report = run_json(capsys, *handbook_plan("--samples", "8", "--sweep-vpp", "1,2,3"))
    rows = {row["vpp"]: row for row in report["sweep"]}
    assert rows[1]["best"]["layout"] == "Et*5|t*6|t*5|mL"
    assert rows[2]["best"]["mean_ms"] > 0
    assert rows[3]["best"]["mean_ms"] > 0  # 32 micro-batches, groups of 4: valid for VPP=3
    assert all(row["best"]["speedup_vs_current"] is None for row in rows.values())
    assert main(handbook_plan("--sweep-vpp", "1,x")) == 2


def test_a_vpp_sweep_compares_every_row_with_the_configs_current_layout(capsys, monkeypatch):
    with_split(monkeypatch, layout=CURRENT)
    argv = handbook_plan("--samples", "8", "--top", "1", "--sweep-vpp", "1,2")
    rows = run_json(capsys, *argv)["sweep"]
    current_ms = [row["best"]["mean_ms"] * row["best"]["speedup_vs_current"] for row in rows]
    assert current_ms[0] == pytest.approx(current_ms[1])  # one current layout, whatever the VPP
    assert all(row["best"]["speedup_vs_current"] > 1 for row in rows)
    assert main(argv) == 0
    assert "current" in capsys.readouterr().out


def test_plan_table_stays_readable_at_pp_16(capsys):
    memory = [60.0 + rank for rank in range(16)]
    memory[5] = 168.0
    row = {
        "layout": "Et*3|" + "t*4|" * 14 + "t*2mL",
        "mean_ms": 8374.7,
        "p90_ms": 8402.1,
        "noise_free_ms": 8370.0,
        "bottleneck_rank": 15,
        "near_bottleneck": 3,
        "memory_gib": memory,
        "fits": False,
        "mtp_standalone": False,
        "recompute": [],
        "speedup_vs_current": None,
        "speedup_vs_default": None,
        "speedup_vs_count_based": 1.04,
    }
    report = {
        "model": "DeepSeek-V3",
        "pp": 16,
        "vpp": 1,
        "micro_batches": 32,
        "method": "exact search",
        "valid_layouts": 10**14,
        "space_size": 9 * 10**13,
        "scored": 510_673,
        "monte_carlo": 0,
        "rejected_memory": 0,
        "proven_bound_ms": None,
        "search_complete": False,
        "search_nodes": 0,
        "candidates": [row],
        "baselines": [],
        "job_recompute": [],
    }
    print_plan(report, Console(width=120, record=True))
    out = capsys.readouterr().out
    assert "…" not in out  # no column squeezed to an ellipsis
    assert "168 (rank 5) OOM" in out and "8,374.7" in out and "rank 15" in out
    assert "1.04x" in out  # the last column kept: the layout folds instead
    assert "".join(line.strip("│ ") for line in out.splitlines()).count("t*4|") >= 14


def plan_row(layout: str, noise_free_ms: float) -> dict:
    """One candidate as ``plan --json`` lists it."""
    return {
        "layout": layout,
        "mean_ms": noise_free_ms + 5,
        "p90_ms": noise_free_ms + 9,
        "noise_free_ms": noise_free_ms,
        "bottleneck_rank": 3,
        "near_bottleneck": 1,
        "memory_gib": [40.0, 41.0, 42.0, 39.0],
        "fits": True,
        "mtp_standalone": False,
        "recompute": [],
        "speedup_vs_current": None,
        "speedup_vs_default": 1.2,
        "speedup_vs_count_based": None,
    }


def exact_search_report(**searched) -> dict:
    """A plan report of an exact search on PP 4, the search's outcome as given."""
    return {
        "model": "m",
        "pp": 4,
        "vpp": 1,
        "micro_batches": 8,
        "job_recompute": [],
        "method": "exact search",
        "valid_layouts": 816,
        "space_size": 680,
        "scored": 120,
        "monte_carlo": 10,
        "rejected_memory": 0,
        "search_nodes": 5_000,
        "candidates": [plan_row("Et*5|t*6|t*5|mL", 100.0)],
        "baselines": [{"name": "count-based rule", "reason": "no such rule here"}],
    } | searched


def test_an_exact_search_states_what_it_proved_about_the_layouts_it_did_not_list(capsys):
    report = exact_search_report(proven_bound_ms=101.5, search_complete=True)
    print_plan(report, Console(width=160))
    out = " ".join(capsys.readouterr().out.split())
    assert "120 layouts simulated by exact search of 680 in the space (816 valid)" in out
    assert "(5,000 search nodes); proven: every layout not listed takes >= 101.5 ms" in out
    assert "count-based rule: none (no such rule here)" in out
    assert "current" not in out and "default" in out  # no current layout: no column for it


def test_a_search_that_ran_out_of_budget_bounds_how_far_its_pick_is_from_the_optimum(capsys):
    report = exact_search_report(
        proven_bound_ms=95.0, search_complete=False, bound_reason="node budget", rejected_memory=7
    )
    print_plan(report, Console(width=160))
    out = " ".join(capsys.readouterr().out.split())
    assert ", 7 over the HBM limit" in out
    assert (
        "search budget spent: every layout not listed takes >= 95.0 ms, so the pick is within "
        "5.0% of the optimum (node budget)"
    ) in out


def test_a_cut_short_search_whose_bound_is_above_the_pick_proves_the_pick_and_no_more(capsys):
    """Under load a search may stop with its bound above the pick: the claim must not contradict
    the table (once, 'no layout is faster than 29,297.3 ms' stood next to a 25,701.6 ms pick)."""
    report = exact_search_report(proven_bound_ms=130.0, search_complete=False)
    print_plan(report, Console(width=160))
    out = " ".join(capsys.readouterr().out.split())
    assert (
        "every layout not listed takes >= 130.0 ms, so the pick is optimal (the rest of the "
        "top is not proven)"
    ) in out
    assert "within" not in out


def test_where_nothing_was_scored_under_the_hbm_limit_the_error_says_so():
    empty = {"candidates": [], "smallest_peak_gib": None}
    with pytest.raises(ConfigError, match="no layout fits in --hbm-gb 12: no layout was scored;"):
        check_memory(empty, 12.0)
    check_memory(empty, None)  # no limit, no pick: nothing to say


def test_the_baselines_are_labelled_by_their_first_word():
    assert [(shown.key, shown.label) for shown in SHOWN.values()] == [
        ("speedup_vs_current", "current"),
        ("speedup_vs_default", "default"),
        ("speedup_vs_count_based", "count"),
    ]
    assert [shown.label for shown in compared(with_current=False)] == ["default", "count"]


@given(
    width=st.integers(0, 400),
    layouts=st.lists(st.text("Etm|L*()0123456789", min_size=1, max_size=120), min_size=1),
)
def test_the_layout_column_is_at_least_8_wide_and_never_wider_than_its_longest_line(width, layouts):
    headers = ["#", "layout", "mean ms"]
    rows = [[str(i), text, "1,234.5"] for i, text in enumerate(layouts)]
    got = layout_width(width, headers, rows)
    assert 8 <= got <= max(8, min(max(map(len, layouts)), LONGEST_LINE))
    others = len(str(len(layouts) - 1)) + 3 + len("1,234.5") + 3  # widest line, padding, border
    if got > 8:  # the other columns keep their room; the layout folds instead
        assert got <= width - others - 4


def test_deepseek_with_ep_overlap_names_its_schedule_and_what_is_not_simulated(capsys, tmp_path):
    """The model zoo's DeepSeek-V3 at PP 16, VPP 2, EP 64 with EP all-to-all overlap: the
    schedule is combined 1F1B, simulated (nothing named as left out), with a stated bound."""
    raw = yaml.safe_load((ROOT / "configs" / "deepseek_v3_zoo_h100.yaml").read_text())
    flags = ["--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute"]
    raw["megatron_args"] = [*raw["megatron_args"][:-2], *flags]  # the zoo's own layout left out
    config = tmp_path / "deepseek.yaml"
    config.write_text(yaml.safe_dump(raw))
    sizes = ("--pp", "16", "--vpp", "2", "--ep", "64", "--micro-batches", "32")
    report = run_json(capsys, "plan", str(config), *sizes, "--costs", "flops", "--samples", "8")
    assert report["schedule"] == "combined-1f1b"
    assert report["schedule_notes"] == []
    assert report["candidates"] and report["proven_bound_ms"] is not None
    assert report["proven_bound_ms"] <= report["candidates"][0]["noise_free_ms"]


def test_a_job_that_recomputes_shows_its_baselines_under_its_own_setting(capsys, tmp_path):
    """The baselines run the job's own recompute flags: their rows carry no price of a setting
    of their own (a real script's plan once failed there)."""
    raw = yaml.safe_load((ROOT / "configs" / "handbook_7b_a1b.yaml").read_text())
    raw["megatron_args"] = ["--recompute-granularity", "full", "--recompute-method", "uniform",
                            "--recompute-num-layers", "1"]  # fmt: skip
    config = tmp_path / "recomputing.yaml"
    config.write_text(yaml.safe_dump(raw))
    options = ("--pp", "4", "--costs", "flops", "--top", "1", "--samples", "8")
    assert main(["plan", str(config), *options]) == 0
    shown = capsys.readouterr().out
    assert "default" in shown and "recompute full" not in shown  # all run the job's own
    report = run_json(capsys, "plan", str(config), *options)
    assert report["candidates"][0]["recompute_cost"] > 0.1
    assert report["baselines"][0]["recompute"] == report["job_recompute"]
