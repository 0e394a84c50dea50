"""What the report derives from a tune summary: how well the predictions held, the pick's
speedups over each baseline and on what basis, the pick's shape, the paste line."""

from __future__ import annotations

import dataclasses
import math
import shlex
import warnings

import pytest
from scipy.stats import spearmanr

from ray_layout.ab.vocabulary import ArmRole, ArmStatus
from ray_layout.report.document import render_markdown
from ray_layout.report.sections import build_document
from ray_layout.report.summary import (
    is_measured,
    paste_line,
    pick_arm,
    pick_shape,
    prediction_accuracy,
    saved_share,
    speedups,
)
from tests.helpers.report_summary import COUNT, CURRENT, DEFAULT, arm, no_ab, with_current


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
    found = speedups(no_ab(summary))
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
        if a.arm == "count-based"
        else a
        for a in summary.arms
    )
    found = speedups(dataclasses.replace(summary, arms=merged))
    assert found["count-based rule"].basis == "measured"
    assert found["count-based rule"].value == pytest.approx(7450.0 / 6310.0)

    # no baseline arm and no timeline for it: no value, a reason instead
    bare = dataclasses.replace(summary, arms=summary.arms[:1], timelines={})
    missing = speedups(bare)["Megatron default"]
    assert missing.value is None and missing.basis is None and missing.note


def test_the_speedup_over_the_configs_current_layout_comes_first(summary):
    assert ArmRole.CURRENT not in speedups(summary)  # no current layout: no line for one
    found = speedups(with_current(summary))
    assert list(found) == [ArmRole.CURRENT, ArmRole.DEFAULT, ArmRole.COUNT_BASED]
    current = found[ArmRole.CURRENT]
    assert current.basis == "measured" and current.value == pytest.approx(7572.0 / 6310.0)
    assert current.baseline_layout == CURRENT
    assert speedups(no_ab(with_current(summary)))[ArmRole.CURRENT].basis == "predicted"
    # the current layout is Megatron's default: one arm holds both roles, and both speedups
    shared = tuple(
        dataclasses.replace(a, roles=(ArmRole.CURRENT, ArmRole.DEFAULT))
        if a.arm == "default"
        else a
        for a in summary.arms
    )
    found = speedups(dataclasses.replace(summary, arms=shared))
    assert found[ArmRole.CURRENT].value == found[ArmRole.DEFAULT].value == 9400.0 / 6310.0


def test_vpp_comes_from_the_pick_layout(summary):
    interleaved = "Et*2|t*2|t*2|t*2|t*2|t*2|t*2|t*2mL"  # 8 stages on PP=4: VPP 2
    flags = ("--pipeline-model-parallel-size", "4", "--pipeline-model-parallel-layout", interleaved)
    changed = dataclasses.replace(summary, pick=interleaved, flags=flags)
    assert pick_shape(changed) == (4, 2)
    text = render_markdown(build_document(changed))  # no plots drawn: each says it was skipped
    assert "PP 4, VPP 2" in text and f"```bash\n{shlex.join(flags)}\n```" in text
    assert "Plot timelines skipped" in text


def test_the_pick_arm_is_the_winner_holding_it_else_a_candidate_else_any(summary):
    pick = summary.arms[0]
    baseline = dataclasses.replace(
        pick, arm="default", roles=(ArmRole.DEFAULT,), status=ArmStatus.STOPPED
    )
    lost = dataclasses.replace(pick, arm="candidate-9", status=ArmStatus.LOST)
    assert pick_arm(dataclasses.replace(summary, arms=(baseline, lost, pick))) is pick
    assert pick_arm(dataclasses.replace(summary, arms=(baseline, lost))) is lost
    assert pick_arm(dataclasses.replace(summary, arms=(baseline,))) is baseline
    assert pick_arm(dataclasses.replace(summary, arms=summary.arms[1:])) is None


def test_without_flags_the_paste_line_is_the_layout_alone(summary):
    bare = dataclasses.replace(summary, flags=())
    assert paste_line(bare) == "--pipeline-model-parallel-layout 'Et*5|t*6|t*5|mL'"
    assert pick_shape(dataclasses.replace(bare, parallel={"vpp": 1})) == (None, 1)


@pytest.mark.parametrize(
    ("spent", "full", "share"),
    [(1200.0, 2000.0, 0.4), (400.0, 400.0, 0.0), (5.0, 0.0, None), (5.0, math.nan, None)],
)
def test_the_saving_is_the_share_of_full_not_spent_and_unknown_without_full(spent, full, share):
    assert saved_share(spent, full) == (None if share is None else pytest.approx(share))


@pytest.mark.parametrize("measured", [None, 0.0, -1.0, math.nan, math.inf])
def test_an_arm_without_a_positive_finite_mean_is_not_measured(measured):
    assert not is_measured(arm("a", 100.0, measured))
    assert not prediction_accuracy([arm("a", 100.0, measured)]).errors
