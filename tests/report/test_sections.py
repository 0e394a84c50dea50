"""The report's content: its sections in order, and the numbers its tables carry, read from
one summary."""

from __future__ import annotations

import dataclasses
import re
import shlex

from ray_layout.report.document import Bullets, Code, Heading, Para, Strong, render_markdown
from ray_layout.report.sections import build_document
from ray_layout.report.summary import paste_line, prediction_accuracy
from tests.helpers.report_summary import markdown_tables, no_ab


def test_markdown_has_the_paste_line_and_sections_in_order(written, summary):
    files = written[1]
    text = files.markdown.read_text()
    line = "--pipeline-model-parallel-size 4 --pipeline-model-parallel-layout 'Et*5|t*6|t*5|mL'"
    assert paste_line(summary) == line
    assert shlex.split(line) == list(summary.flags)
    assert f"```bash\n{line}\n```" in text
    headings = re.findall(r"^#+ (.*)$", text, flags=re.MULTILINE)
    assert headings[0] == "Pipeline layout report: handbook_7b_a1b"
    order = [
        "Use this",
        "Results",
        "Speedups",
        "Prediction accuracy",
        "A/B decisions",
        "GPU time",
        "Memory of the pick",
        "Unit costs",
        "Fit warnings and notes",
        "Phase times",
        "How to read this",
    ]
    assert [h for h in headings if h in order] == order
    assert "PP 4, VPP 1" in text
    assert not re.search(r"20\d\d-\d\d-\d\d", text)  # no date: reproducible


def test_markdown_tables_escape_layouts_and_carry_the_numbers(written, summary):
    text = written[1].markdown.read_text()
    tables = markdown_tables(text)
    for table in tables:  # escaped pipes keep every row as wide as the header
        assert {len(row) for row in table} == {len(table[0])}, table[0]
    results = next(t for t in tables if t[0][:2] == ["Arm", "Role"])
    assert [row[0] for row in results[2:]] == [
        "candidate-1 **(pick)**",
        "candidate-2",
        "candidate-3",
        "default",
        "count-based",
    ]
    layouts = [row[2] for row in results[2:]]
    assert layouts[0] == "`Et*5\\|t*6\\|t*5\\|mL`" and layouts[3] == "`Et*4\\|t*4\\|t*4\\|t*4mL`"
    pick_row = results[2]
    predicted = summary.arms[0].predicted_ms
    assert pick_row[3] == f"{predicted:,.1f}" and pick_row[4] == "6,310.0 ± 15.0"
    assert pick_row[5] == f"{predicted / 6310.0 - 1:+.1%}" and pick_row[6] == "won"
    assert results[4][4:7] == ["—", "—", "failed"]  # never measured: no error either
    speed = next(t for t in tables if t[0][0] == "Over")
    assert speed[2][4:] == ["1.49×", "measured"]  # 9400 / 6310
    assert speed[3][4:] == ["1.18×", "measured"]  # 7450 / 6310
    memory = next(t for t in tables if t[0][:2] == ["PP rank", "Units"])
    assert [row[1] for row in memory[2:]] == ["`Et*5`", "`t*6`", "`t*5`", "`mL`"]
    assert memory[2][2] == f"{summary.arms[0].predicted_memory_gib[0]:.1f}"
    costs = next(t for t in tables if t[0][0] == "Unit")
    assert costs[2] == ["`E`", "embedding", "1.00", "1.00", "2.00", "0"]
    assert costs[5] == ["`L`", "output layer + loss", "38.00", "76.00", "114.00", "0.020"]
    decisions = next(t for t in tables if t[0][0] == "Look")
    assert [row[1:3] for row in decisions[2:]] == [
        ["default", "stop"],
        ["count-based", "stop"],
        ["candidate-2", "stop"],
        ["candidate-1", "win"],
    ]
    assert decisions[2][4] == "1.2e-06" and decisions[5][4] == "—"
    assert "saved 40.0%" in text  # 1 - 1200 / 2000
    assert "CUDA OOM" in text and "residual 4.1%" in text
    accuracy = prediction_accuracy(summary.arms)
    assert f"Mean absolute error: {accuracy.mean_abs_error:.1%}" in text
    assert f"Spearman rank correlation of predicted and measured: {accuracy.spearman:.2f}" in text


def section(blocks, title: str) -> list:
    """The blocks under the level-2 heading ``title``, up to the next one."""
    start = blocks.index(Heading(2, title)) + 1
    end = next(
        (i for i, b in enumerate(blocks[start:], start) if isinstance(b, Heading) and b.level == 2),
        len(blocks),
    )
    return blocks[start:end]


