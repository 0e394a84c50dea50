"""The tie-break among arms within the margin: fewer critical stages, then more memory headroom,
then the lower mean, unknowns counted worst; and what the loser lacks, in words."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ray_layout.ab.stats import ArmTrace
from ray_layout.ab.tie_break import TieBreakOn, critical_text, decided_on, tie_break_key, tie_loss


def arm(name, critical=None, headroom=None):
    return ArmTrace(name, f"layout-{name}", (), headroom_gib=headroom, critical_stages=critical)


@pytest.mark.parametrize(
    ("winner", "loser", "on"),
    [
        ((arm("a", 1, 2.0), 105.0), (arm("b", 2, 40.0), 100.0), TieBreakOn.CRITICAL),
        ((arm("a", 3, None), 105.0), (arm("b", None, 40.0), 100.0), TieBreakOn.CRITICAL),
        ((arm("a", 2, 9.0), 105.0), (arm("b", 2, 4.0), 100.0), TieBreakOn.HEADROOM),
        ((arm("a", None, 0.0), 105.0), (arm("b", None, math.nan), 100.0), TieBreakOn.HEADROOM),
        ((arm("a", None, 1.0), 105.0), (arm("b", None, None), 100.0), TieBreakOn.HEADROOM),
        ((arm("a", 2, 9.0), 100.0), (arm("b", 2, 9.0), 100.5), TieBreakOn.TIME),
        ((arm("a"), 100.0), (arm("b", headroom=math.nan), 100.5), TieBreakOn.TIME),
    ],
)
def test_each_part_of_the_key_decides_only_where_the_earlier_parts_agree(winner, loser, on):
    winner_key, loser_key = tie_break_key(*winner), tie_break_key(*loser)
    assert winner_key < loser_key
    assert decided_on(loser_key, winner_key) is on is decided_on(winner_key, loser_key)


TRACES = st.tuples(
    st.one_of(st.none(), st.integers(0, 8)),  # critical stages
    st.one_of(st.none(), st.just(math.nan), st.floats(-5.0, 80.0)),  # headroom
    st.floats(50.0, 150.0),  # mean
)


@given(st.lists(TRACES, min_size=1, max_size=6))
def test_the_winner_has_the_fewest_known_critical_stages_then_the_most_headroom(arms):
    traces = [(arm(f"arm-{i}", c, h), mean) for i, (c, h, mean) in enumerate(arms)]
    best, best_mean = min(traces, key=lambda item: tie_break_key(*item))

    def critical(trace):
        return math.inf if trace.critical_stages is None else trace.critical_stages

    def headroom(trace):
        known = trace.headroom_gib is not None and math.isfinite(trace.headroom_gib)
        return trace.headroom_gib if known else -math.inf

    fewest = min(critical(t) for t, _ in traces)
    assert critical(best) == fewest
    level = [(t, m) for t, m in traces if critical(t) == fewest]
    assert headroom(best) == max(headroom(t) for t, _ in level)
    same = [m for t, m in level if headroom(t) == headroom(best)]
    assert best_mean == min(same)


def test_the_loser_is_told_what_it_lacks():
    assert (
        tie_loss(arm("a", 3, 20.0), 100.0, arm("b", 1, 5.0), 101.0)
        == "more critical stages (3 vs 1)"
    )
    assert (
        tie_loss(arm("a", None, 20.0), 100.0, arm("b", 2, 5.0), 101.0)
        == "more critical stages (unknown vs 2)"
    )
    assert (
        tie_loss(arm("a", 2, 4.04), 100.0, arm("b", 2, 10.0), 101.0)
        == "less memory headroom (4.0 GiB vs 10.0 GiB)"
    )
    assert (
        tie_loss(arm("a", 2, math.nan), 100.0, arm("b", 2, 10.0), 101.0)
        == "less memory headroom (unknown vs 10.0 GiB)"
    )
    assert (
        tie_loss(arm("a", 2, None), 101.0, arm("b", 2, None), 100.0)
        == "equal or unknown memory headroom and a higher mean"
    )


def test_critical_stages_are_shown_as_a_count_or_unknown():
    assert critical_text(arm("a", 0)) == "0" and critical_text(arm("a", 3)) == "3"
    assert critical_text(arm("a")) == "unknown"
