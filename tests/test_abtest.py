"""The A/B statistics: batch means, the margin test, error rate and power on synthetic traces,
immediate stops, truncation, ties on memory headroom, replay, cost and store rows."""

from __future__ import annotations

import math
import warnings
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from ray_layout.ab.cost import ArmCost, gpu_seconds
from ray_layout.ab.decisions import (
    WonOn,
    choose_final,
    decide_look,
    decision_rows,
    final_decisions,
    replay,
    winner,
)
from ray_layout.ab.stats import (
    FAILURE_REASONS,
    ABConfig,
    ArmTrace,
    arm_stats,
    batch_means,
    blowup_reason,
    failure_reason,
    steady_steps,
    tied_within_margin,
    worse_by_margin,
)
from ray_layout.ab.ties import TieBreakOn
from ray_layout.errors import ConfigError
from ray_layout.measure.store_schema import TABLE_SCHEMAS
from ray_layout.runtime.failures import FailureClass, run_status

CONFIG = ABConfig(warmup_iterations=3, batch_size=5, looks=(2, 4, 8))  # short looks, hand-checkable
BEST = "Et*5|t*6|t*5|mL"


def ar1_steps(rng, reps, arms, n, means, cv=0.03, phi=0.3):
    """(reps, arms, n) step times: AR(1) noise with stationary sd ``cv * mean``."""
    means = np.broadcast_to(np.asarray(means, dtype=float), (arms,))[None, :, None]
    shocks = rng.standard_normal((reps, arms, n))
    noise = np.empty_like(shocks)
    noise[..., 0] = shocks[..., 0]
    for i in range(1, n):
        noise[..., i] = phi * noise[..., i - 1] + math.sqrt(1 - phi**2) * shocks[..., i]
    return means * (1.0 + cv * noise)


def traces_of(steps, names=None, **fields):
    names = names or [f"arm-{i}" for i in range(len(steps))]
    return [ArmTrace(name, f"layout-{name}", tuple(map(float, row)), **fields)
            for name, row in zip(names, steps, strict=True)]  # fmt: skip


def by_arm(decisions):
    return {d.arm: d for d in decisions}


# --- config ------------------------------------------------------------------------------------


def test_config_derived_quantities():
    config = ABConfig(warmup_iterations=3, batch_size=5, looks=(2, 4, 8), alpha=0.06)
    assert config.max_iterations == 3 + 40
    assert [config.look_iterations(k) for k in range(3)] == [10, 20, 40]
    assert config.alpha_per_look == pytest.approx(0.02)
    assert ABConfig(looks=[3, 6]).looks == (3, 6)  # a list is kept as a tuple


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"warmup_iterations": -1}, "warmup_iterations"),
        ({"batch_size": 0}, "batch_size"),
        ({"batch_size": 2.5}, "batch_size"),
        ({"looks": ()}, "looks"),
        ({"looks": (1, 4)}, "at least 2 batches"),
        ({"looks": (2, 2, 8)}, "strictly increasing"),
        ({"looks": (4, 2)}, "strictly increasing"),
        ({"alpha": 0.0}, "alpha"),
        ({"alpha": 1.0}, "alpha"),
        ({"margin": -0.01}, "margin"),
        ({"margin": math.inf}, "margin"),
        ({"blowup": 1.0}, "blowup"),
    ],
)
def test_config_errors_name_the_problem(fields, message):
    with pytest.raises(ConfigError, match=message):
        ABConfig(**fields)


def test_look_index_out_of_range_is_a_config_error():
    with pytest.raises(ConfigError, match="look"):
        CONFIG.look_iterations(3)
    with pytest.raises(ConfigError, match="unique"):
        decide_look([ArmTrace("a", "x", ()), ArmTrace("a", "y", ())], 0, CONFIG)


# --- one arm -----------------------------------------------------------------------------------