def test_phase_times_add_up_to_a_total_with_each_phases_share(summary):
    timed = dataclasses.replace(summary, phase_seconds={"profile": 30.0, "ab": 10.0})
    (table,) = section(build_document(timed), "Phase times")
    assert table.rows == (
        ("profile", "30.0", "75.0%"),
        ("ab", "10.0", "25.0%"),
        (Strong("total"), "40.0", "100.0%"),
    )
    untimed = dataclasses.replace(summary, phase_seconds={"fit": 0.0})
    (zero,) = section(build_document(untimed), "Phase times")
    assert zero.rows[-1] == (Strong("total"), "0.0", "—")


def test_warnings_and_notes_are_listed_and_none_is_said(summary):
    (items,) = section(build_document(summary), "Fit warnings and notes")
    assert items == Bullets(
        (
            ("Fit warning: unit m: residual 4.1% above the 3% target",),
            ("emulated backend: step times are the emulator's, not a GPU's",),
        )
    )
    quiet = dataclasses.replace(summary, fit_warnings=(), notes=())
    assert section(build_document(quiet), "Fit warnings and notes") == [Para(("None.",))]


def test_the_header_names_the_run_and_says_what_was_not_given(summary):
    blocks = build_document(dataclasses.replace(summary, hbm_gib=None))
    assert blocks[0] == Heading(1, "Pipeline layout report: handbook_7b_a1b")
    (parallel,) = blocks[2].parts
    assert parallel == (
        "Parallel: PP 4, VPP 1, TP 1, EP 2, DP 2, micro-batch size 2, global batch size 128, "
        "micro-batches 32. HBM per GPU: not given."
    )
    search = section(blocks, "Results")[0]
    assert search == Para(
        ("Search: schedule 1f1b, method enumeration, valid layouts 816, scored 680, seconds 0.08.",)
    )


def test_a_megatron_core_report_says_its_times_are_cpu_times(summary):
    header = build_document(dataclasses.replace(summary, backend="megatron-core", hardware="cpu"))
    assert "CPU times" in "".join(str(part) for part in header[1].parts)
    emulated = build_document(summary)
    assert "CPU times" not in "".join(str(part) for part in emulated[1].parts)


def test_an_unmeasured_pick_says_its_step_is_predicted_only(summary):
    predicted = summary.arms[0].predicted_ms
    use = section(build_document(no_ab(summary)), "Use this")
    assert use[-1] == Para(
        (f"Step time of the pick: predicted {predicted:,.1f} ms (not measured).",)
    )
    measured = section(build_document(summary), "Use this")[-1].parts[0]
    assert measured.startswith("Step time of the pick: measured 6,310.0 ms (CI 6,295.0 to ")
    assert "40 steady iterations" in measured


SELECTIVE = ("--recompute-granularity", "selective", "--recompute-modules", "core_attn", "moe")


def recomputing(summary, job: tuple[str, ...] = ()):
    """The summary of a layout x recompute search: the pick recomputes, the job as ``job``."""
    pick = dataclasses.replace(summary.arms[0], recompute=SELECTIVE)
    rest = tuple(dataclasses.replace(arm, recompute=job) for arm in summary.arms[1:])
    return dataclasses.replace(
        summary,
        arms=(pick, *rest),
        flags=(*summary.flags, *SELECTIVE),
        recompute=SELECTIVE,
        job_recompute=job,
    )


def test_each_arms_recompute_flags_are_a_column_where_any_arm_recomputes(summary):
    plain = render_markdown(build_document(summary))
    assert (
        "Recompute" not in next(t for t in markdown_tables(plain) if t[0][:2] == ["Arm", "Role"])[0]
    )
    text = render_markdown(build_document(recomputing(summary)))
    results = next(t for t in markdown_tables(text) if t[0][:2] == ["Arm", "Role"])
    assert results[0][:5] == ["Arm", "Role", "Layout", "Recompute", "Predicted ms"]
    assert [row[3] for row in results[2:]] == [f"`{' '.join(SELECTIVE)}`"] + ["none"] * 4
    assert results[2][5] == "6,310.0 ± 15.0"  # the columns after it move along
    assert f"```bash\n{shlex.join((*summary.flags, *SELECTIVE))}\n```" in text


def test_the_pick_that_recomputes_otherwise_says_what_to_change_besides_pasting(summary):
    assert not any("Recomputation" in str(b) for b in section(build_document(summary), "Use this"))
    new = section(build_document(recomputing(summary)), "Use this")
    assert new[2] == Para(
        ("Recomputation: the pick ", "runs ", Code(" ".join(SELECTIVE)),
         ", which the flags above carry", ".")
    )  # fmt: skip
    full = ("--recompute-granularity", "full", "--recompute-method", "uniform")
    changed = section(build_document(recomputing(summary, full)), "Use this")
    assert changed[2].parts[-4:] == (
        "; take out your job's own recompute flags, ",
        Code(" ".join(full)),
        ", first",
        ".",
    )
    dropped = dataclasses.replace(recomputing(summary, full), recompute=())
    parts = section(build_document(dropped), "Use this")[2].parts
    assert parts[:2] == ("Recomputation: the pick ", "runs without recomputation")
