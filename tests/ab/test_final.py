"""The verdict at the budget: the winner chosen, typed, then worded."""

from __future__ import annotations

import pytest

from ray_layout.ab.decisions import winner
from ray_layout.ab.final import WonOn, choose_final, final_decisions
from ray_layout.ab.stats import ArmTrace, steady_steps
from ray_layout.ab.tie_break import TieBreakOn
from tests.helpers.ab_short import BEST, CONFIG, by_arm, steady


def test_tie_within_margin_goes_to_the_arm_with_more_headroom():
    traces = [
        ArmTrace("fast", BEST, steady(40, 100.0), headroom_gib=5.0),
        ArmTrace("roomy", "Et*6|t*5|t*5|mL", steady(40, 101.0), headroom_gib=20.0),
        ArmTrace("unknown", "Et|t*16|mL", steady(40, 100.5, seed=4)),
    ]
    decisions = by_arm(final_decisions(traces, CONFIG))
    assert winner(list(decisions.values())).arm == "roomy"
    assert decisions["roomy"].look == 3 and "headroom among 3 tied" in decisions["roomy"].reason
    assert decisions["fast"].action == "lose" and "less memory headroom" in decisions["fast"].reason
    assert decisions["unknown"].action == "lose" and "unknown" in decisions["unknown"].reason
    assert decisions["fast"].reference == "roomy"


def test_clearly_faster_arm_beats_more_headroom():
    traces = [
        ArmTrace("fast", BEST, steady(40, 100.0), headroom_gib=1.0),
        ArmTrace("roomy", "x", steady(40, 110.0), headroom_gib=40.0),
    ]
    decisions = by_arm(final_decisions(traces, CONFIG))
    assert decisions["fast"].action == "win" and "won on time" in decisions["fast"].reason
    assert (
        decisions["roomy"].action == "lose" and "beyond the 2% margin" in decisions["roomy"].reason
    )
    assert decisions["roomy"].p_value < 1e-3


def test_equal_headroom_goes_to_the_lower_mean_and_no_qualifier_means_no_decision():
    traces = [
        ArmTrace("a", "x", steady(40, 101.0), headroom_gib=8.0),
        ArmTrace("b", BEST, steady(40, 100.0), headroom_gib=8.0),
    ]
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
        f"{choice.winner.stats.mean_ms:.1f} ms (1.0% slower than the fastest)"
    )
    assert words["fast"].reason == (
        "tied with Et*6|t*5|t*5|mL [roomy] within 2% (1.0% faster) "
        "but less memory headroom (5.0 GiB vs 20.0 GiB)"
    )
    assert words["slow"].reason.endswith(
        "than Et*5|t*6|t*5|mL [fast] at the budget, beyond the 2% margin"
    )
    assert final_of([ArmTrace("a", "x", steady(9))]) is None


@pytest.mark.parametrize(
    ("critical", "headroom", "won_on", "words"),
    [
        ((None, None), (None, None), WonOn.TIME, "won on time: mean "),
        ((1, 2), (5.0, 5.0), WonOn.CRITICAL, "won on fewer critical stages among 2 tied"),
        ((2, 2), (20.0, 5.0), WonOn.HEADROOM, "won on memory headroom among 2 tied"),
        (
            (2, 2),
            (8.0, 8.0),
            WonOn.TIME_AMONG_TIED,
            "won on time among 2 tied within 2% with equal or unknown memory headroom",
        ),
    ],
)
def test_each_way_of_winning_has_its_words(critical, headroom, won_on, words):
    gap = 110.0 if won_on is WonOn.TIME else 100.5
    traces = [
        ArmTrace(name, name, steady(40, mean, seed=i), headroom_gib=room, critical_stages=stages)
        for i, (name, mean, stages, room) in enumerate(
            zip(("a", "b"), (100.0, gap), critical, headroom, strict=True)
        )
    ]
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
