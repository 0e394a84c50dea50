"""The tune report: accuracy and speedup numbers, Markdown and HTML content, plots, determinism."""

from __future__ import annotations

import base64
import dataclasses
import math
import re
import shlex
import warnings
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console
from scipy.stats import spearmanr

from ray_layout.ab.decisions import Decision
from ray_layout.ab.vocabulary import ABAction, ArmRole, ArmStatus
from ray_layout.model.costs import load_costs
from ray_layout.model.layout import Layout
from ray_layout.model.loading import load_recipe
from ray_layout.report.document import render_markdown
from ray_layout.report.sections import build_document
from ray_layout.report.summary import (
    ArmOutcome,
    SearchFacts,
    TuneSummary,
    paste_line,
    pick_shape,
    prediction_accuracy,
    speedups,
)
from ray_layout.report.terminal import print_summary
from ray_layout.report.write import write_report
from search.planner import PlanOptions, Problem, SearchSpec, simulate_given

HANDBOOK = "configs/handbook_7b_a1b.yaml"
COSTS = "configs/costs/handbook_h200_example.json"
PICK = "Et*5|t*6|t*5|mL"
DEFAULT = "Et*4|t*4|t*4|t*4mL"
COUNT = "Et*4|t*5|t*5|t*2mL"
HBM = 131.0


def arm(name, predicted, measured, layout=None, status=None, **kw):
    """A small arm with round numbers, for the arithmetic tests."""
    return ArmOutcome(
        arm=name,
        layout=layout or f"Et*{len(name)}|L",
        roles=(ArmRole.CANDIDATE,),
        predicted_ms=predicted,
        measured_ms=measured,
        ci_ms=None if measured is None else (measured - 1.0, measured + 1.0),
        iterations=0 if measured is None else 30,
        status=status or (ArmStatus.NOT_RUN if measured is None else ArmStatus.LOST),
        reason="",
        predicted_memory_gib=(),
        measured_memory_gib=None,
        gpu_seconds=0.0,
        **kw,
    )


# --- the realistic fixture: the handbook recipe on PP=4 with the example costs -----------------


def _steps(measured: float, steady: int, seed: int) -> tuple[float, ...]:
    rng = np.random.default_rng(seed)
    warm_up = [measured * 3.0, measured * 1.4, measured * 1.05]
    noise = rng.normal(0.0, 0.004 * measured, steady)
    noise -= noise.mean()  # the steady mean is exactly the measured mean
    return tuple(round(x, 3) for x in warm_up + list(measured + noise))