def test_steady_steps_and_batch_means_by_hand():
    trace = ArmTrace("a", BEST, (50.0, 40.0, 30.0, *range(1, 13)))
    steady = steady_steps(trace, CONFIG)
    assert steady.tolist() == list(range(1, 13))
    np.testing.assert_allclose(batch_means(steady, 5), [3.0, 8.0])  # 11, 12 dropped
    assert batch_means(steady[:4], 5).size == 0


def test_arm_stats_by_hand():
    values = np.array([10, 12, 11, 13, 9, 20, 22, 21, 23, 19, 14, 16, 15, 17, 13, 99.0])
    result = arm_stats(values, CONFIG)  # batches of 5: means 11, 21, 15; the 99 is dropped
    assert (result.n, result.batches) == (15, 3)
    assert result.mean_ms == pytest.approx(47 / 3)
    assert result.median_ms == 15.0
    sd = math.sqrt(((11 - 47 / 3) ** 2 + (21 - 47 / 3) ** 2 + (15 - 47 / 3) ** 2) / 2)
    half = stats.t.ppf(0.975, 2) * sd / math.sqrt(3)
    assert result.ci_low_ms == pytest.approx(47 / 3 - half)
    assert result.ci_high_ms == pytest.approx(47 / 3 + half)
    one_batch = arm_stats(values[:7], CONFIG)
    assert one_batch.batches == 1 and math.isnan(one_batch.ci_low_ms)


def test_batch_means_interval_covers_the_true_mean_at_its_level():
    rng = np.random.default_rng(7)
    steps = 100.0 + 3.0 * rng.standard_normal((2000, 40))
    covered = [(s.ci_low_ms <= 100.0 <= s.ci_high_ms) for s in (arm_stats(r, CONFIG)
                                                                 for r in steps)]  # fmt: skip
    assert np.mean(covered) == pytest.approx(0.95, abs=0.015)  # 3 binomial sd


# --- the margin test ---------------------------------------------------------------------------


def test_worse_by_margin_matches_welch_by_hand_and_scipy():
    rng = np.random.default_rng(3)
    arm, best = 108 + 4 * rng.standard_normal(30), 100 + 2 * rng.standard_normal(40)
    config = ABConfig(margin=0.02)
    t, p = worse_by_margin(arm, best, config)

    a, b = batch_means(arm, 5), 1.02 * batch_means(best, 5)
    va, vb = a.var(ddof=1) / a.size, b.var(ddof=1) / b.size
    hand_t = (a.mean() - b.mean()) / math.sqrt(va + vb)
    dof = (va + vb) ** 2 / (va**2 / (a.size - 1) + vb**2 / (b.size - 1))
    assert t == pytest.approx(hand_t)
    assert p == pytest.approx(stats.t.sf(hand_t, dof))
    oracle = stats.ttest_ind(a, b, equal_var=False, alternative="greater")
    assert (t, p) == pytest.approx((oracle.statistic, oracle.pvalue))


@pytest.mark.parametrize(
    ("arm", "best", "margin", "expected"),
    [
        (110.0, 100.0, 0.02, (math.inf, 0.0)),
        (101.0, 100.0, 0.02, (-math.inf, 1.0)),
        (0.1, 0.1, 0.0, (0.0, 0.5)),  # an ulp off in np.mean must not fake a difference
        (102.0, 100.0, 0.02, (0.0, 0.5)),
    ],
)
def test_worse_by_margin_on_deterministic_data(arm, best, margin, expected):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = worse_by_margin(np.full(10, arm), np.full(10, best), ABConfig(margin=margin))
    assert result == expected


def test_worse_by_margin_one_constant_side_and_too_few_batches():
    arm = np.array([110, 112, 111, 113, 109, 120, 118, 119, 121, 117.0])
    t, p = worse_by_margin(arm, np.full(10, 100.0), CONFIG)
    diff = batch_means(arm, 5).mean() - 102.0
    se = batch_means(arm, 5).std(ddof=1) / math.sqrt(2)
    assert t == pytest.approx(diff / se)
    assert p == pytest.approx(stats.t.sf(diff / se, 1))  # all dof from the varying side
    assert all(map(math.isnan, worse_by_margin(arm[:9], arm, CONFIG)))
    assert all(map(math.isnan, worse_by_margin(np.append(arm[:9], np.nan), arm, CONFIG)))


