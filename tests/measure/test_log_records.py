"""What a log's records mean: the timer names, which timer blocks are training and which of
those are steady, and the records' immutability."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ray_layout.measure.log_records import (
    LEVEL1_TIMERS,
    LEVEL2_TIMERS,
    MAX_LOGGED_MS,
    MAX_MEMORY_MB,
    NON_TRAINING_TIMERS,
    TIMER_NAMES,
    WARMUP_INTERVALS,
    IterationRecord,
    ParsedLog,
    TimerRecord,
    impossible_timer,
    out_of_range,
    steady_intervals,
)
from ray_layout.measure.logs import parse_log
from tests.helpers.measure_log_lines import (
    MAX_TIMES,
    all_block,
    as_text,
    iteration_line,
    max_block,
    minmax_block,
    with_logger,
)


def parsed_of(*blocks: tuple[int | None, tuple[str, ...]]) -> ParsedLog:
    """A log of timer blocks, each (the iteration line printed before it, its timer names)."""
    timers = tuple(
        TimerRecord(interval, iteration, 0, name, 1.0, "rank")
        for interval, (iteration, names) in enumerate(blocks)
        for name in names
    )
    return ParsedLog(timers, (), (), 0, (), None)


def test_timer_names_list_both_levels() -> None:
    assert LEVEL1_TIMERS[0] == "forward-backward" and "optimizer" in LEVEL1_TIMERS
    assert {"forward-compute", "backward-compute", "forward-recv"} <= set(LEVEL2_TIMERS)
    assert TIMER_NAMES == LEVEL1_TIMERS + LEVEL2_TIMERS
    assert len(set(TIMER_NAMES)) == len(TIMER_NAMES) == 24


def test_unknown_timer_names_are_kept() -> None:
    times = {"forward-compute": {0: 1.0}, "my-new-timer": {0: 2.0}, "backward-compute": {0: 3.0}}
    parsed = parse_log(as_text(all_block(times)))
    assert [r.timer for r in parsed.timers] == list(times)
    assert parsed.unknown_timers == ("my-new-timer",)


def test_training_and_steady_intervals() -> None:
    """Start-up blocks and a save-checkpoint block are not training intervals."""
    lines = [
        *with_logger(max_block({"model-and-optimizer-setup": 4100.0})),
        *with_logger(max_block({"load-checkpoint": 512.0})),
        iteration_line(1),
        *with_logger(max_block(MAX_TIMES)),
        iteration_line(10),
        *with_logger(max_block(MAX_TIMES)),
        *with_logger(max_block({"save-checkpoint": 900.0})),
        iteration_line(20),
        *with_logger(max_block(MAX_TIMES)),
    ]
    parsed = parse_log(as_text(lines))
    assert parsed.intervals == (0, 1, 2, 3, 4, 5)
    assert parsed.training_intervals == (2, 3, 5)
    assert steady_intervals(parsed) == (5,)  # WARMUP_INTERVALS: the two the fit drops too
    assert steady_intervals(parsed, warmup=1) == (3, 5)
    assert steady_intervals(parsed, warmup=0) == (2, 3, 5)
    assert steady_intervals(parsed, warmup=2) == (5,)
    assert steady_intervals(parsed, warmup=5) == ()
    with pytest.raises(ValueError, match="warmup"):
        steady_intervals(parsed, warmup=-1)


def test_the_first_interval_is_kept_as_printed() -> None:
    """One iteration / log_interval: a tenth of the steady value, exposed, not corrected."""
    lines = [
        iteration_line(1),
        *max_block({"forward-backward": 3600.0 / 10}),
        iteration_line(10),
        *max_block({"forward-backward": (3600.0 + 9 * 1200.0) / 10}),
        iteration_line(20),
        *max_block({"forward-backward": 1200.0}),
    ]
    parsed = parse_log(as_text(lines))
    assert [r.ms for r in parsed.timers] == [360.0, 1440.0, 1200.0]
    assert steady_intervals(parsed, warmup=1) == (1, 2)


def test_eval_and_checkpoint_blocks_are_never_training() -> None:
    lines = [
        *minmax_block({"model-and-optimizer-setup": (4100.0, 4125.5)}),
        iteration_line(10),
        *minmax_block({"evaluate": (57313.42, 57314.02)}),
        iteration_line(20),
        *minmax_block({"save-checkpoint": (30421.34, 30421.36)}),
        iteration_line(30),
        *minmax_block({"forward-backward": (1.0, 2.0)}),
        *minmax_block({"evaluate": (5.0, 6.0)}),
    ]
    parsed = parse_log(as_text(lines))
    assert parsed.intervals == (0, 1, 2, 3, 4)
    assert parsed.training_intervals == (3,)


@pytest.mark.megatron
def test_level_2_names_are_the_timers_megatron_core_starts_at_level_2() -> None:
    """Every level-2 timer megatron-core's schedules and p2p calls start, and batch-generator,
    which pretrain_gpt.py starts."""
    core = Path(pytest.importorskip("megatron.core").__file__).parent
    started = {
        name
        for path in core.rglob("*.py")
        for name in re.findall(r"timers\(\s*'([a-z-]+)',\s*log_level=2", path.read_text())
    }
    assert started == set(LEVEL2_TIMERS) - {"batch-generator"}


def test_blocks_before_any_iteration_line_and_later_blocks_of_one_iteration_are_not_training():
    parsed = parsed_of(
        (None, ("forward-backward",)),  # no iteration line yet: start-up
        (1, ("forward-backward", "forward-compute")),
        (1, ("forward-backward",)),  # a second block of iteration 1 is not training_log's
        (2, ("evaluate",)),
        (2, ("forward-backward",)),  # the first of iteration 2 that is not evaluation
        (3, ("save-checkpoint", "load-checkpoint")),
    )
    assert parsed.intervals == (0, 1, 2, 3, 4, 5)
    assert parsed.training_intervals == (1, 4)


def test_intervals_without_records_are_not_intervals() -> None:
    timers = (TimerRecord(3, 1, 0, "optimizer", 1.0, "rank"),)
    assert ParsedLog(timers, (), (), 0, (), None).intervals == (3,)
    assert ParsedLog((), (), (), 0, (), None).training_intervals == ()


def test_unknown_timers_come_first_seen_first_and_once() -> None:
    parsed = parsed_of((1, ("zeta", "forward-backward", "alpha")), (2, ("alpha", "zeta", "beta")))
    assert parsed.unknown_timers == ("zeta", "alpha", "beta")
    assert NON_TRAINING_TIMERS.isdisjoint(TIMER_NAMES)


def test_an_iteration_records_losses_are_its_own_and_read_only() -> None:
    losses = {"lm loss": 2.5}
    record = IterationRecord(1, 10, None, 5.0, None, None, None, losses, None, None, None, None)
    losses["lm loss"] = 9.0
    assert record.losses == {"lm loss": 2.5}
    with pytest.raises(TypeError):
        record.losses["mtp_1 loss"] = 1.0  # type: ignore[index]
    assert hash(record) == hash(
        IterationRecord(1, 10, None, 5.0, None, None, None, {}, *[None] * 4)
    )


def test_a_negative_warmup_is_a_callers_mistake() -> None:
    with pytest.raises(ValueError, match=r"^warmup must be >= 0, not -1$"):
        steady_intervals(parsed_of((1, ("forward-backward",))), warmup=-1)


BLOCKS = st.lists(
    st.tuples(
        st.none() | st.integers(1, 5),
        st.lists(st.sampled_from(["forward-backward", "evaluate", "save-checkpoint"]), min_size=1),
    ),
    max_size=12,
).map(lambda blocks: sorted(blocks, key=lambda b: -1 if b[0] is None else b[0]))


@given(BLOCKS, st.integers(0, 5))
def test_steady_intervals_are_the_training_ones_less_the_first_few(
    blocks: list[tuple[int | None, list[str]]], warmup: int
) -> None:
    parsed = parsed_of(*((iteration, tuple(names)) for iteration, names in blocks))
    training = parsed.training_intervals
    assert steady_intervals(parsed, warmup) == training[warmup:]
    assert steady_intervals(parsed) == training[WARMUP_INTERVALS:]
    assert set(training) <= set(parsed.intervals) and list(training) == sorted(set(training))
    iterations = {r.interval: r.iteration for r in parsed.timers}
    assert len({iterations[i] for i in training}) == len(training)  # one per iteration line


@pytest.mark.parametrize(
    ("value", "why"),
    [
        (float("nan"), "not a number"),
        (float("inf"), "infinite"),
        (-0.5, "negative"),
        (1e300, "over a day"),
        (MAX_LOGGED_MS + 1, "over a day"),
    ],
)
def test_a_time_no_run_can_have_says_why(value, why):
    assert out_of_range("forward-compute", value, "ms") == f"forward-compute is {value!r} ms: {why}"


def test_times_memory_and_counts_inside_their_bounds_pass():
    assert out_of_range("a step", 0.0, "ms") is None
    assert out_of_range("a step", MAX_LOGGED_MS, "ms") is None
    assert out_of_range("memory", MAX_MEMORY_MB, "MiB") is None
    assert "over 16 TiB" in out_of_range("memory", MAX_MEMORY_MB * 2, "MiB")
    assert "over 1e+15" in out_of_range("the iteration", 1e16, upper=1e15)
    assert impossible_timer("forward-compute", 3, (("rank", 1.0),)) is None
    assert "rank above the largest world" in impossible_timer("x", 2**21, (("rank", 1.0),))