@pytest.fixture(scope="module")
def summary() -> TuneSummary:
    recipe = load_recipe(HANDBOOK)
    costs = load_costs(COSTS)
    spec, options = SearchSpec(num_microbatches=32), PlanOptions(hbm_gib=HBM)

    def simulate(layout: str):
        return simulate_given(Layout.parse(layout, 4), Problem.of(recipe, costs, spec, options))

    sims = {
        name: simulate(layout)
        for name, layout in [
            ("pick", PICK),
            ("Megatron default", DEFAULT),
            ("count-based rule", COUNT),
        ]
    }
    # (arm, layout, role, measured, steady iterations, status, reason)
    table = [
        (
            "candidate-1",
            PICK,
            ArmRole.CANDIDATE,
            6310.0,
            40,
            ArmStatus.WON,
            "fastest; every rival stopped",
        ),
        (
            "candidate-2",
            "Et*5|t*5|t*6|mL",
            ArmRole.CANDIDATE,
            6420.0,
            24,
            ArmStatus.STOPPED,
            "slower than candidate-1, p = 0.003 < 0.01",
        ),
        (
            "candidate-3",
            "Et*4|t*6|t*6|mL",
            ArmRole.CANDIDATE,
            None,
            0,
            ArmStatus.FAILED,
            "rank 2 ran out of memory (CUDA OOM)",
        ),
        (
            "default",
            DEFAULT,
            ArmRole.DEFAULT,
            9400.0,
            12,
            ArmStatus.STOPPED,
            "slower than candidate-1 at look 1",
        ),
        (
            "count-based",
            COUNT,
            ArmRole.COUNT_BASED,
            7450.0,
            16,
            ArmStatus.STOPPED,
            "slower than candidate-1 at look 2",
        ),
    ]
    arms = []
    for index, (name, layout, role, measured, steady, status, reason) in enumerate(table):
        sim = simulate(layout)
        arms.append(
            ArmOutcome(
                arm=name,
                layout=layout,
                roles=(role,),
                predicted_ms=sim.candidate.mean_ms,
                measured_ms=measured,
                ci_ms=None if measured is None else (measured - 15.0, measured + 15.0),
                iterations=steady,
                status=status,
                reason=reason,
                predicted_memory_gib=sim.candidate.memory_gib,
                measured_memory_gib=None
                if measured is None
                else tuple(round(m * 1.03, 2) for m in sim.candidate.memory_gib),
                gpu_seconds=8 * (steady + 3) * (measured or 0.0) / 1000,
                steps_ms=() if measured is None else _steps(measured, steady, index),
            )
        )
    decisions = (
        Decision("default", DEFAULT, 1, ABAction.STOP, "slower than candidate-1", -9.1, 1.2e-6,
                 "candidate-1", 12, 9400.0),
        Decision("count-based", COUNT, 2, ABAction.STOP, "slower than candidate-1", -5.2, 4.0e-4,
                 "candidate-1", 16, 7450.0),
        Decision("candidate-2", "Et*5|t*5|t*6|mL", 3, ABAction.STOP, "slower than candidate-1",
                 -3.1, 0.003, "candidate-1", 24, 6420.0),
        Decision("candidate-1", PICK, 4, ABAction.WIN, "every rival stopped", math.nan, math.nan,
                 None, 40, 6310.0),
    )  # fmt: skip
    return TuneSummary(
        model="handbook_7b_a1b",
        config=HANDBOOK,
        study="h200-study",
        store="costs_store",
        backend="emulated",
        hardware="8x H200 (emulated)",
        parallel={
            "pp": 4,
            "vpp": 1,
            "tp": 1,
            "ep": 2,
            "dp": 2,
            "micro_batch_size": 2,
            "global_batch_size": 128,
            "num_microbatches": 32,
        },
        hbm_gib=HBM,
        pick=PICK,
        flags=("--pipeline-model-parallel-size", "4", "--pipeline-model-parallel-layout", PICK),
        pick_source="A/B test",
        arms=tuple(arms),
        decisions=decisions,
        timelines=sims,
        unit_costs=costs,
        fit_warnings=("unit m: residual 4.1% above the 3% target",),
        search=SearchFacts(method="enumeration", valid_layouts=816, scored=680, seconds=0.08),
        gpu_seconds_spent=1200.0,
        gpu_seconds_full=2000.0,
        phase_seconds={
            "size": 0.2,
            "profile": 310.0,
            "fit": 1.5,
            "search": 0.1,
            "ab": 540.0,
            "report": 2.0,
        },
        notes=("emulated backend: step times are the emulator's, not a GPU's",),
    )