# --- immediate stops ---------------------------------------------------------------------------


def steady(n, mean=100.0, seed=0, cv=0.01):
    rng = np.random.default_rng(seed)
    return tuple(float(x) for x in mean * (1 + cv * rng.standard_normal(CONFIG.warmup_iterations
                                                                          + n)))  # fmt: skip


@pytest.mark.parametrize(
    ("failure", "expected"),
    [("oom", "out of memory"), ("nan", "NaN"), ("hang", "hang"), ("crash", "crash"),
     ("hang: no iteration for 312 s", "hang: no iteration for 312 s")],
)  # fmt: skip
def test_failed_arm_stops_at_the_look_whatever_its_length(failure, expected):
    traces = [ArmTrace("best", BEST, steady(10, seed=1)), ArmTrace("other", "x", steady(10)),
              ArmTrace("bad", "y", steady(2), failure=failure)]  # fmt: skip
    decision = by_arm(decide_look(traces, 0, CONFIG))["bad"]
    assert (decision.action, decision.look, decision.reference) == ("stop", 0, None)
    assert expected in decision.reason and math.isnan(decision.statistic)
    assert decision.n_steady == 2


def test_every_failure_class_but_the_runtimes_own_has_a_reason():
    """Keyed by the enum, the reasons still answer the plain strings a store gives back."""
    own = {FailureClass.EARLY_STOP, FailureClass.CANCELLED}  # stops and cancels, not failures
    assert set(FAILURE_REASONS) == set(FailureClass) - own
    for name in FAILURE_REASONS:
        plain = ArmTrace("a", BEST, steady(2), failure=str(name.value))
        assert failure_reason(plain) == FAILURE_REASONS[name] == failure_reason(
            replace(plain, failure=name))  # fmt: skip
    assert failure_reason(replace(plain, failure="failed")) == "failed"  # a status, unknown
    assert run_status(FailureClass.OOM) == run_status("oom") == "infeasible"
    assert run_status(FailureClass.EARLY_STOP) == "stopped" and run_status(None) == "finished"


def test_nan_or_inf_steady_step_is_a_failure_but_not_in_warmup():
    steps = list(steady(12))
    assert failure_reason(ArmTrace("a", BEST, tuple(steps))) is None
    steps[1] = math.nan  # warm-up
    assert failure_reason(ArmTrace("a", BEST, tuple(steps)), CONFIG) is None
    steps[8] = math.inf
    reason = failure_reason(ArmTrace("a", BEST, tuple(steps)), CONFIG)
    assert reason is not None and "NaN" in reason and "iteration 6" in reason
    decisions = decide_look([ArmTrace("a", BEST, tuple(steps)), ArmTrace("b", "x", steady(10)),
                             ArmTrace("c", "y", steady(10, seed=2))], 0, CONFIG)  # fmt: skip
    assert by_arm(decisions)["a"].action == "stop"


def test_blowup_reason():
    values = np.full(5, 350.0)
    reason = blowup_reason(values, 100.0, CONFIG)
    assert reason is not None and "3.5x" in reason
    assert blowup_reason(np.full(5, 250.0), 100.0, CONFIG) is None
    assert blowup_reason(np.full(4, 350.0), 100.0, CONFIG) is None  # less than a batch
    assert blowup_reason(np.array([100, 100, 100, 1000, 1000.0]), 100.0, CONFIG) is None


def test_blowup_stops_in_decide_look_even_when_the_test_cannot_tell():
    slow = [100.0] * 3 + [400.0, 90.0, 420.0, 410.0, 30.0] * 2  # wild, but median 4x
    traces = [ArmTrace("best", BEST, steady(10)), ArmTrace("slow", "x", tuple(slow))]
    decision = by_arm(decide_look(traces, 0, CONFIG))["slow"]
    assert decision.action == "stop" and decision.reason.startswith("blow-up")
    assert decision.reference == "best"


