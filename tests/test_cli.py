"""The command line as a user meets it: output, --json, and one-line errors with exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, replace
from typing import Literal

import pytest
from rich.console import Console

from ray_layout.commands import common
from ray_layout.commands.checks import at_least
from ray_layout.commands.common import OneLineErrorParser
from ray_layout.commands.flags import Settings, add_flags, argument, from_args, option
from ray_layout.commands.main import main
from ray_layout.commands.plan import print_plan
from ray_layout.errors import ConfigError
from ray_layout.model.split import PipelineSplit

HANDBOOK = "configs/handbook_7b_a1b.yaml"
DEEPSEEK = "tests/data/hf/DeepSeek-V3/config.json"


def run_json(capsys, *argv: str) -> dict:
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


CURRENT = "Et*3|t*5|t*5|t*3mL"  # a layout a user might run today (no other baseline's)


def with_split(monkeypatch, **split) -> None:
    """Every command loads the config as a launch script stating this split would."""
    load = common.load_recipe

    def load_with_split(*args, **kwargs):
        return replace(load(*args, **kwargs), split=PipelineSplit(**split))

    monkeypatch.setattr(common, "load_recipe", load_with_split)


def test_size_prints_the_handbook_counts(capsys):
    assert main(["size", HANDBOOK, "--pp", "4"]) == 0
    out = capsys.readouterr().out
    assert "6.86B total, 1.22B active" in out
    assert "MTP layers 0.42B" in out
    assert "Et*4|t*4|t*4|t*4mL" in out and "Megatron default" in out


def test_size_json_has_units_and_default_stages(capsys):
    report = run_json(capsys, "size", HANDBOOK, "--pp", "4", "--ep", "4", "--dp", "4")
    assert report["parallel"]["ep"] == 4 and report["parallel"]["dp"] == 4
    assert [u["unit"] for u in report["units"]] == ["E", "t", "m", "L"]
    assert [s["units"] for s in report["stages"]] == ["Etttt", "tttt", "tttt", "ttttmL"]
    last, middle = report["stages"][3], report["stages"][1]
    assert last["forward_gflops_per_microbatch"] > 3 * middle["forward_gflops_per_microbatch"]


def test_size_of_a_given_layout_and_of_a_model_without_default(capsys):
    report = run_json(capsys, "size", HANDBOOK, "--pp", "4", "--layout", "Et*5|t*6|t*5|mL")
    assert report["layout"] == "Et*5|t*6|t*5|mL" and report["layout_source"] == "given"
    report = run_json(capsys, "size", DEEPSEEK, "--pp", "16", "--ep", "8", "--dp", "8")
    assert report["layout_source"].startswith("count-based rule")
    assert round(report["parameters"]["total"] / 1e9) == 671


def test_size_and_simulate_show_the_configs_current_layout(capsys, monkeypatch):
    simulate = ["simulate", HANDBOOK, "--costs", COSTS, "--samples", "8"]
    report = run_json(capsys, *simulate)
    assert report["layout"] == "Et*4|t*4|t*4|t*4mL"
    assert report["layout_source"] == "Megatron default"
    with_split(monkeypatch, last_stage_layers=13)  # Megatron's default, shaped by the flag
    report = run_json(capsys, "size", HANDBOOK, "--pp", "4")
    assert report["layout"] == "Et|t|t|t*13mL"
    assert report["layout_source"] == "current (the config's split)"
    with_split(monkeypatch, layout=CURRENT)
    report = run_json(capsys, *simulate)
    assert report["layout"] == CURRENT and report["layout_source"].startswith("current")
    assert main(simulate) == 0
    assert f"{CURRENT} (current (the config's split)): mean" in capsys.readouterr().out
    # a --pp the config's layout cannot run: Megatron's default, and why
    report = run_json(capsys, "size", HANDBOOK, "--pp", "8")
    assert report["layout"] == "Ett|(tt|)*6t*2mL"
    assert report["layout_source"].startswith("Megatron default; the config's split does not")


def test_layouts_count_and_list(capsys):
    counted = run_json(capsys, "layouts", HANDBOOK, "--pp", "4", "--count")
    assert counted == {"valid": 816, "mtp_standalone": 136, "in_space": 680, "layouts": []}
    listed = run_json(capsys, "layouts", HANDBOOK, "--pp", "4", "--limit", "1000")
    assert len(listed["layouts"]) == 680 and "Et*5|t*6|t*5|mL" in listed["layouts"]
    wide = run_json(
        capsys, "layouts", HANDBOOK, "--pp", "4", "--allow-empty-stages",
        "--allow-standalone-mtp", "--count",
    )  # fmt: skip
    assert wide["in_space"] == 1140


def test_validate_reports_standalone_and_placement(capsys):
    report = run_json(capsys, "validate", "Et*3|(tt|)*29,m|L", "--pp", "16",
                      "--num-layers", "61", "--mtp-layers", "1")  # fmt: skip
    assert report["vpp"] == 2 and report["mtp_standalone"] is True
    assert report["layout"] == "Et*3|(tt|)*29m|L"
    report = run_json(capsys, "validate", "|Et|t|L", "--pp", "4", "--num-layers", "2")
    assert report["warnings"] and "E is not in stage 0" in report["warnings"][0]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["validate", "Et*4|t*4|t*4|t*4L", "--pp", "4", "--num-layers", "16",
          "--mtp-layers", "1"], "0 MTP layers m, the model has 1"),
        (["validate", "Etx|L", "--pp", "2", "--num-layers", "1"], "invalid symbol 'x'"),
        (["validate", "Ett|tt|tt|ttL", "--pp", "2", "--num-layers", "8"], "needs PP > 2"),
        (["size", "no/such/file.yaml"], "cannot read"),
        (["size", HANDBOOK, "--tp", "3"], "not divisible by TP 3"),
        (["size", HANDBOOK, "--pp", "4", "--layout", "Et*4|t*4|t*4|t*4L"], "MTP layers"),
        (["layouts", HANDBOOK, "--pp", "0"], "must be >= 1"),
        (["size", HANDBOOK, "--pp", "four"], "invalid int value"),
    ],
)  # fmt: skip
def test_bad_input_is_one_line_and_exit_2(capsys, argv, message):
    with pytest.raises(SystemExit) as exited:
        raise SystemExit(main(argv))
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert message in err
    assert err.count("\n") == 1 and err.startswith("error: ")


def test_module_entry_point_runs_as_a_user_would():
    done = subprocess.run(
        [sys.executable, "-m", "ray_layout", "validate", "Et*5|t*6|t*5|mL", "--pp", "4",
         "--num-layers", "16", "--mtp-layers", "1"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "valid: Megatron accepts" in done.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "ray_layout", "size", "tests/data/train_moe_16l.sh", "--tp", "5"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert bad.returncode == 2 and "Traceback" not in bad.stderr


def test_seq_length_override_scales_attention_flops(capsys):
    short = run_json(capsys, "size", HANDBOOK, "--seq-length", "1024")
    long = run_json(capsys, "size", HANDBOOK, "--seq-length", "2048")
    assert long["units"][1]["forward_gflops_per_microbatch"] > (
        2 * short["units"][1]["forward_gflops_per_microbatch"]
    )


COSTS = "configs/costs/handbook_h200_example.json"


def test_plan_prints_the_pick_baselines_and_flag(capsys):
    assert main(["plan", HANDBOOK, "--pp", "4", "--costs", COSTS, "--hbm-gb", "131",
                 "--top", "3", "--samples", "32"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert 'flag to paste: --pipeline-model-parallel-layout "Et*5|t*6|t*5|mL"' in out
    assert "│ default │ Et*4|t*4|t*4|t*4mL" in out and "│   count │ Et*4|t*5|t*5|t*2mL" in out
    assert "680 layouts simulated by enumeration" in out
    assert "current" not in out  # the config states no split: no current layout to compare


def test_plan_compares_with_the_configs_current_layout_first(capsys, monkeypatch):
    with_split(monkeypatch, layout=CURRENT)
    argv = ["plan", HANDBOOK, "--pp", "4", "--costs", COSTS, "--hbm-gb", "131", "--top", "2",
            "--samples", "16"]  # fmt: skip
    report = run_json(capsys, *argv)
    assert [b["name"] for b in report["baselines"]] == [
        "current", "Megatron default", "count-based rule"]  # fmt: skip
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
    report = run_json(capsys, "plan", HANDBOOK, "--pp", "4", "--costs", COSTS, "--hbm-gb",
                      "131", "--samples", "16")  # fmt: skip
    ties = [row["ties"] for row in report["candidates"]]
    assert all(t >= 1 for t in ties) and sum(ties) > len(ties)  # this space has exact ties
    steps = [row["noise_free_ms"] for row in report["candidates"]]
    assert len(set(steps)) == len(steps)  # one row per distinct prediction
    assert main(["plan", HANDBOOK, "--pp", "4", "--costs", COSTS, "--hbm-gb", "131",
                 "--samples", "16"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert f"{sum(ties) - len(ties)} more layouts predict exactly a listed step" in out
    assert "fewest critical stages, then the most memory headroom" in out


def test_plan_without_hbm_says_memory_was_not_checked(capsys):
    assert main(["plan", HANDBOOK, "--pp", "4", "--costs", COSTS, "--top", "1",
                 "--samples", "8"]) == 0  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("memory not checked (no --hbm-gb)")
    assert "80 GiB (A100/H100)" in err[0]


def test_plan_where_no_layout_fits_names_the_smallest_peak_and_exits_2(capsys):
    assert main(["plan", HANDBOOK, "--pp", "4", "--costs", COSTS, "--hbm-gb", "20",
                 "--samples", "8"]) == 2  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: no layout fits in --hbm-gb 20: ")
    assert "smallest peak of any layout scored is " in err[0] and "recompute" in err[0]


def test_costs_of_another_shape_are_refused_unless_allowed(capsys):
    argv = ["plan", HANDBOOK, "--pp", "4", "--ep", "4", "--dp", "4", "--costs", COSTS,
            "--hbm-gb", "131", "--top", "1", "--samples", "8"]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "measured on another shape: ep 2 (costs) vs 4 (recipe)" in err
    assert main([*argv, "--allow-cost-mismatch"]) == 0
    assert "warning: " in capsys.readouterr().err


def test_plan_json_speedups_and_memory(capsys):
    report = run_json(capsys, "plan", HANDBOOK, "--pp", "4", "--costs", COSTS, "--top", "2",
                      "--samples", "16", "--micro-batches", "16")  # fmt: skip
    best = report["candidates"][0]
    assert report["micro_batches"] == 16
    assert best["speedup_vs_default"] > 1.3 and best["speedup_vs_count_based"] > 1.05
    assert len(best["memory_gib"]) == 4 and best["p90_ms"] >= best["noise_free_ms"] * 0.99
    assert [b["layout"] for b in report["baselines"]] == ["Et*4|t*4|t*4|t*4mL",
                                                          "Et*4|t*5|t*5|t*2mL"]  # fmt: skip
    assert best["speedup_vs_current"] is None  # the config states no split


def test_plan_baselines_take_the_runs_vpp_and_the_configs_split(capsys, monkeypatch):
    argv = ["plan", HANDBOOK, "--pp", "4", "--costs", COSTS, "--top", "1", "--samples", "8"]
    report = run_json(capsys, *argv, "--vpp", "2")
    baselines = {b["name"]: b["layout"] for b in report["baselines"]}
    assert baselines == {"Megatron default": "Ett|(tt|)*6t*2mL",
                         "count-based rule": "Ett|t*3|t*3|(tt|)*4mL"}  # fmt: skip
    with_split(monkeypatch, first_stage_layers=3, last_stage_layers=3)
    report = run_json(capsys, *argv)
    baselines = {b["name"]: b["layout"] for b in report["baselines"]}
    assert baselines["current"] == baselines["Megatron default"] == "Et*3|t*5|t*5|t*3mL"


def test_plan_with_flops_costs_warns(capsys):
    assert main(["plan", HANDBOOK, "--pp", "4", "--costs", "flops", "--top", "1", "--samples",
                 "8", "--json"]) == 0  # fmt: skip
    captured = capsys.readouterr()
    assert json.loads(captured.out)["candidates"]
    assert "measured costs differ" in captured.err


def test_tflops_sets_the_speed_flop_costs_assume(capsys):
    argv = ["simulate", HANDBOOK, "Et*5|t*6|t*5|mL", "--costs", "flops", "--samples", "8"]
    default = run_json(capsys, *argv)
    assert main([*argv, "--tflops", "200", "--json"]) == 0
    captured = capsys.readouterr()
    assert "at 200 TFLOP/s per GPU (--tflops)" in captured.err
    compute = sum(json.loads(captured.out)["busy_ms"]), sum(default["busy_ms"])
    assert compute[0] == pytest.approx(2 * compute[1], rel=0.05)  # the embedding is not FLOPs
    for bad in ("0", "-5", "nan"):
        assert main([*argv, "--tflops", bad]) == 2
        assert capsys.readouterr().err.startswith("error: --tflops must be")
    assert main(["profile-layouts", HANDBOOK, "--pp", "4", "--tflops", "150", "--json"]) == 0


def test_simulate_writes_a_timeline(capsys, tmp_path):
    picture = tmp_path / "timeline.png"
    report = run_json(capsys, "simulate", HANDBOOK, "Et*5|t*6|t*5|mL", "--costs", COSTS,
                      "--timeline", str(picture))  # fmt: skip
    assert picture.stat().st_size > 10_000 and picture.read_bytes()[:4] == b"\x89PNG"
    assert report["layout"] == "Et*5|t*6|t*5|mL"
    assert 0 < report["bubble_fraction"] < 0.5
    busy, idle, tail = report["busy_ms"], report["idle_ms"], report["tail_ms"]
    for rank in range(4):
        assert busy[rank] + idle[rank] + tail[rank] == pytest.approx(report["noise_free_ms"])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["plan", HANDBOOK, "--pp", "4", "--costs", "missing.json"],
         "--costs missing.json: no such file"),
        (["plan", HANDBOOK, "--pp", "4", "--costs", COSTS, "--micro-batches", "0"],
         "--micro-batches must be >= 1"),
        (["plan", HANDBOOK, "--pp", "4", "--vpp", "2", "--costs", COSTS, "--micro-batches",
          "3"], "needs micro-batches"),
        (["plan", HANDBOOK, "--pp", "4", "--costs", COSTS, "--hbm-gb", "-1"], "positive"),
        (["simulate", HANDBOOK, "Et*5|t*6|t*5|L", "--costs", COSTS], "MTP layers"),
        (["plan", DEEPSEEK, "--pp", "4", "--costs", COSTS, "--micro-batches", "8"],
         "measured on another shape: model handbook_7b_a1b (costs) vs DeepSeek-V3 (recipe)"),
    ],
)  # fmt: skip
def test_plan_errors_are_one_line(capsys, argv, message):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_plan_sweeps_vpp(capsys):
    report = run_json(capsys, "plan", HANDBOOK, "--pp", "4", "--costs", COSTS, "--samples", "8",
                      "--sweep-vpp", "1,2,3")  # fmt: skip
    rows = {row["vpp"]: row for row in report["sweep"]}
    assert rows[1]["best"]["layout"] == "Et*5|t*6|t*5|mL"
    assert rows[2]["best"]["mean_ms"] > 0
    assert rows[3]["best"]["mean_ms"] > 0  # 32 micro-batches, groups of 4: valid for VPP=3
    assert all(row["best"]["speedup_vs_current"] is None for row in rows.values())
    assert main(["plan", HANDBOOK, "--pp", "4", "--costs", COSTS, "--sweep-vpp", "1,x"]) == 2


def test_a_vpp_sweep_compares_every_row_with_the_configs_current_layout(capsys, monkeypatch):
    with_split(monkeypatch, layout=CURRENT)
    argv = ["plan", HANDBOOK, "--pp", "4", "--costs", COSTS, "--samples", "8", "--top", "1",
            "--sweep-vpp", "1,2"]  # fmt: skip
    rows = run_json(capsys, *argv)["sweep"]
    current_ms = [row["best"]["mean_ms"] * row["best"]["speedup_vs_current"] for row in rows]
    assert current_ms[0] == pytest.approx(current_ms[1])  # one current layout, whatever the VPP
    assert all(row["best"]["speedup_vs_current"] > 1 for row in rows)
    assert main(argv) == 0
    assert "current" in capsys.readouterr().out


@dataclass(frozen=True, kw_only=True)
class Example(Settings):
    name: str = argument(help="a name")
    count: int = option(help="how many", checks=[at_least(1)])
    kind: Literal["a", "b"] = option("a")
    loud: bool = option(False)
    tags: tuple[str, ...] = option((), names=["--tag"])


def test_settings_classes_build_the_parser_and_check_their_values():
    parser = OneLineErrorParser(prog="example")
    add_flags(parser, Example)
    settings = from_args(Example, parser.parse_args(["x", "--count", "2", "--tag", "p",
                                                     "--tag", "q", "--loud"]))  # fmt: skip
    assert settings == Example(name="x", count=2, kind="a", loud=True, tags=("p", "q"))
    assert "how many" in parser.format_help() and "{a,b}" in parser.format_help()
    with pytest.raises(ConfigError, match="--count must be >= 1, got 0"):
        from_args(Example, parser.parse_args(["x", "--count", "0"]))
    with pytest.raises(ConfigError, match="--count must be >= 1"):
        Example(name="x", count=-3)  # constructed in code, checked the same way
    with pytest.raises(SystemExit):
        parser.parse_args(["x"])  # --count has no default: required


def test_plan_table_stays_readable_at_pp_16(capsys):
    memory = [60.0 + rank for rank in range(16)]
    memory[5] = 168.0
    row = {
        "layout": "Et*3|" + "t*4|" * 14 + "t*2mL", "mean_ms": 8374.7, "p90_ms": 8402.1,
        "noise_free_ms": 8370.0, "bottleneck_rank": 15, "near_bottleneck": 3,
        "memory_gib": memory, "fits": False, "mtp_standalone": False,
        "speedup_vs_current": None, "speedup_vs_default": None, "speedup_vs_count_based": 1.04,
    }  # fmt: skip
    report = {
        "model": "DeepSeek-V3", "pp": 16, "vpp": 1, "micro_batches": 32, "method": "exact search",
        "valid_layouts": 10**14, "space_size": 9 * 10**13, "scored": 510_673, "monte_carlo": 0,
        "rejected_memory": 0, "proven_bound_ms": None, "search_complete": False,
        "search_nodes": 0, "candidates": [row], "baselines": [],
    }  # fmt: skip
    print_plan(report, Console(width=120, record=True))
    out = capsys.readouterr().out
    assert "…" not in out  # no column squeezed to an ellipsis
    assert "168 (rank 5) OOM" in out and "8,374.7" in out and "rank 15" in out
    assert "1.04x" in out  # the last column kept: the layout folds instead
    assert "".join(line.strip("│ ") for line in out.splitlines()).count("t*4|") >= 14


def test_a_reader_that_leaves_early_ends_the_command_quietly():
    """``python -m ray_layout layouts ... | head -1``: no BrokenPipeError traceback."""
    command = [sys.executable, "-m", "ray_layout", "layouts", HANDBOOK, "--pp", "4", "--vpp", "2",
               "--allow-standalone-mtp", "--limit", "5000"]  # fmt: skip
    done = subprocess.run(
        ["bash", "-c", 'set -o pipefail; "$@" | head -1; echo "status ${PIPESTATUS[0]}"', "x",
         *command], capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.stderr == ""
    assert done.stdout.splitlines()[-1] == "status 141"