@pytest.fixture(scope="module")
def written(summary, tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    return out, write_report(summary, out)


def _no_ab(summary: TuneSummary) -> TuneSummary:
    arms = tuple(
        dataclasses.replace(
            a,
            measured_ms=None,
            ci_ms=None,
            iterations=0,
            status=ArmStatus.NOT_RUN,
            reason="no A/B asked",
            measured_memory_gib=None,
            gpu_seconds=0.0,
            steps_ms=(),
        )
        for a in summary.arms
    )
    return dataclasses.replace(
        summary,
        arms=arms,
        decisions=(),
        pick_source="prediction (no A/B)",
        gpu_seconds_spent=400.0,
        gpu_seconds_full=400.0,
    )


# --- numbers --------------------------------------------------------------------------------------


def test_accuracy_against_hand_computation_and_scipy():
    arms = [
        arm("a", 110.0, 100.0),
        arm("bb", 180.0, 200.0),
        arm("ccc", 330.0, 300.0),
        arm("dddd", 500.0, 400.0),
        arm("eeeee", 50.0, None),
    ]
    accuracy = prediction_accuracy(arms)
    assert dict(accuracy.errors) == pytest.approx({"a": 0.1, "bb": -0.1, "ccc": 0.1, "dddd": 0.25})
    assert accuracy.measured == 4  # the unmeasured arm counts nowhere
    assert accuracy.mean_abs_error == pytest.approx((0.1 + 0.1 + 0.1 + 0.25) / 4)
    assert accuracy.max_abs_error == pytest.approx(0.25) and accuracy.worst_arm == "dddd"
    assert accuracy.spearman == pytest.approx(1.0)  # ranks agree although values do not

    swapped = [arm("a", 1.0, 10.0), arm("b", 2.0, 30.0), arm("c", 3.0, 20.0), arm("d", 4.0, 40.0)]
    rho = prediction_accuracy(swapped).spearman
    assert rho == pytest.approx(1 - 6 * (0 + 1 + 1 + 0) / (4 * (16 - 1)))  # 0.8 by hand
    assert rho == pytest.approx(spearmanr([1, 2, 3, 4], [10, 30, 20, 40]).statistic)


def test_spearman_is_none_for_two_arms_or_a_constant_column_without_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        two = prediction_accuracy([arm("a", 1.0, 2.0), arm("b", 2.0, 3.0)])
        constant = prediction_accuracy(
            [arm(n, 5.0, m) for n, m in [("a", 1.0), ("b", 2.0), ("c", 3.0)]]
        )
        none = prediction_accuracy([arm("a", 1.0, None)])
    assert two.spearman is None and two.mean_abs_error == pytest.approx((1 / 2 + 1 / 3) / 2)
    assert constant.spearman is None and constant.measured == 3
    assert none.measured == 0 and none.mean_abs_error is None and none.spearman is None


def test_speedup_basis_switches_from_measured_to_predicted(summary):
    found = speedups(summary)
    default, count = found["Megatron default"], found["count-based rule"]
    assert default.basis == "measured" and default.value == pytest.approx(9400.0 / 6310.0)
    assert count.basis == "measured" and count.value == pytest.approx(7450.0 / 6310.0)
    assert default.baseline_layout == DEFAULT

    # the default never measured: its speedup falls back to prediction, the other stays measured
    arms = tuple(
        dataclasses.replace(a, measured_ms=None, status=ArmStatus.FAILED)
        if a.arm == "default"
        else a
        for a in summary.arms
    )
    found = speedups(dataclasses.replace(summary, arms=arms))
    pick_ms = summary.arms[0].predicted_ms
    default = found["Megatron default"]
    assert default.basis == "predicted"
    assert default.value == pytest.approx(summary.arms[3].predicted_ms / pick_ms)
    assert found["count-based rule"].basis == "measured"

    # nothing measured: both predicted, the handbook's 1.48x and 1.19x (docs/search.md)
    found = speedups(_no_ab(summary))
    assert {s.basis for s in found.values()} == {"predicted"}
    assert found["Megatron default"].value == pytest.approx(1.48, abs=0.01)
    assert found["count-based rule"].value == pytest.approx(1.19, abs=0.01)

    # the count-based rule itself won: 1.00x over it, measured on the one arm
    won = tuple(
        dataclasses.replace(
            a, status=ArmStatus.WON if a.arm == "count-based" else ArmStatus.STOPPED
        )
        for a in summary.arms
    )
    found = speedups(dataclasses.replace(summary, arms=won, pick=COUNT))
    assert found["count-based rule"].value == 1.0 and found["count-based rule"].basis == "measured"
    assert found["Megatron default"].value == pytest.approx(9400.0 / 7450.0)

    # the count-based layout ran as a candidate arm ("candidate + count-based rule"): found
    merged = tuple(
        dataclasses.replace(a, arm="candidate-9", roles=(ArmRole.CANDIDATE, ArmRole.COUNT_BASED))
        if a.arm == "count-based" else a
        for a in summary.arms
    )  # fmt: skip
    found = speedups(dataclasses.replace(summary, arms=merged))
    assert found["count-based rule"].basis == "measured"
    assert found["count-based rule"].value == pytest.approx(7450.0 / 6310.0)

    # no baseline arm and no timeline for it: no value, a reason instead
    bare = dataclasses.replace(summary, arms=summary.arms[:1], timelines={})
    missing = speedups(bare)["Megatron default"]
    assert missing.value is None and missing.basis is None and missing.note


CURRENT = "Et*3|t*5|t*5|t*3mL"  # what the config runs today: 7,572 ms measured, 1.20x the pick's


def _with_current(summary: TuneSummary) -> TuneSummary:
    """The tune of a config whose split gives ``CURRENT``: one more arm, and its timeline."""
    problem = Problem.of(load_recipe(HANDBOOK), summary.unit_costs, SearchSpec(32),
                         PlanOptions(hbm_gib=HBM))  # fmt: skip
    sim = simulate_given(Layout.parse(CURRENT, 4), problem)
    current = dataclasses.replace(
        summary.arms[3], arm="current", layout=CURRENT, roles=(ArmRole.CURRENT,),
        predicted_ms=sim.candidate.mean_ms, measured_ms=7572.0, ci_ms=(7557.0, 7587.0),
        steps_ms=_steps(7572.0, 12, 9),
    )  # fmt: skip
    return dataclasses.replace(
        summary,
        arms=(*summary.arms[:3], current, *summary.arms[3:]),
        timelines={**summary.timelines, ArmRole.CURRENT.value: sim},
    )


def test_the_speedup_over_the_configs_current_layout_comes_first(summary):
    assert ArmRole.CURRENT not in speedups(summary)  # no current layout: no line for one
    found = speedups(_with_current(summary))
    assert list(found) == [ArmRole.CURRENT, ArmRole.DEFAULT, ArmRole.COUNT_BASED]
    current = found[ArmRole.CURRENT]
    assert current.basis == "measured" and current.value == pytest.approx(7572.0 / 6310.0)
    assert current.baseline_layout == CURRENT
    assert speedups(_no_ab(_with_current(summary)))[ArmRole.CURRENT].basis == "predicted"
    # the current layout is Megatron's default: one arm holds both roles, and both speedups
    shared = tuple(
        dataclasses.replace(a, roles=(ArmRole.CURRENT, ArmRole.DEFAULT)) if a.arm == "default"
        else a
        for a in summary.arms
    )  # fmt: skip
    found = speedups(dataclasses.replace(summary, arms=shared))
    assert found[ArmRole.CURRENT].value == found[ArmRole.DEFAULT].value == 9400.0 / 6310.0


def test_the_report_and_terminal_say_the_speedup_over_current_first(summary):
    with_current = _with_current(summary)
    console = Console(record=True, width=160)
    print_summary(with_current, console)
    assert (
        "Speedup: 1.20× over current (measured), 1.49× over Megatron default (measured), "
        "1.18× over count-based rule (measured)"
    ) in console.export_text()
    speed = next(t for t in _tables(render_markdown(build_document(with_current)))
                 if t[0][0] == "Over")  # fmt: skip
    assert [row[0] for row in speed[2:]] == ["current", "Megatron default", "count-based rule"]
    assert speed[2][1] == "`Et*3\\|t*5\\|t*5\\|t*3mL`" and speed[2][4:] == ["1.20×", "measured"]


# --- the documents --------------------------------------------------------------------------------


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


def _tables(text: str) -> list[list[list[str]]]:
    """Every Markdown table: rows of cells, split on pipes without a backslash before them."""
    tables, current = [], []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            current.append([c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]])
        elif current:
            tables.append(current)
            current = []
    return tables