def test_stopped_and_short_arms_get_no_decision_and_a_lone_arm_continues():
    traces = [ArmTrace("a", BEST, steady(10)), ArmTrace("b", "x", steady(25, 150.0)),
              ArmTrace("c", "y", steady(9)), ArmTrace("d", "z", (), failure="oom")]  # fmt: skip
    decisions = decide_look(traces, 0, CONFIG, stopped={"a"})
    assert [(d.arm, d.action) for d in decisions] == [("b", "continue"), ("d", "stop")]
    assert "nothing to compare" in decisions[0].reason
    assert decisions[0].n_steady == 10  # truncated to the look


# --- truncation, the best, the margin ----------------------------------------------------------


def test_decisions_do_not_depend_on_how_far_arms_ran_past_the_look():
    rng = np.random.default_rng(5)
    exact = traces_of(ar1_steps(rng, 1, 3, 3 + 10, [100.0, 104.0, 115.0])[0])
    beyond = [replace(t, steps_ms=t.steps_ms + tuple(rng.uniform(50, 500, 60))) for t in exact]
    assert decide_look(exact, 0, CONFIG) == decide_look(beyond, 0, CONFIG)


def test_look_decisions_by_hand():
    traces = [ArmTrace("default", "Et*4|t*4|t*4|t*4mL", steady(20, 140.0, seed=1)),
              ArmTrace("cand", BEST, steady(20, 100.0, seed=2)),
              ArmTrace("close", "Et*6|t*5|t*5|mL", steady(20, 101.0, seed=3))]  # fmt: skip
    decisions = by_arm(decide_look(traces, 1, CONFIG))
    assert decisions["cand"].action == "continue" and "best" in decisions["cand"].reason
    assert decisions["cand"].reference is None and math.isnan(decisions["cand"].p_value)
    stop = decisions["default"]
    assert (stop.action, stop.reference, stop.look, stop.n_steady) == ("stop", "cand", 1, 20)
    assert stop.p_value < CONFIG.alpha_per_look and stop.statistic > 0
    percent = (stop.mean_ms / decisions["cand"].mean_ms - 1) * 100
    assert stop.reason.startswith(f"{percent:.1f}% slower than {BEST} [cand] (p=")
    assert decisions["close"].action == "continue" and decisions["close"].statistic < 0


# --- the final decision ------------------------------------------------------------------------


def test_tie_within_margin_goes_to_the_arm_with_more_headroom():
    traces = [ArmTrace("fast", BEST, steady(40, 100.0), headroom_gib=5.0),
              ArmTrace("roomy", "Et*6|t*5|t*5|mL", steady(40, 101.0), headroom_gib=20.0),
              ArmTrace("unknown", "Et|t*16|mL", steady(40, 100.5, seed=4))]  # fmt: skip
    decisions = by_arm(final_decisions(traces, CONFIG))
    assert winner(list(decisions.values())).arm == "roomy"
    assert decisions["roomy"].look == 3 and "headroom among 3 tied" in decisions["roomy"].reason
    assert decisions["fast"].action == "lose" and "less memory headroom" in decisions["fast"].reason
    assert decisions["unknown"].action == "lose" and "unknown" in decisions["unknown"].reason
    assert decisions["fast"].reference == "roomy"


def test_clearly_faster_arm_beats_more_headroom():
    traces = [ArmTrace("fast", BEST, steady(40, 100.0), headroom_gib=1.0),
              ArmTrace("roomy", "x", steady(40, 110.0), headroom_gib=40.0)]  # fmt: skip
    decisions = by_arm(final_decisions(traces, CONFIG))
    assert decisions["fast"].action == "win" and "won on time" in decisions["fast"].reason
    assert (
        decisions["roomy"].action == "lose" and "beyond the 2% margin" in decisions["roomy"].reason
    )
    assert decisions["roomy"].p_value < 1e-3


