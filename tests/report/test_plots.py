"""The report's pictures from plain data: saved once per path by its suffix, the same bytes from
the same data, every figure closed (a failed draw too), and what each plot promises to show."""

from __future__ import annotations

from pathlib import Path

import pytest

from ray_layout.errors import ConfigError
from ray_layout.report import plots
from search.simulator import Event

EVENTS = (
    Event(0, "F1", True, 0.0, 10.0),
    Event(0, "B1", True, 20.0, 40.0),
    Event(1, "send_forward", False, 10.0, 11.0),
    Event(1, "F1", True, 11.0, 20.0),
    Event(1, "B1", True, 20.0, 38.0),
    Event(1, "F2", True, 38.0, 38.0),  # empty: not drawn
)
TRACES = {
    "pick": [300.0, 110.0, 101.0, 100.0, 100.5, 99.5, 100.0],
    "default": [420.0, 150.0, 140.0, 141.0, 139.0],
}


@pytest.fixture
def drawn(monkeypatch):
    """The axes of every figure saved, read before the figure is closed."""
    seen = []
    save = plots._save

    def keep(fig, paths, dpi=130):
        seen.append(fig.axes)
        save(fig, paths, dpi)

    monkeypatch.setattr(plots, "_save", keep)
    return seen


def open_figures() -> list[int]:
    return plots._pyplot().get_fignums()


def test_each_path_gets_the_format_its_suffix_names(tmp_path):
    paths = [tmp_path / "memory.png", tmp_path / "memory.svg", tmp_path / "memory.pdf"]
    plots.draw_memory([("pick", (40.0, 50.0), (41.0, 49.0))], 131.0, paths)
    assert paths[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert b"<svg" in paths[1].read_bytes()[:2000]
    assert paths[2].read_bytes()[:5] == b"%PDF-"
    assert open_figures() == []


def test_the_same_data_gives_the_same_svg_and_pdf(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    for folder in (first, second):
        folder.mkdir()
        plots.draw_step_traces(TRACES, {"default": "stopped"}, [folder / "t.svg", folder / "t.pdf"])
    for name in ("t.svg", "t.pdf"):
        assert (first / name).read_bytes() == (second / name).read_bytes(), name
    assert b"<dc:date>" not in (first / "t.svg").read_bytes()


def test_a_draw_that_fails_closes_its_figure_and_writes_nothing(tmp_path):
    path = tmp_path / "timeline.png"
    with pytest.raises(ValueError):
        plots.draw_timeline(EVENTS, (1.0,), path, "one tail for two ranks")
    assert open_figures() == [] and not path.exists()


def test_a_disk_that_refuses_the_write_is_one_line_and_leaves_no_part_file(tmp_path, monkeypatch):
    """ENOSPC halfway, or a path the pre-check could not see through (/proc/...)."""
    path = tmp_path / "timeline.png"

    def full_disk(fig, target, **_):
        Path(target).write_bytes(b"\x89PNG half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("matplotlib.figure.Figure.savefig", full_disk)
    with pytest.raises(
        ConfigError, match=r"timeline.png: cannot write \(No space left on device\)$"
    ):
        plots.draw_timeline(EVENTS, (1.0, 1.0), path, "step")
    assert not path.exists() and open_figures() == []


def test_a_timeline_has_a_row_per_rank_and_a_bar_per_busy_span(tmp_path, drawn):
    plots.draw_timeline(EVENTS, (5.0, 0.0), tmp_path / "timeline.svg", "pick")
    ((ax,),) = drawn
    assert [tick.get_text() for tick in ax.get_yticklabels()] == ["PP rank 0", "PP rank 1"]
    # a collection per (rank, colour), a bar per span: F, B on 0, p2p, F, B on 1, then 0's
    # tail; the empty F2 and rank 1's zero tail draw nothing
    assert len(ax.collections) == 6
    assert sum(len(c.get_paths()) for c in ax.collections) == 6
    assert ax.get_title() == "pick"


def test_several_timelines_share_one_time_axis(tmp_path, drawn):
    panels = [("pick", EVENTS, (5.0, 0.0)), ("default", EVENTS[:2], (2.0,))]
    plots.draw_timelines(panels, [tmp_path / "timelines.png"])
    ((top, bottom),) = drawn
    assert top.get_shared_x_axes().joined(top, bottom)
    assert (top.get_title(), bottom.get_title()) == ("pick", "default")
    assert top.get_legend() is not None and bottom.get_legend() is None  # one legend


def test_step_traces_cut_the_warm_up_off_and_mark_an_arm_ended_early(tmp_path, drawn):
    plots.draw_step_traces(TRACES, {"default": "stopped"}, [tmp_path / "traces.png"])
    ((ax,),) = drawn
    assert ax.get_ylim()[1] == pytest.approx(1.5 * 141.0)  # 1.5x the slowest median
    assert [text.get_text() for text in ax.texts] == ["axis cut at 212 ms (warm-up above)"]
    labels = [text.get_text() for text in ax.get_legend().get_texts()]
    assert labels == ["pick", "default (stopped at 5)"]


def test_step_traces_without_a_spike_keep_the_whole_axis(tmp_path, drawn):
    plots.draw_step_traces({"pick": [100.0, 101.0, 99.0]}, {}, [tmp_path / "traces.png"])
    ((ax,),) = drawn
    assert len(ax.texts) == 0 and ax.get_ylim()[1] > 101.0


def test_predicted_against_measured_is_square_even_for_one_point(tmp_path, drawn):
    plots.draw_predicted_vs_measured([("pick", 100.0, 100.0, None)], [tmp_path / "pvm.png"])
    ((ax,),) = drawn
    assert ax.get_xlim() == ax.get_ylim() == pytest.approx((95.0, 105.0))
    plots.draw_predicted_vs_measured(
        [("a", 100.0, 110.0, (105.0, 115.0)), ("b", 200.0, 190.0, None)], [tmp_path / "pvm.png"]
    )
    low, high = drawn[-1][0].get_xlim()
    assert low < 100.0 and high > 200.0 and drawn[-1][0].get_ylim() == (low, high)


def test_memory_draws_a_bar_per_rank_and_series_and_the_hbm_line(tmp_path, drawn):
    series = [("pick", (40.0, 50.0, 45.0), (41.0,)), ("default", (60.0, 30.0), None)]
    plots.draw_memory(series, 80.0, [tmp_path / "memory.png"])
    ((ax,),) = drawn
    assert len(ax.patches) == 5
    labels = [text.get_text() for text in ax.get_legend().get_texts()]
    assert labels == ["measured", "HBM 80 GiB", "pick", "default"]
    assert [tick.get_text() for tick in ax.get_xticklabels()] == [f"PP rank {r}" for r in range(3)]
