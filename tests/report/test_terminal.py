"""The tune's last words on the terminal: the pick, the paste line whole (and the pick's
recomputation where it is not the job's), the step time, the speedups in order, the GPU time
saved and where the report is."""

from __future__ import annotations

import dataclasses

from rich.console import Console

from ray_layout.report.document import render_markdown
from ray_layout.report.sections import build_document
from ray_layout.report.summary import paste_line
from ray_layout.report.terminal import print_summary
from tests.helpers.report_summary import markdown_tables, no_ab, with_current


def test_the_report_and_terminal_say_the_speedup_over_current_first(summary):
    current = with_current(summary)
    console = Console(record=True, width=160)
    print_summary(current, console)
    assert (
        "Speedup: 1.20× over current (measured), 1.49× over Megatron default (measured), "
        "1.18× over count-based rule (measured)"
    ) in console.export_text()
    speed = next(
        t for t in markdown_tables(render_markdown(build_document(current))) if t[0][0] == "Over"
    )
    assert [row[0] for row in speed[2:]] == ["current", "Megatron default", "count-based rule"]
    assert speed[2][1] == "`Et*3\\|t*5\\|t*5\\|t*3mL`" and speed[2][4:] == ["1.20×", "measured"]


def test_print_summary(summary, written):
    console = Console(record=True, width=100)
    print_summary(summary, console, written[1])
    text = console.export_text()
    assert paste_line(summary) in text  # one unbroken line, ready to paste
    assert "Pick Et*5|t*6|t*5|mL, from A/B test" in text
    assert "measured 6,310.0 ms" in text
    assert "1.49× over Megatron default (measured)" in text
    assert "1.18× over count-based rule (measured)" in text
    assert "over current" not in text  # the config states no split
    assert "(40.0% saved)" in text and "report.md" in text and "report.html" in text
    console = Console(record=True, width=100)
    print_summary(no_ab(summary), console)
    text = console.export_text()
    assert "(not measured)" in text and "(predicted)" in text and "report.md" not in text


def printed(summary, width: int = 100) -> list[str]:
    console = Console(record=True, width=width)
    print_summary(summary, console)
    return console.export_text().splitlines()


def test_the_paste_line_stays_whole_on_a_narrow_terminal(summary):
    lines = printed(summary, width=40)
    assert f"Paste: {paste_line(summary)}" in lines


def test_what_is_missing_is_said_in_its_place(summary):
    bare = dataclasses.replace(
        summary, arms=summary.arms[:1], timelines={}, gpu_seconds_full=0.0, fit_warnings=()
    )
    lines = printed(bare, width=200)
    speedup = next(line for line in lines if line.startswith("Speedup: "))
    assert speedup == (
        "Speedup: — over Megatron default (no Megatron default layout scored), "
        "— over count-based rule (no count-based rule layout scored)"
    )
    assert "GPU-seconds: 1,200 spent" in lines and not any("warning" in line for line in lines)
    assert "1 fit warning(s): see the report" in printed(summary)


def test_a_pick_that_recomputes_otherwise_than_the_job_says_so_under_the_paste_line(summary):
    selective = ("--recompute-granularity", "selective", "--recompute-modules", "core_attn")
    recomputing = dataclasses.replace(
        summary, flags=(*summary.flags, *selective), recompute=selective
    )
    lines = printed(recomputing, width=200)
    paste = lines.index(f"Paste: {paste_line(recomputing)}")
    assert " ".join(selective) in lines[paste]
    assert lines[paste + 1] == f"Recompute: {' '.join(selective)} (your job: none)"
    assert not any(line.startswith("Recompute: ") for line in printed(summary))
    dropped = dataclasses.replace(summary, job_recompute=selective)
    assert f"Recompute: none (your job: {' '.join(selective)})" in printed(dropped, width=200)