def test_equal_headroom_goes_to_the_lower_mean_and_no_qualifier_means_no_decision():
    traces = [ArmTrace("a", "x", steady(40, 101.0), headroom_gib=8.0),
              ArmTrace("b", BEST, steady(40, 100.0), headroom_gib=8.0)]  # fmt: skip
    assert winner(final_decisions(traces, CONFIG)).arm == "b"
    assert final_decisions([ArmTrace("a", "x", steady(9))], CONFIG) == []
    assert winner([]) is None


def final_of(traces):
    return choose_final([(t, steady_steps(t, CONFIG)) for t in traces], CONFIG)


def test_the_final_choice_is_typed_before_it_is_worded():
    traces = [
        ArmTrace("fast", BEST, steady(40, 100.0), headroom_gib=5.0),
        ArmTrace("roomy", "Et*6|t*5|t*5|mL", steady(40, 101.0), headroom_gib=20.0),
        ArmTrace("slow", "Et|t*16|mL", steady(40, 110.0, seed=4), headroom_gib=30.0),
    ]
    choice = final_of(traces)
    assert (choice.winner.trace.arm, choice.won_on, choice.tied) == ("roomy", WonOn.HEADROOM, 2)
    assert choice.fastest.trace.arm == "fast" and choice.runner_up.trace.arm == "fast"
    lost = {loss.arm.trace.arm: (loss.lost_on, loss.reference.trace.arm) for loss in choice.losses}
    assert lost == {"fast": (TieBreakOn.HEADROOM, "roomy"), "slow": (None, "fast")}
    words = by_arm(final_decisions(traces, CONFIG))
    assert words["roomy"].reason == (
        "won on memory headroom among 2 tied within 2%: 20.0 GiB free, mean "
        f"{choice.winner.stats.mean_ms:.1f} ms (1.0% slower than the fastest)")  # fmt: skip
    assert words["fast"].reason == ("tied with Et*6|t*5|t*5|mL [roomy] within 2% (1.0% faster) "
                                    "but less memory headroom (5.0 GiB vs 20.0 GiB)")  # fmt: skip
    assert words["slow"].reason.endswith("than Et*5|t*6|t*5|mL [fast] at the budget, beyond "
                                         "the 2% margin")  # fmt: skip
    assert final_of([ArmTrace("a", "x", steady(9))]) is None


@pytest.mark.parametrize(
    ("critical", "headroom", "won_on", "words"),
    [((None, None), (None, None), WonOn.TIME, "won on time: mean "),
     ((1, 2), (5.0, 5.0), WonOn.CRITICAL, "won on fewer critical stages among 2 tied"),
     ((2, 2), (20.0, 5.0), WonOn.HEADROOM, "won on memory headroom among 2 tied"),
     ((2, 2), (8.0, 8.0), WonOn.TIME_AMONG_TIED, "won on time among 2 tied within 2% with "
                                                 "equal or unknown memory headroom")],
)  # fmt: skip
def test_each_way_of_winning_has_its_words(critical, headroom, won_on, words):
    gap = 110.0 if won_on is WonOn.TIME else 100.5
    traces = [ArmTrace(name, name, steady(40, mean, seed=i), headroom_gib=room,
                       critical_stages=stages)
              for i, (name, mean, stages, room) in enumerate(
                  zip(("a", "b"), (100.0, gap), critical, headroom, strict=True))]  # fmt: skip
    choice = final_of(traces)
    assert choice.won_on is won_on
    assert winner(final_decisions(traces, CONFIG)).reason.startswith(words)


def test_a_win_on_critical_stages_over_one_and_headroom_over_another_is_the_tie_break():
    traces = [
        ArmTrace("a", "a", steady(40, 100.0), headroom_gib=20.0, critical_stages=1),
        ArmTrace("b", "b", steady(40, 100.3, seed=1), headroom_gib=5.0, critical_stages=2),
        ArmTrace("c", "c", steady(40, 100.6, seed=2), headroom_gib=5.0, critical_stages=1),
    ]
    assert final_of(traces).won_on is WonOn.TIE_BREAK
    assert winner(final_decisions(traces, CONFIG)).reason.startswith(
        "won the tie-break (fewer critical stages, then memory headroom) among 3 tied"
    )