def test_markdown_tables_escape_layouts_and_carry_the_numbers(written, summary):
    text = written[1].markdown.read_text()
    tables = _tables(text)
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


class _Checker(HTMLParser):
    VOID = frozenset({"meta", "img", "br", "hr", "link", "input"})

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []
        self.problems: list[str] = []
        self.counts: dict[str, int] = {}
        self.images: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.counts[tag] = self.counts.get(tag, 0) + 1
        if tag == "img":
            self.images.append(dict(attrs)["src"])
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        if not self.stack or self.stack[-1] != tag:
            self.problems.append(f"</{tag}> closes {self.stack[-1:] or 'nothing'}")
        else:
            self.stack.pop()


def test_html_is_self_contained_and_well_formed(written):
    files = written[1]
    page = files.html.read_text()
    assert page.startswith("<!DOCTYPE html>")
    for external in ('src="http', "<script", "<link", 'href="http', "url(", "@import"):
        assert external not in page
    checker = _Checker()
    checker.feed(page)
    checker.close()
    assert checker.problems == [] and checker.stack == []
    # results, speedups, decisions, GPU time, memory, unit costs, phases: as in the Markdown
    assert checker.counts["table"] == len(_tables(files.markdown.read_text())) == 7
    assert len(checker.images) == 4
    for src in checker.images:
        assert src.startswith("data:image/png;base64,")
        assert base64.b64decode(src.split(",", 1)[1])[:8] == b"\x89PNG\r\n\x1a\n"
    assert "Et*5|t*6|t*5|mL" in page and "\\|" not in page  # escaped for HTML, not Markdown
    assert "--pipeline-model-parallel-layout &#x27;Et*5|t*6|t*5|mL&#x27;" in page


