"""What an A/B test cost in GPU time and what it would have cost without early stopping, and how
far each arm of a replayed test would have run."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ray_layout.ab.cost import ArmCost, gpu_seconds, replayed_iterations
from ray_layout.ab.replay import replay
from ray_layout.ab.stats import ArmTrace
from ray_layout.errors import ConfigError
from tests.helpers.ab_short import CONFIG as SHORT
from tests.helpers.ab_short import steady as jittered


def test_gpu_seconds_by_hand():
    arms = [
        ArmCost(world_size=8, overhead_s=30.0, steps_ms=(1000.0, 2000.0), budget_iterations=10),
        ArmCost(world_size=4, overhead_s=10.0, steps_ms=(500.0, math.inf), budget_iterations=4),
        ArmCost(world_size=2, overhead_s=5.0, steps_ms=(), budget_iterations=10),
    ]
    spent, full = gpu_seconds(arms)
    assert spent == pytest.approx(8 * (30 + 3) + 4 * (10 + 0.5) + 2 * 5)
    assert full == pytest.approx(8 * (30 + 1.5 * 10) + 4 * (10 + 0.5 * 4) + 2 * 5)
    with pytest.raises(ConfigError, match="world_size"):
        ArmCost(world_size=0, overhead_s=0.0, steps_ms=(), budget_iterations=1)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"world_size": -1}, "world_size must be a positive integer, got -1"),
        ({"world_size": 2.0}, "world_size must be a positive integer, got 2.0"),
        ({"world_size": True}, "world_size must be a positive integer, got True"),
        ({"budget_iterations": -1}, "budget_iterations must be an integer >= 0, got -1"),
        ({"budget_iterations": 1.5}, "budget_iterations must be an integer >= 0, got 1.5"),
    ],
)
def test_arm_cost_errors_are_one_line_and_name_the_field(fields, message):
    values = {"world_size": 8, "overhead_s": 0.0, "steps_ms": (), "budget_iterations": 10} | fields
    with pytest.raises(ConfigError) as caught:
        ArmCost(**values)
    assert str(caught.value) == message


def test_an_arm_that_only_hung_counts_its_start_up_for_both():
    hung = ArmCost(4, overhead_s=12.0, steps_ms=(math.inf, math.nan), budget_iterations=9)
    assert gpu_seconds([hung]) == (48.0, 48.0)
    assert gpu_seconds([]) == (0.0, 0.0)
    nothing_to_run = ArmCost(world_size=2, overhead_s=1.0, steps_ms=(), budget_iterations=0)
    assert gpu_seconds([nothing_to_run]) == (2.0, 2.0)


ARMS = st.lists(
    st.tuples(
        st.integers(1, 64),  # world size
        st.floats(0.0, 600.0),  # start-up seconds
        st.lists(st.floats(1.0, 1e5), max_size=30),  # finite steps
        st.integers(0, 30),  # budget beyond the steps run
    ),
    max_size=6,
)


@given(ARMS)
def test_early_stopping_never_costs_more_than_running_every_arm_to_its_budget(arms):
    """Spent never passes full while no arm ran past its budget, equals it when every arm ran
    its whole budget, and both add up over the arms."""
    costs = [ArmCost(w, o, tuple(s), len(s) + extra) for w, o, s, extra in arms]
    spent, full = gpu_seconds(costs)
    assert spent <= full * (1 + 1e-9) + 1e-9
    whole = [ArmCost(w, o, tuple(s), len(s)) for w, o, s, _ in arms]
    assert gpu_seconds(whole)[0] == pytest.approx(gpu_seconds(whole)[1], rel=1e-9, abs=1e-9)
    parts = [gpu_seconds([cost]) for cost in costs]
    assert spent == pytest.approx(sum(p[0] for p in parts), rel=1e-9, abs=1e-9)
    assert full == pytest.approx(sum(p[1] for p in parts), rel=1e-9, abs=1e-9)


def test_replayed_iterations_by_hand():
    steady = lambda n, mean: (mean,) * (SHORT.warmup_iterations + n)  # noqa: E731
    traces = [
        ArmTrace("a", "A", steady(40, 100.0)),
        ArmTrace("b", "B", steady(40, 130.0)),
        ArmTrace("c", "C", steady(7, 100.0), failure="oom"),
    ]
    decisions = replay(traces, SHORT)
    ran = replayed_iterations(traces, decisions, SHORT)
    assert ran == {"a": 13, "b": 13, "c": 10}  # b stopped at look 0, a settled there, c failed
    early = {"b": 3}
    sooner = replayed_iterations(traces, replay(traces, SHORT, early), SHORT, early)
    assert sooner == {"a": 18, "b": 18, "c": 10}  # b's first look at 3 batches; a waits for it
    close = [ArmTrace("a", "A", steady(40, 100.0)), ArmTrace("b", "B", steady(40, 100.0))]
    both = replayed_iterations(close, replay(close, SHORT), SHORT)
    assert both == {"a": 13, "b": 13}  # tied: settled at the first look


def test_replayed_survivors_run_their_budget_but_never_past_their_trace():
    """Several arms alive at the budget each run it whole; a trace cut short caps its arm."""
    noisy = [
        ArmTrace("a", "A", jittered(40, 100.0, seed=1, cv=0.05)),
        ArmTrace("b", "B", jittered(27, 101.0, seed=2, cv=0.05)),  # 30 iterations of 43
    ]
    decisions = replay(noisy, SHORT)
    assert not any(d.action == "stop" for d in decisions)  # neither worse nor shown tied
    assert replayed_iterations(noisy, decisions, SHORT) == {"a": SHORT.max_iterations, "b": 30}
