"""Ties: equal predictions (to the nanosecond) are one class, represented by the stated
tie-break (fewer critical ranks, lower peak, shorter then alphabetical layout string) and
counted; classes from several searches merge by prediction."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from ray_layout.model.sizing import GIB
from search.ranking import merge
from search.shards import evaluate_shard
from search.ties import (
    TieClass,
    critical_ranks,
    iter_tie_classes,
    merge_classes,
    prediction_key,
    tie_break_key,
    tie_classes,
)
from tests.helpers.planner_fixtures import optimal_set
from tests.helpers.search_shard_setup import plain_classes, shard_setup


def test_ties_collapse_to_one_candidate_with_a_count():
    """A heavy output layer, no p2p and no tails: while the stage holding it stays the slowest,
    every arrangement of the others predicts the same step."""
    space, program, model, options, grid = shard_setup(
        jitter=0.0, forward=(0.0, 10.0, 0.0, 100.0), p2p=0.0, tail_ms_per_gparam=0.0
    )
    result = merge([evaluate_shard(space, program, model, options, grid)], options.top)
    _, cuts, steps = plain_classes(space, program, model)
    assert result.ties[0] == len(optimal_set(space, cuts, steps)) > 1
    noise_free = [c.noise_free_ms for c in result.candidates]
    assert len(set(noise_free)) == len(noise_free)  # one candidate per prediction


def test_predictions_equal_to_the_nanosecond_are_one():
    keys = prediction_key(np.array([100.0, 100.0000004, 100.000001, 99.9999996]))
    assert keys[0] == keys[1] == keys[3] != keys[2]


def test_a_rank_within_two_percent_of_the_slowest_is_critical():
    loads = np.array([[100.0, 98.0, 97.9, 50.0], [10.0, 10.0, 10.0, 10.0], [0.0, 0.0, 5.0, 0.0]])
    assert critical_ranks(loads).tolist() == [2, 4, 1]


rows = st.lists(
    st.tuples(
        st.sampled_from((10.0, 10.0000001, 12.5, 30.0)),  # step: the first two are one prediction
        st.integers(1, 3),  # critical ranks
        st.sampled_from((20.0, 20.5, 40.0)),  # peak GiB
        st.tuples(st.integers(1, 12), st.integers(13, 120)),  # cuts
    ),
    min_size=1,
    max_size=30,
)


@settings(max_examples=100, deadline=None)
@given(rows=rows)
def test_classes_are_the_distinct_predictions_each_with_its_tie_break_representative(rows):
    """Against grouping by hand: ascending predictions, each class's count, and the row that
    the tie-break key ranks first (the label is one string per cut set)."""
    steps, critical, peak_gib, cuts = (np.array(column) for column in zip(*rows, strict=True))

    def label(row_cuts: np.ndarray) -> str:
        return "t" * int(row_cuts[0]) + str(row_cuts[1])

    found = list(iter_tie_classes(steps, critical, peak_gib * GIB, cuts, label))
    keys = prediction_key(steps)
    assert [tie.step_ms for tie in found] == sorted(set(keys.tolist()))
    for tie in found:
        members = np.flatnonzero(keys == tie.step_ms)
        assert tie.count == len(members)
        by_hand = min(
            (tie_break_key(critical[i], peak_gib[i], label(cuts[i])), tuple(cuts[i].tolist()))
            for i in members
        )
        assert (tie.key, tie.cuts) == by_hand


def test_the_label_is_asked_only_of_rows_still_tied():
    steps = np.array([5.0, 5.0, 5.0, 7.0])
    critical, peak = np.array([1, 2, 1, 3]), np.array([10.0, 10.0, 12.0, 10.0]) * GIB
    cuts = np.array([[1, 2], [3, 4], [5, 6], [7, 8]])
    asked: list[int] = []

    def label(row: np.ndarray) -> str:
        asked.append(int(row[0]))
        return str(row)

    found = list(iter_tie_classes(steps, critical, peak, cuts, label))
    assert [(tie.step_ms, tie.cuts, tie.count) for tie in found] == [
        (5.0, (1, 2), 3),
        (7.0, (7, 8), 1),
    ]
    assert sorted(asked) == [1, 7]


def test_tie_classes_stops_at_the_limit():
    steps = np.array([3.0, 1.0, 2.0, 1.0])
    arrays = (steps, np.ones(4, dtype=int), np.ones(4) * GIB, np.arange(8).reshape(4, 2), str)
    assert [tie.step_ms for tie in tie_classes(*arrays, limit=2)] == [1.0, 2.0]
    assert len(tie_classes(*arrays)) == 3


def test_merged_classes_add_their_counts_and_keep_the_better_representative():
    found = {1.0: TieClass(1.0, (4, 8), tie_break_key(2, 30.0, "Et*3|tL"), 3)}
    better = TieClass(1.0, (5, 9), tie_break_key(1, 40.0, "Et*4|tttL"), 2)
    other = TieClass(2.0, (6, 9), tie_break_key(1, 30.0, "Et*5|tL"), 1)
    merge_classes(found, [better, other])
    assert found[1.0] == TieClass(1.0, (5, 9), better.key, 5)
    assert found[2.0] == other
    merge_classes(found, [TieClass(1.0, (7, 9), tie_break_key(3, 1.0, "E|L"), 1)])
    assert found[1.0].cuts == (5, 9) and found[1.0].count == 6
