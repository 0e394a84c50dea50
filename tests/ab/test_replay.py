"""Recorded traces re-judged offline: one terminal decision per arm, failures seen only when they
happened, ties settled by the tie-break."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from ray_layout.ab.decisions import winner
from ray_layout.ab.replay import replay
from ray_layout.ab.stats import ArmTrace, failure_reason, steady_steps
from tests.helpers.ab_short import BEST, CONFIG, by_arm, steady
from tests.helpers.ab_traces import ar1_steps, traces_of


def test_replay_five_arms_end_to_end():
    rng = np.random.default_rng(2024)
    means = [140.0, 115.0, 100.0, 100.5, 101.0]
    names = ["default", "count-based", "candidate-1", "candidate-2", "candidate-3"]
    runs = ar1_steps(rng, 1, 5, CONFIG.max_iterations, means)[0]
    headroom = [2.0, 4.0, 10.0, 12.0, 11.0]
    traces = [
        replace(t, headroom_gib=h) for t, h in zip(traces_of(runs, names), headroom, strict=True)
    ]
    decisions = replay(traces, CONFIG)

    stops = {d.arm: d for d in decisions if d.action == "stop"}
    assert stops["default"].look < len(CONFIG.looks)
    assert stops["count-based"].look < len(CONFIG.looks)
    assert winner(decisions).arm.startswith("candidate")
    looks = [d.look for d in decisions]
    assert looks == sorted(looks) and looks[-1] == len(CONFIG.looks)
    assert {d.arm for d in decisions if d.look == 0} == set(names)
    for d in decisions:  # nothing after an arm's terminal decision
        later = [e for e in decisions if e.arm == d.arm and e.look > d.look]
        assert d.action == "continue" or not later


def test_replay_sees_a_late_failure_only_when_it_happened():
    fine = ArmTrace("fine", BEST, steady(40, 100.0, seed=1))
    late = ArmTrace("late", "x", steady(25, 100.5, cv=0.05), failure="crash")  # after 25 steps
    decisions = [(d.arm, d.look, d.action) for d in replay([fine, late], CONFIG)]
    assert ("late", 0, "continue") in decisions and ("late", 1, "continue") in decisions
    assert ("late", 2, "stop") in decisions and decisions[-1] == ("fine", 3, "win")


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.floats(80.0, 200.0),  # true mean
            st.integers(0, 60),  # steady length
            st.sampled_from([None, None, None, "oom", "hang", "nan"]),
            st.one_of(st.none(), st.floats(0.0, 40.0)),  # headroom
            st.booleans(),  # a nan step somewhere
        ),
        min_size=1,
        max_size=5,
    ),
    st.integers(0, 2**32 - 1),
)
def test_replay_gives_each_arm_one_terminal_decision_and_never_crowns_a_failure(arms, seed):
    rng = np.random.default_rng(seed)
    traces = []
    for i, (mean, length, failure, headroom, nan_step) in enumerate(arms):
        steps = mean * (1 + 0.03 * rng.standard_normal(CONFIG.warmup_iterations + length))
        if nan_step and length:
            steps[CONFIG.warmup_iterations + rng.integers(length)] = math.nan
        traces.append(ArmTrace(f"arm-{i}", f"L{i}", tuple(steps), failure, headroom))
    decisions = replay(traces, CONFIG)

    for trace in traces:
        mine = [d for d in decisions if d.arm == trace.arm]
        terminal = [d for d in mine if d.action.is_terminal]
        broken = failure_reason(trace, CONFIG) is not None
        qualifies = len(steady_steps(trace, CONFIG)) >= 2 * CONFIG.batch_size
        assert len(terminal) == (1 if broken or qualifies else 0)
        assert not terminal or mine[-1] is terminal[0]  # terminal is last
        if broken:
            assert terminal[0].action == "stop"
    assert sum(d.action == "win" for d in decisions) <= 1
    best = winner(decisions)
    if best is not None:
        trace = next(t for t in traces if t.arm == best.arm)
        assert failure_reason(trace, CONFIG) is None
    assert [d.look for d in decisions] == sorted(d.look for d in decisions)


def test_replay_settles_every_tie_by_the_tie_break_and_crowns_the_roomiest():
    means = {"a": 100.0, "b": 100.3, "c": 100.5, "d": 100.2, "e": 100.4}
    headroom = {"a": 5.0, "b": 10.0, "c": 3.0, "d": 4.0, "e": 12.0}
    traces = [
        ArmTrace(
            name, f"L-{name}", steady(40, mean, seed=i, cv=0.0005), headroom_gib=headroom[name]
        )
        for i, (name, mean) in enumerate(means.items())
    ]
    decisions = replay(traces, CONFIG)
    stops = {d.arm: d for d in decisions if d.action == "stop"}
    assert set(stops) == {"a", "b", "c", "d"}
    for d in stops.values():
        assert "cannot win the tie-break" in d.reason and "less memory headroom" in d.reason
        assert headroom[d.arm] < headroom[d.reference]
    assert {arm: d.look for arm, d in stops.items()} == {"a": 0, "b": 1, "c": 0, "d": 0}
    assert winner(decisions).arm == "e"
    final = by_arm(d for d in decisions if d.look == len(CONFIG.looks))
    assert {arm: d.action for arm, d in final.items()} == {"e": "win"}
