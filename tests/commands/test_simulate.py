"""``simulate``: one layout's step in detail: per-rank busy, idle and tail time, a Gantt chart."""

from __future__ import annotations

import pytest

from ray_layout.commands.main import main
from tests.helpers.commands_cli import COSTS, HANDBOOK, run_json


def test_simulate_writes_a_timeline(capsys, tmp_path):
    picture = tmp_path / "timeline.png"
    report = run_json(
        capsys,
        "simulate",
        HANDBOOK,
        "Et*5|t*6|t*5|mL",
        "--costs",
        COSTS,
        "--timeline",
        str(picture),
    )
    assert picture.stat().st_size > 10_000 and picture.read_bytes()[:4] == b"\x89PNG"
    assert report["layout"] == "Et*5|t*6|t*5|mL"
    assert 0 < report["bubble_fraction"] < 0.5
    busy, idle, tail = report["busy_ms"], report["idle_ms"], report["tail_ms"]
    for rank in range(4):
        assert busy[rank] + idle[rank] + tail[rank] == pytest.approx(report["noise_free_ms"])


def test_the_table_has_a_row_per_rank_and_memory_unchecked_is_said_on_stderr(capsys):
    assert main(["simulate", HANDBOOK, "Et*5|t*6|t*5|mL", "--costs", COSTS, "--samples", "8"]) == 0
    out, err = capsys.readouterr()
    first, *_ = out.splitlines()
    assert first.startswith("Et*5|t*6|t*5|mL: mean ") and "bubble " in first
    assert "(given)" not in first  # only a layout the command chose names its source
    rows = [[cell.strip() for cell in line.strip("│").split("│")] for line in out.splitlines()]
    ranks = [row[:2] for row in rows if row[0].isdigit()]
    assert ranks == [["0", "Ettttt"], ["1", "tttttt"], ["2", "ttttt"], ["3", "mL"]]
    assert err.startswith("memory not checked (no --hbm-gb)") and err.count("\n") == 1


def test_an_interleaved_layout_is_simulated_at_its_own_vpp(capsys):
    """The layout string sets the VPP: the config's (1 here) does not refuse it."""
    report = run_json(
        capsys,
        "simulate",
        HANDBOOK,
        "Ett|(tt|)*6t*2mL",
        "--costs",
        COSTS,
        "--samples",
        "8",
        "--hbm-gb",
        "141",
    )
    assert report["layout"] == "Ett|(tt|)*6t*2mL" and len(report["memory_gib"]) == 4
    flat = run_json(
        capsys,
        "simulate",
        HANDBOOK,
        "Et*4|t*4|t*4|t*4mL",
        "--costs",
        COSTS,
        "--samples",
        "8",
        "--hbm-gb",
        "141",
    )
    assert report["bubble_fraction"] < flat["bubble_fraction"]  # what interleaving is for


@pytest.mark.parametrize(
    ("timeline", "message"),
    [
        ("chart.txt", "chart.txt: must end in .png, .svg, .pdf"),
        ("no/such/dir/chart.png", "no/such/dir/chart.png: no such folder 'no/such/dir'"),
    ],
)
def test_a_timeline_it_cannot_write_is_refused_before_simulating(capsys, timeline, message):
    argv = ["simulate", HANDBOOK, "Et*5|t*6|t*5|mL", "--costs", COSTS, "--timeline", timeline]
    assert main(argv) == 2
    assert capsys.readouterr().err == f"error: --timeline {message}\n"