def test_final_uses_steps_up_to_the_budget_only():
    steps = steady(40, 100.0) + (1e4,) * 20
    decision = final_decisions([ArmTrace("a", BEST, steps)], CONFIG)[0]
    assert decision.action == "win" and decision.n_steady == 40 and decision.mean_ms < 110


# --- replay ------------------------------------------------------------------------------------


def test_replay_five_arms_end_to_end():
    rng = np.random.default_rng(2024)
    means = [140.0, 115.0, 100.0, 100.5, 101.0]
    names = ["default", "count-based", "candidate-1", "candidate-2", "candidate-3"]
    runs = ar1_steps(rng, 1, 5, CONFIG.max_iterations, means)[0]
    headroom = [2.0, 4.0, 10.0, 12.0, 11.0]
    traces = [replace(t, headroom_gib=h) for t, h in zip(traces_of(runs, names), headroom,
                                                         strict=True)]  # fmt: skip
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


# --- cost and rows -----------------------------------------------------------------------------


def test_gpu_seconds_by_hand():
    arms = [ArmCost(world_size=8, overhead_s=30.0, steps_ms=(1000.0, 2000.0), budget_iterations=10),
            ArmCost(world_size=4, overhead_s=10.0, steps_ms=(500.0, math.inf), budget_iterations=4),
            ArmCost(world_size=2, overhead_s=5.0, steps_ms=(), budget_iterations=10)]  # fmt: skip
    spent, full = gpu_seconds(arms)
    assert spent == pytest.approx(8 * (30 + 3) + 4 * (10 + 0.5) + 2 * 5)
    assert full == pytest.approx(8 * (30 + 1.5 * 10) + 4 * (10 + 0.5 * 4) + 2 * 5)
    with pytest.raises(ConfigError, match="world_size"):
        ArmCost(world_size=0, overhead_s=0.0, steps_ms=(), budget_iterations=1)


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


# --- equivalence (TOST) and the tie-stop at a look ---------------------------------------------


def tost_by_hand(arm, best, config):
    """TOST on batch means with scipy's t: (t nearer its bound, larger one-sided p)."""
    a = batch_means(np.asarray(arm), config.batch_size)
    b = batch_means(np.asarray(best), config.batch_size)

    def welch(scale):
        va, vb = a.var(ddof=1) / a.size, scale**2 * b.var(ddof=1) / b.size
        dof = (va + vb) ** 2 / (va**2 / (a.size - 1) + vb**2 / (b.size - 1))
        return (a.mean() - scale * b.mean()) / math.sqrt(va + vb), dof

    t_low, dof_low = welch(1 - config.margin)
    t_high, dof_high = welch(1 + config.margin)
    p_low, p_high = stats.t.sf(t_low, dof_low), stats.t.cdf(t_high, dof_high)
    return (t_low, p_low) if p_low >= p_high else (-t_high, p_high)


@pytest.mark.parametrize(
    ("ratio", "cv", "tied"),
    [(1.005, 0.002, True), (1.015, 0.05, False), (1.05, 0.002, False), (0.95, 0.002, False),
     (0.995, 0.002, True)],
)  # fmt: skip
def test_tied_within_margin_matches_a_tost_by_hand(ratio, cv, tied):
    best = np.asarray(steady(40, 100.0, seed=1, cv=cv)[CONFIG.warmup_iterations :])
    arm = np.asarray(steady(40, 100.0 * ratio, seed=2, cv=cv)[CONFIG.warmup_iterations :])
    statistic, p_value = tied_within_margin(arm, best, CONFIG)
    expected_t, expected_p = tost_by_hand(arm, best, CONFIG)
    assert statistic == pytest.approx(expected_t, rel=1e-9)
    # abtest takes the upper p as 1 - sf: exact to about 1e-16 absolute, not relative
    assert p_value == pytest.approx(expected_p, rel=1e-9, abs=1e-15)
    if tied:
        assert p_value < 1e-6 and statistic > 0
    else:
        assert p_value > 0.2


