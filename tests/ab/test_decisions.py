"""The verdicts of an A/B test: stops at a look (failures, blow-ups, the margin, settled ties),
the final choice at the budget and its words, replay of recorded traces, and store rows."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from ray_layout.ab.decisions import decide_look, decision_rows
from ray_layout.ab.final import final_decisions
from ray_layout.ab.replay import replay
from ray_layout.ab.stats import ArmTrace, tied_within_margin
from ray_layout.measure.store_schema import TABLE_SCHEMAS
from tests.helpers.ab_short import BEST, CONFIG, by_arm, steady, tie_traces
from tests.helpers.ab_traces import ar1_steps, traces_of

# --- a look ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("failure", "expected"),
    [
        ("oom", "out of memory"),
        ("nan", "NaN"),
        ("hang", "hang"),
        ("crash", "crash"),
        ("hang: no iteration for 312 s", "hang: no iteration for 312 s"),
    ],
)
def test_failed_arm_stops_at_the_look_whatever_its_length(failure, expected):
    traces = [
        ArmTrace("best", BEST, steady(10, seed=1)),
        ArmTrace("other", "x", steady(10)),
        ArmTrace("bad", "y", steady(2), failure=failure),
    ]
    decision = by_arm(decide_look(traces, 0, CONFIG))["bad"]
    assert (decision.action, decision.look, decision.reference) == ("stop", 0, None)
    assert expected in decision.reason and math.isnan(decision.statistic)
    assert decision.n_steady == 2


def test_blowup_stops_in_decide_look_even_when_the_test_cannot_tell():
    slow = [100.0] * 3 + [400.0, 90.0, 420.0, 410.0, 30.0] * 2  # wild, but median 4x
    traces = [ArmTrace("best", BEST, steady(10)), ArmTrace("slow", "x", tuple(slow))]
    decision = by_arm(decide_look(traces, 0, CONFIG))["slow"]
    assert decision.action == "stop" and decision.reason.startswith("blow-up")
    assert decision.reference == "best"


def test_stopped_and_short_arms_get_no_decision_and_a_lone_arm_continues():
    traces = [
        ArmTrace("a", BEST, steady(10)),
        ArmTrace("b", "x", steady(25, 150.0)),
        ArmTrace("c", "y", steady(9)),
        ArmTrace("d", "z", (), failure="oom"),
    ]
    decisions = decide_look(traces, 0, CONFIG, stopped={"a"})
    assert [(d.arm, d.action) for d in decisions] == [("b", "continue"), ("d", "stop")]
    assert "nothing to compare" in decisions[0].reason
    assert decisions[0].n_steady == 10  # truncated to the look


def test_decisions_do_not_depend_on_how_far_arms_ran_past_the_look():
    rng = np.random.default_rng(5)
    exact = traces_of(ar1_steps(rng, 1, 3, 3 + 10, [100.0, 104.0, 115.0])[0])
    beyond = [replace(t, steps_ms=t.steps_ms + tuple(rng.uniform(50, 500, 60))) for t in exact]
    assert decide_look(exact, 0, CONFIG) == decide_look(beyond, 0, CONFIG)


def test_look_decisions_by_hand():
    traces = [
        ArmTrace("default", "Et*4|t*4|t*4|t*4mL", steady(20, 140.0, seed=1)),
        ArmTrace("cand", BEST, steady(20, 100.0, seed=2)),
        ArmTrace("close", "Et*6|t*5|t*5|mL", steady(20, 101.0, seed=3)),
    ]
    decisions = by_arm(decide_look(traces, 1, CONFIG))
    assert decisions["cand"].action == "continue" and "best" in decisions["cand"].reason
    assert decisions["cand"].reference is None and math.isnan(decisions["cand"].p_value)
    stop = decisions["default"]
    assert (stop.action, stop.reference, stop.look, stop.n_steady) == ("stop", "cand", 1, 20)
    assert stop.p_value < CONFIG.alpha_per_look and stop.statistic > 0
    percent = (stop.mean_ms / decisions["cand"].mean_ms - 1) * 100
    assert stop.reason.startswith(f"{percent:.1f}% slower than {BEST} [cand] (p=")
    assert decisions["close"].action == "continue" and decisions["close"].statistic < 0


# --- store rows --------------------------------------------------------------------------------


def test_decision_rows_fit_the_store_and_ids_are_deterministic():
    traces = [ArmTrace("a", BEST, steady(40, 100.0)), ArmTrace("b", "x", steady(40, 130.0))]
    decisions = replay(traces, CONFIG)
    rows = decision_rows(decisions, "study-1", {"a": "run-a"}, "ab7", now=1234.5)
    columns = [n for n in TABLE_SCHEMAS["decisions"].names if n != "schema_version"]
    assert all(sorted(row) == sorted(columns) for row in rows)
    assert rows[0]["decision_id"] == "ab7.a.look0" and rows[0]["run_id"] == "run-a"
    assert {row["run_id"] for row in rows if row["layout"] == "x"} == {None}
    assert all(row["created_at"] == 1234.5 and row["study"] == "study-1" for row in rows)
    assert len({row["decision_id"] for row in rows}) == len(rows)
    assert rows == decision_rows(replay(traces, CONFIG), "study-1", {"a": "run-a"}, "ab7", 1234.5)


# --- the tie-stop at a look --------------------------------------------------------------------


def test_tied_arm_with_less_headroom_stops_at_a_look():
    traces = tie_traces(10.0, 4.0)
    decisions = by_arm(decide_look(traces, 1, CONFIG))
    assert decisions["best"].action == "continue"
    other = decisions["other"]
    assert (other.action, other.reference, other.look) == ("stop", "best", 1)
    assert "cannot win the tie-break" in other.reason and "4.0 GiB vs 10.0 GiB" in other.reason
    values = np.asarray(traces[1].steps_ms[CONFIG.warmup_iterations :])
    best = np.asarray(traces[0].steps_ms[CONFIG.warmup_iterations :])
    assert (other.statistic, other.p_value) == tied_within_margin(values, best, CONFIG)
    assert other.p_value < CONFIG.alpha_per_look


@pytest.mark.parametrize(
    ("best_headroom", "other_headroom", "stopped", "lacks"),
    [
        (4.0, 10.0, "best", "less memory headroom"),
        (10.0, 10.0, "other", "a higher mean"),
        (None, 4.0, "best", "unknown vs 4.0 GiB"),
        (10.0, None, "other", "unknown vs 10.0 GiB"),
        (None, None, "other", "a higher mean"),
        (math.nan, 1.0, "best", "less memory headroom"),
        (10.0, math.nan, "other", "less memory headroom"),
    ],
)
def test_a_tied_pair_is_settled_at_the_look_whichever_arm_loses_the_tie_break(
    best_headroom, other_headroom, stopped, lacks
):
    decisions = by_arm(decide_look(tie_traces(best_headroom, other_headroom), 1, CONFIG))
    kept = "best" if stopped == "other" else "other"
    stop = decisions[stopped]
    assert (stop.action, stop.reference, stop.look) == ("stop", kept, 1)
    assert "cannot win the tie-break" in stop.reason and lacks in stop.reason
    assert stop.p_value < CONFIG.alpha_per_look
    assert decisions[kept].action == "continue"
    if kept == "other":
        assert "ahead on the tie-break" in decisions["other"].reason
        assert (decisions["other"].statistic, decisions["other"].p_value) == (
            stop.statistic,
            stop.p_value,
        )


def test_fewer_critical_stages_come_before_memory_headroom_at_a_look_and_at_the_budget():
    best, other = tie_traces(10.0, 4.0)
    traces = [replace(best, critical_stages=3), replace(other, critical_stages=1)]
    decisions = by_arm(decide_look(traces, 1, CONFIG))
    assert decisions["best"].action == "stop" and "more critical stages (3 vs 1)" in (
        decisions["best"].reason
    )
    longer = [
        replace(traces[0], steps_ms=steady(40, 100.0, seed=0)),
        replace(traces[1], steps_ms=steady(40, 101.0, seed=1)),
    ]
    final = by_arm(final_decisions(longer, CONFIG))
    assert final["other"].action == "win" and "fewer critical stages" in final["other"].reason
    assert "more critical stages (3 vs 1)" in final["best"].reason
    unknown = [replace(traces[0], critical_stages=None), traces[1]]
    assert by_arm(decide_look(unknown, 1, CONFIG))["best"].action == "stop"  # unknown: worst


def test_untied_arm_with_less_headroom_continues():
    # 1.5% slower with big noise: neither worse nor shown tied, so it runs on
    decisions = by_arm(decide_look(tie_traces(10.0, 4.0, ratio=1.015, cv=0.05), 1, CONFIG))
    assert decisions["other"].action == "continue"