def test_html_escapes_markup_in_reasons(summary, tmp_path):
    arms = (
        dataclasses.replace(summary.arms[0], reason="<b>fast</b> & p < 0.01"),
        *summary.arms[1:],
    )
    files = write_report(dataclasses.replace(summary, arms=arms), tmp_path)
    page = files.html.read_text()
    assert "&lt;b&gt;fast&lt;/b&gt; &amp; p &lt; 0.01" in page and "<b>" not in page
    assert "\\<b\\>fast\\</b\\> & p \\< 0.01" in files.markdown.read_text()


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
    files = write_report(_no_ab(summary), tmp_path)
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
    checker = _Checker()
    checker.feed(files.html.read_text())
    assert checker.problems == [] and checker.stack == [] and len(checker.images) == 2


def test_a_bare_summary_renders(summary, tmp_path):
    bare = dataclasses.replace(
        _no_ab(summary),
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
    print_summary(_no_ab(summary), console)
    text = console.export_text()
    assert "(not measured)" in text and "(predicted)" in text and "report.md" not in text


def test_vpp_comes_from_the_pick_layout(summary):
    interleaved = "Et*2|t*2|t*2|t*2|t*2|t*2|t*2|t*2mL"  # 8 stages on PP=4: VPP 2
    flags = ("--pipeline-model-parallel-size", "4", "--pipeline-model-parallel-layout", interleaved)
    changed = dataclasses.replace(summary, pick=interleaved, flags=flags)
    assert pick_shape(changed) == (4, 2)
    text = render_markdown(build_document(changed))  # no plots drawn: each says it was skipped
    assert "PP 4, VPP 2" in text and f"```bash\n{shlex.join(flags)}\n```" in text
    assert "Plot timelines skipped" in text
