"""The quickstart benchmark's comparisons (benchmarks/bench_quickstart.py), without a cluster:
it runs what ``make run`` runs, and its verdicts say what the benchmark's targets say."""

from __future__ import annotations

import shlex

import pytest

from benchmarks.bench_quickstart import (
    MAKE_RUN,
    Faithfulness,
    arm_checks,
    pick_check,
)
from ray_layout.ab.vocabulary import ArmRole, ArmStatus
from ray_layout.report.summary import ArmOutcome
from tests.helpers.paths import ROOT


def _arm(name: str, layout: str, measured_ms: float | None) -> ArmOutcome:
    return ArmOutcome(name, layout, (ArmRole.CANDIDATE,), 1000.0, measured_ms, None, 10,
                      ArmStatus.STOPPED, "", (), None, 1.0)  # fmt: skip


def test_the_benchmark_runs_make_runs_command():
    makefile = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    recipe = next(line for line in makefile.splitlines() if "-m ray_layout.tune" in line)
    words = shlex.split(recipe)
    assert tuple(words[words.index("ray_layout.tune") + 1 :]) == MAKE_RUN


def test_each_arm_is_held_to_two_percent_of_its_own_costs_step():
    arms = [_arm("candidate-1", "a", 1019.0), _arm("default", "b", 979.0), _arm("x", "c", None)]
    checks = arm_checks(arms, {"a": 1000.0, "b": 1000.0, "c": 1000.0})
    assert [c.ok for c in checks] == [True, False, False]
    assert checks[0].error == pytest.approx(0.019)
    assert checks[1].error == pytest.approx(-0.021)
    assert checks[2].error is None  # never measured: a miss, not a pass


@pytest.mark.parametrize(
    ("ab_pick", "verdict", "ok"),
    [("best", "equal", True), ("close", "within the margin", True), ("far", "behind", False)],
)
def test_the_pick_is_the_own_costs_pick_or_tied_within_the_margin(ab_pick, verdict, ok):
    simulated = {"best": 1000.0, "close": 1004.0, "far": 1030.0}
    measured = {"best": 1010.0, "close": 1005.0}
    check = pick_check(ab_pick, "best", simulated, measured, margin=0.02)
    assert (check.verdict, check.ok) == (verdict, ok)
    assert check.simulated_gap == pytest.approx(simulated[ab_pick] / 1000.0 - 1)
    if ab_pick == "far":
        assert check.measured_gap is None  # not an arm: no measured gap to show
    else:
        assert check.measured_gap == pytest.approx(measured[ab_pick] / 1010.0 - 1)


def test_early_stopping_must_save_thirty_percent():
    def passes(spent: float) -> bool:
        pick = pick_check("a", "a", {"a": 1.0}, {}, margin=0.02)
        return Faithfulness((), (), pick, spent, 1000.0).passes()["gpu_seconds"]

    assert passes(700.0)
    assert not passes(701.0)