def test_tied_within_margin_is_symmetric_enough_and_needs_two_batches():
    a = np.asarray(steady(40, 100.0, seed=3, cv=0.002)[CONFIG.warmup_iterations :])
    b = np.asarray(steady(40, 100.4, seed=4, cv=0.002)[CONFIG.warmup_iterations :])
    assert tied_within_margin(a, b, CONFIG)[1] < 1e-6
    assert tied_within_margin(b, a, CONFIG)[1] < 1e-6  # either way round
    far = a * 1.06
    assert (
        tied_within_margin(far, a, CONFIG)[1] > 0.5 and tied_within_margin(a, far, CONFIG)[1] > 0.5
    )
    # identical data is tied (any positive margin), never with margin 0
    assert tied_within_margin(a, a, CONFIG)[1] < 1e-6
    assert tied_within_margin(a, a, replace(CONFIG, margin=0.0))[1] >= 0.5
    short = a[: CONFIG.batch_size * 2 - 1]
    assert all(math.isnan(x) for x in tied_within_margin(short, a, CONFIG))
    constant = np.full(10, 100.0)
    assert tied_within_margin(constant, constant, CONFIG) == (math.inf, 0.0)


def tie_traces(best_headroom, other_headroom, ratio=1.003, cv=0.002):
    return [ArmTrace("best", BEST, steady(20, 100.0, seed=1, cv=cv), headroom_gib=best_headroom),
            ArmTrace("other", "x", steady(20, 100.0 * ratio, seed=2, cv=cv),
                     headroom_gib=other_headroom)]  # fmt: skip


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
    [(4.0, 10.0, "best", "less memory headroom"), (10.0, 10.0, "other", "a higher mean"),
     (None, 4.0, "best", "unknown vs 4.0 GiB"), (10.0, None, "other", "unknown vs 10.0 GiB"),
     (None, None, "other", "a higher mean"), (math.nan, 1.0, "best", "less memory headroom"),
     (10.0, math.nan, "other", "less memory headroom")],
)  # fmt: skip
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
            stop.statistic, stop.p_value)  # fmt: skip


def test_fewer_critical_stages_come_before_memory_headroom_at_a_look_and_at_the_budget():
    best, other = tie_traces(10.0, 4.0)
    traces = [replace(best, critical_stages=3), replace(other, critical_stages=1)]
    decisions = by_arm(decide_look(traces, 1, CONFIG))
    assert decisions["best"].action == "stop" and "more critical stages (3 vs 1)" in (
        decisions["best"].reason)  # fmt: skip
    longer = [replace(traces[0], steps_ms=steady(40, 100.0, seed=0)),
              replace(traces[1], steps_ms=steady(40, 101.0, seed=1))]  # fmt: skip
    final = by_arm(final_decisions(longer, CONFIG))
    assert final["other"].action == "win" and "fewer critical stages" in final["other"].reason
    assert "more critical stages (3 vs 1)" in final["best"].reason
    unknown = [replace(traces[0], critical_stages=None), traces[1]]
    assert by_arm(decide_look(unknown, 1, CONFIG))["best"].action == "stop"  # unknown: worst


def test_untied_arm_with_less_headroom_continues():
    # 1.5% slower with big noise: neither worse nor shown tied, so it runs on
    decisions = by_arm(decide_look(tie_traces(10.0, 4.0, ratio=1.015, cv=0.05), 1, CONFIG))
    assert decisions["other"].action == "continue"


def test_replay_settles_every_tie_by_the_tie_break_and_crowns_the_roomiest():
    means = {"a": 100.0, "b": 100.3, "c": 100.5, "d": 100.2, "e": 100.4}
    headroom = {"a": 5.0, "b": 10.0, "c": 3.0, "d": 4.0, "e": 12.0}
    traces = [ArmTrace(name, f"L-{name}", steady(40, mean, seed=i, cv=0.0005),
                       headroom_gib=headroom[name])
              for i, (name, mean) in enumerate(means.items())]  # fmt: skip
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
