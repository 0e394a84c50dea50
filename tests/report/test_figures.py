"""Which plots the report draws from a summary and with what: the pick's timeline first, each
arm's memory, measured arms only, the traces of arms ended early marked; and why a plot is
skipped (no data, or an error while drawing), its old files removed either way."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ray_layout.ab.vocabulary import ArmStatus
from ray_layout.report import plots
from ray_layout.report.figures import PLOT_NAMES, draw_figures


@pytest.fixture
def calls(monkeypatch):
    """What each plot was asked to draw, by plot name; nothing is drawn."""
    seen = {}
    names = {
        "draw_timelines": "timelines",
        "draw_memory": "memory",
        "draw_predicted_vs_measured": "predicted_vs_measured",
        "draw_step_traces": "ab_traces",
    }
    for function, name in names.items():

        def record(*args, name=name):
            seen[name] = args[:-1]  # the paths last

        monkeypatch.setattr(plots, function, record)
    return seen


def test_every_plot_gets_its_data_from_the_summary(summary, calls, tmp_path):
    figures, skipped = draw_figures(summary, tmp_path)
    assert list(figures) == list(PLOT_NAMES) and skipped == {}
    assert figures["memory"].png == tmp_path / "memory.png"
    (panels,) = calls["timelines"]
    titles = [title for title, _, _ in panels]
    pick = summary.timelines["pick"]
    assert titles[0] == (
        f"pick: {summary.pick}, predicted {pick.candidate.mean_ms:,.0f} ms, "
        f"bubble {pick.bubble_fraction:.1%}"
    )
    assert [t.split(":")[0] for t in titles] == list(summary.timelines)
    series, hbm = calls["memory"]
    assert hbm == summary.hbm_gib
    assert [label for label, _, _ in series][:2] == [
        f"candidate-1: {summary.pick} (pick)",
        "candidate-2: Et*5|t*5|t*6|mL",
    ]
    (points,) = calls["predicted_vs_measured"]
    assert [p[0] for p in points] == ["candidate-1", "candidate-2", "default", "count-based"]
    traces, ended = calls["ab_traces"]
    assert list(traces) == ["candidate-1", "candidate-2", "default", "count-based"]
    assert ended == {"candidate-2": "stopped", "default": "stopped", "count-based": "stopped"}


def test_without_arms_the_memory_plot_shows_the_picks_simulated_memory(summary, calls, tmp_path):
    draw_figures(replace(summary, arms=()), tmp_path)
    series, _ = calls["memory"]
    assert series == [
        (f"pick: {summary.pick}", summary.timelines["pick"].candidate.memory_gib, None)
    ]


def test_a_plot_without_data_is_skipped_with_why(summary, calls, tmp_path):
    no_pick = {k: v for k, v in summary.timelines.items() if k != "pick"}
    unmeasured = tuple(replace(a, measured_ms=None, steps_ms=()) for a in summary.arms)
    _, skipped = draw_figures(replace(summary, timelines=no_pick, arms=unmeasured), tmp_path)
    assert skipped == {
        "timelines": "no simulated timeline of the pick was given",
        "predicted_vs_measured": "no arm was measured in an A/B",
        "ab_traces": "no A/B step times were recorded",
    }
    _, skipped = draw_figures(replace(summary, arms=(), timelines={}), tmp_path)
    assert skipped["memory"] == "no predicted memory per stage was given"


def test_a_plot_that_fails_is_skipped_with_its_error_and_its_old_files_go(
    summary, calls, monkeypatch, tmp_path
):
    """A report at the end of a long tune is still written, and says what went wrong."""

    def broken(*args):
        raise RuntimeError("no font")

    monkeypatch.setattr(plots, "draw_memory", broken)
    for stale in ("memory.png", "memory.svg"):
        (tmp_path / stale).write_bytes(b"old")
    failed = replace(summary.arms[1], status=ArmStatus.FAILED)
    figures, skipped = draw_figures(replace(summary, arms=(summary.arms[0], failed)), tmp_path)
    assert skipped == {"memory": "could not be drawn (RuntimeError: no font)"}
    assert "memory" not in figures and len(figures) == 3
    assert not (tmp_path / "memory.png").exists() and not (tmp_path / "memory.svg").exists()
    assert calls["ab_traces"][1] == {"candidate-2": "failed"}
