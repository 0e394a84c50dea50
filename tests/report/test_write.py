"""Writing the report: Markdown, a self-contained well-formed HTML page and the plots, what is
skipped and why, no stale plots, and the same files from the same summary."""

from __future__ import annotations

import base64
import dataclasses
from pathlib import Path

from ray_layout.report.write import write_report
from tests.helpers.report_summary import HtmlChecker, markdown_tables, no_ab


def test_html_is_self_contained_and_well_formed(written):
    files = written[1]
    page = files.html.read_text()
    assert page.startswith("<!DOCTYPE html>")
    for external in ('src="http', "<script", "<link", 'href="http', "url(", "@import"):
        assert external not in page
    checker = HtmlChecker()
    checker.feed(page)
    checker.close()
    assert checker.problems == [] and checker.stack == []
    # results, speedups, decisions, GPU time, memory, unit costs, phases: as in the Markdown
    assert checker.counts["table"] == len(markdown_tables(files.markdown.read_text())) == 7
    assert len(checker.images) == 4
    for src in checker.images:
        assert src.startswith("data:image/png;base64,")
        assert base64.b64decode(src.split(",", 1)[1])[:8] == b"\x89PNG\r\n\x1a\n"
    assert "Et*5|t*6|t*5|mL" in page and "\\|" not in page  # escaped for HTML, not Markdown
    assert "--pipeline-model-parallel-layout &#x27;Et*5|t*6|t*5|mL&#x27;" in page


def test_plots_exist_as_png_and_svg(written):
    out, files = written
    assert files.skipped_plots == ()
    names = ["timelines", "memory", "predicted_vs_measured", "ab_traces"]
    assert sorted(files.plots) == sorted(
        out / "plots" / f"{n}.{s}" for n in names for s in ("png", "svg")
    )
    for name in names:
        assert (out / "plots" / f"{name}.png").read_bytes()[:4] == b"\x89PNG"
        assert b"<svg" in (out / "plots" / f"{name}.svg").read_bytes()[:2000]
        assert f"](plots/{name}.png)" in files.markdown.read_text()


def test_without_an_ab_the_report_renders_and_says_what_it_skipped(summary, written, tmp_path):
    stale = tmp_path / "plots" / "ab_traces.png"
    stale.parent.mkdir()
    stale.write_bytes(b"old")
    files = write_report(no_ab(summary), tmp_path)
    text = files.markdown.read_text()
    assert {Path(p).name for p in files.plots} == {
        "timelines.png",
        "timelines.svg",
        "memory.png",
        "memory.svg",
    }
    assert not stale.exists()  # an earlier report's plot does not linger
    assert len(files.skipped_plots) == 2
    assert "Plot predicted vs measured skipped: no arm was measured in an A/B." in text
    assert "Plot ab traces skipped: no A/B step times were recorded." in text
    assert "No arm was measured, so the predictions are unchecked." in text
    assert "No A/B decision was recorded." in text
    assert "chosen by prediction (no A/B)" in text and "predicted" in text
    assert "saved 0.0%" in text
    checker = HtmlChecker()
    checker.feed(files.html.read_text())
    assert checker.problems == [] and checker.stack == [] and len(checker.images) == 2


def test_a_bare_summary_renders(summary, tmp_path):
    bare = dataclasses.replace(
        no_ab(summary),
        arms=(),
        timelines={},
        unit_costs=None,
        search=None,
        phase_seconds={},
        fit_warnings=(),
        notes=(),
        gpu_seconds_full=0.0,
        hbm_gib=None,
        flags=(),
    )
    files = write_report(bare, tmp_path)
    text = files.markdown.read_text()
    assert files.plots == () and len(files.skipped_plots) == 4
    assert "--pipeline-model-parallel-layout 'Et*5|t*6|t*5|mL'" in text
    assert "No unit costs were given." in text and "No layout was taken to the A/B." in text


def test_writing_twice_gives_identical_files(summary, written, tmp_path):
    first = written[1]
    second = write_report(summary, tmp_path)
    assert second.markdown.read_text() == first.markdown.read_text()
    assert second.html.read_bytes() == first.html.read_bytes()
    for a, b in zip(sorted(first.plots), sorted(second.plots), strict=True):
        assert a.read_bytes() == b.read_bytes(), a.name


def test_the_folder_is_made_and_each_skipped_plot_says_why(summary, tmp_path):
    out = tmp_path / "a" / "b"
    files = write_report(dataclasses.replace(no_ab(summary), timelines={}), out)
    assert (files.markdown, files.html) == (out / "report.md", out / "report.html")
    assert files.skipped_plots == (
        "timelines: no simulated timeline of the pick was given",
        "predicted_vs_measured: no arm was measured in an A/B",
        "ab_traces: no A/B step times were recorded",
    )
    assert files.plots == (out / "plots" / "memory.png", out / "plots" / "memory.svg")
