"""Parsing Megatron-LM logs: the exact core_v0.16.1 formats, and the mess real logs wrap them in."""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from ray_layout.errors import ConfigError, MeasurementError
from ray_layout.measure import log_format
from ray_layout.measure.log_records import (
    SKIPPED_EXAMPLES,
    IterationRecord,
    MemoryRecord,
    ParsedLog,
    TimerRecord,
    steady_intervals,
)
from ray_layout.measure.logs import ITERATION_LINE_START, MAX_LINE_CHARS, parse_log, parse_log_file
from tests.helpers.measure_log_lines import (
    MAX_TIMES,
    TIMERS_LOGGER,
    TRAINING_LOGGER,
    all_block,
    as_text,
    iteration_line,
    max_block,
    memory_line,
    minmax_block,
    with_logger,
)
from tests.helpers.measure_timers_oracle import ORACLE_MS, megatron_timers_string
from tests.helpers.paths import SHARED_DATA, TEST_DATA

FIXTURE = TEST_DATA / "logs" / "megatron_all_timers.log"


ALL_TIMES = {
    "forward-backward": {0: 1234.56, 1: 1234.0, 2: 1230.5, 3: 1236.25},
    "forward-compute": {0: 300.0, 1: 290.0, 2: 295.0, 3: 410.0},
    "forward-recv": {0: 0.0, 1: 90.0, 2: 60.0, 3: 30.0},  # the first stage never receives
}
MINMAX_TIMES = {"forward-backward": (1230.5, 1236.25), "optimizer": (20.1, 20.5)}


def records_all(interval: int, iteration: int | None, times=ALL_TIMES) -> list[TimerRecord]:
    return [
        TimerRecord(interval, iteration, rank, name, round(ms, 2), "rank")
        for name, by_rank in times.items()
        for rank, ms in sorted(by_rank.items())
        if ms > 0
    ]


def clean_lines() -> list[str]:
    """One of each: a start-up block, three iterations, every timer option, memory lines."""
    return [
        *with_logger(minmax_block({"model-and-optimizer-setup": (4100.0, 4125.5)})),
        iteration_line(1),
        memory_line(0, 1),
        memory_line(3, 1),
        *with_logger(all_block(ALL_TIMES)),
        iteration_line(10),
        *with_logger(max_block(MAX_TIMES)),
        iteration_line(20),
        *with_logger(minmax_block(MINMAX_TIMES)),
    ]


CLEAN = parse_log(as_text(clean_lines()))


def test_clean_log_records() -> None:
    assert CLEAN.timers == (
        TimerRecord(0, None, None, "model-and-optimizer-setup", 4100.0, "min"),
        TimerRecord(0, None, None, "model-and-optimizer-setup", 4125.5, "max"),
        *records_all(1, 1),
        TimerRecord(2, 10, None, "forward-backward", 1236.25, "max"),
        TimerRecord(2, 10, None, "optimizer", 20.5, "max"),
        TimerRecord(3, 20, None, "forward-backward", 1230.5, "min"),
        TimerRecord(3, 20, None, "forward-backward", 1236.25, "max"),
        TimerRecord(3, 20, None, "optimizer", 20.1, "min"),
        TimerRecord(3, 20, None, "optimizer", 20.5, "max"),
    )
    assert [record.iteration for record in CLEAN.iterations] == [1, 10, 20]
    assert [(record.rank, record.iteration) for record in CLEAN.memory] == [(0, 1), (3, 1)]
    assert (CLEAN.skipped_lines, CLEAN.skipped_examples) == (0, ())
    assert CLEAN.log_interval_hint == 10


def test_all_option_reports_each_rank_that_has_a_value() -> None:
    parsed = parse_log(as_text(all_block(ALL_TIMES)))
    recv = [(r.rank, r.ms) for r in parsed.timers if r.timer == "forward-recv"]
    assert recv == [(1, 90.0), (2, 60.0), (3, 30.0)]
    assert {r.stat for r in parsed.timers} == {"rank"}


def test_a_name_of_47_characters_or_more_gets_no_dots() -> None:
    name = "x" * 50
    lines = max_block({name: 1.5})
    assert lines[1] == f"    {name} : 1.50"
    assert parse_log(as_text(lines)).timers == (TimerRecord(0, None, None, name, 1.5, "max"),)


@pytest.mark.parametrize("timers_logger", ["", TIMERS_LOGGER])
@pytest.mark.parametrize("training_logger", ["", TRAINING_LOGGER])
def test_logger_prefixes_are_optional(timers_logger: str, training_logger: str) -> None:
    lines = [
        timers_logger + line if "across ranks" in line else line
        for line in [line.removeprefix(TIMERS_LOGGER) for line in clean_lines()]
    ]
    lines = [training_logger + line if "iteration" in line else line for line in lines]
    assert parse_log(as_text(lines)) == CLEAN


@pytest.mark.parametrize(
    "stamp",
    [
        "[2026-03-16 10:00:12.345678] ",
        "2026-03-16 10:00:12,345 INFO ",
        "2026-03-16 10:00:12,345 INFO megatron.core.timers: ",
        "2026-03-16 10:00:12,345 - megatron.core.timers - INFO - ",
        "2026-03-16T10:00:12.345678901Z ",
        "[2026-03-16 10:00:12,345] [INFO] ",
    ],
)
def test_timestamps_are_ignored(stamp: str) -> None:
    assert parse_log(as_text([stamp + line for line in clean_lines()])) == CLEAN


@pytest.mark.parametrize(
    "prefix",
    [
        "(RankActor pid=1234, ip=10.0.0.1) ",
        "(pid=1234) ",
        "(RankActor(rank=3, stage=1) pid=1234, ip=10.0.0.1) ",
        "\x1b[36m(RankActor pid=1234, ip=10.0.0.1)\x1b[0m ",
        "[default0]:",
        "[rank3]:",
        "0: ",
        "3:",
        " 3: ",
        "12: [default3]:",
        "3: (RankActor pid=1234) [2026-03-16 10:00:12.345678] ",
    ],
)
def test_launcher_prefixes_are_ignored(prefix: str) -> None:
    assert parse_log(as_text([prefix + line for line in clean_lines()])) == CLEAN


def test_ray_deduplication_suffix_is_ignored() -> None:
    lines = [*all_block({"forward-backward": {0: 1.0}})]
    lines[-1] += " [repeated 3x across cluster]"
    assert parse_log(as_text(lines)).timers == (
        TimerRecord(0, None, 0, "forward-backward", 1.0, "rank"),
    )


def test_other_ranks_lines_inside_a_block_do_not_break_it() -> None:
    block = with_logger(all_block(ALL_TIMES))
    noise = [
        "(RankActor pid=11) " + memory_line(1, 1),
        "[rank2]: > building GPTTokenizer tokenizer ...",
        "0: " + memory_line(0, 1, allocated=99.0),
        "Theoretical memory footprints: weight and optimizer=11903.12 MB",
    ]
    # after the header, between a timer's name and its ranks, and between two ranks
    interleaved = [block[0], noise[0], block[1], noise[1], block[2], noise[2], noise[3], *block[3:]]
    maxes = with_logger(max_block(MAX_TIMES))
    lines = [iteration_line(1), *interleaved, iteration_line(2), maxes[0], noise[3], *maxes[1:]]
    parsed = parse_log(as_text(lines))
    assert parsed.timers == (
        *records_all(0, 1),
        TimerRecord(1, 2, None, "forward-backward", 1236.25, "max"),
        TimerRecord(1, 2, None, "optimizer", 20.5, "max"),
    )
    assert [(m.rank, m.allocated_mb) for m in parsed.memory] == [(1, 1234.56), (0, 99.0)]
    assert parsed.skipped_lines == 0


def test_windows_line_endings() -> None:
    assert parse_log(as_text(clean_lines()).replace("\n", "\r\n")) == CLEAN


def test_progress_bar_carriage_returns_break_lines() -> None:
    bar = "Loading checkpoint 10%\rLoading checkpoint 55%\rLoading checkpoint 100%\r"
    lines = clean_lines()
    text = bar + "\n".join(lines[:6]) + "\r" + "\r".join(lines[6:]) + "\r\n"
    assert parse_log(text) == CLEAN


def test_a_truncated_last_line_is_skipped_and_counted() -> None:
    text = as_text(clean_lines()) + "     rank  3: 12"
    parsed = parse_log(text)
    assert parsed.timers == CLEAN.timers
    assert parsed.skipped_lines == 1
    assert parsed.skipped_examples == (
        f"line {len(clean_lines()) + 1}: 'rank  3: 12' (cut off: the log ends without a newline)",
    )


def test_a_last_line_without_newline_is_skipped_even_if_it_parses() -> None:
    """Its value may have lost digits: 1236.25 cut to 1236.2 still parses."""
    lines = clean_lines()
    parsed = parse_log("\n".join(lines))
    assert parsed.timers == CLEAN.timers[:-2]  # the last minmax line: optimizer's min and max
    assert parsed.skipped_lines == 1


def test_blank_lines_are_ignored() -> None:
    text = "\n\n   \n" + "\n \t \n".join(clean_lines()) + "\n\n\n"
    assert parse_log(text) == CLEAN


def test_unicode_garbage_is_ignored() -> None:
    garbage = ["\x00\x00\ufffd\ufffd", "☃ 漢字 ﷽ \u2028 \u200b", "\udcff\x7f\x1b", "\ufeff"]
    lines = clean_lines()
    mixed = [garbage[0], *lines[:5], garbage[1], *lines[5:9], garbage[2], *lines[9:], garbage[3]]
    assert parse_log("\ufeff" + as_text(mixed)) == CLEAN


def test_undecodable_bytes_in_a_file(tmp_path: Path) -> None:
    path = tmp_path / "run.log"
    path.write_bytes(b"\xff\xfe\xc3(\n" + as_text(clean_lines()).encode() + b"\x80\x81\n")
    assert parse_log_file(path) == CLEAN


MALFORMED = [
    iteration_line(5).removesuffix(" |"),  # lost its tail
    iteration_line(5).replace("1234.5", "12x4.5"),
    "[Rank 2] (after 1 iterations) memory (MB) | allocated: 1.00 | max allocated: 2.00",
    "[Rank 2] (after 1 iterations) memory (MB) | allocated: 1.00 | max allocated: x | a",
    "     rank  9: 12.3.4",
    "    forward-backward ..............................: oops",
]


def test_malformed_lines_are_skipped_and_counted() -> None:
    lines = clean_lines()
    at = lines.index("     rank  1: 1234.00")
    text = as_text([*MALFORMED[:2], *lines[:at], *MALFORMED[2:], *lines[at:]])
    parsed = parse_log(text)
    assert (parsed.timers, parsed.iterations, parsed.memory) == (
        CLEAN.timers,
        CLEAN.iterations,
        CLEAN.memory,
    )
    assert parsed.skipped_lines == len(MALFORMED)
    assert len(parsed.skipped_examples) == SKIPPED_EXAMPLES
    assert parsed.skipped_examples[0].startswith("line 1: '[2026-03-16 10:00:12.345678] iter")
    assert parsed.skipped_examples[0].endswith(
        "…' (an iteration line cut short or with a value that is no number)"
    )
    assert parsed.skipped_examples[2] == (
        f"line {at + 3}: '[Rank 2] (after 1 iterations) memory (MB) | allocated: 1.00 | max "
        "allocated: 2.0…' (a memory line without its rank, iteration and four sizes, each a number)"
    )
    assert parsed.skipped_examples[4] == (
        f"line {at + 5}: 'rank  9: 12.3.4' (a timer entry whose value is no number)"
    )


def test_a_damaged_header_orphans_its_entries() -> None:
    """Its entries must not be filed under the block before it."""
    block = max_block({"params-all-gather": 2.0})
    lines = [*max_block(MAX_TIMES), "max time across ranks (m", *block[1:], *minmax_block({})]
    parsed = parse_log(as_text(lines))
    assert [(r.interval, r.timer) for r in parsed.timers] == [
        (0, "forward-backward"),
        (0, "optimizer"),
    ]
    assert parsed.skipped_lines == 2


def test_a_repeated_entry_in_one_block_is_skipped() -> None:
    lines = all_block({"forward-backward": {0: 1.0, 1: 2.0}})
    parsed = parse_log(as_text([*lines, lines[-1]]))
    assert len(parsed.timers) == 2 and parsed.skipped_lines == 1


def test_entries_outside_a_block_are_skipped() -> None:
    lines = [memory_line(0, 1), "     rank  0: 12.00", max_block(MAX_TIMES)[1]]
    parsed = parse_log(as_text(lines))
    assert parsed.timers == () and parsed.skipped_lines == 2


def test_checkpoint_memory_reports_are_not_iteration_memory() -> None:
    report = memory_line(2, 20).replace("(after 20 iterations)", "(before save_checkpoint)")
    parsed = parse_log(as_text([memory_line(2, 20), report]))
    assert [m.iteration for m in parsed.memory] == [20]
    assert parsed.skipped_lines == 0


def test_iteration_line_with_every_field() -> None:
    (record,) = parse_log(as_text([iteration_line(10)])).iterations
    assert record == IterationRecord(
        iteration=10,
        train_iters=30,
        consumed_samples=640,
        elapsed_ms=1234.5,
        throughput_tflops=54.8,
        learning_rate=1e-4,
        global_batch_size=64,
        losses={"lm loss": 10.41234, "mtp_1 loss": 10.52345},
        loss_scale=1.0,
        grad_norm=3.456,
        skipped_iterations=0,
        nan_iterations=0,
    )
    assert list(record.losses) == ["lm loss", "mtp_1 loss"]
    with pytest.raises(TypeError):
        record.losses["lm loss"] = 0.0  # type: ignore[index]
    assert hash(record) == hash(record)


def test_iteration_line_without_optional_fields() -> None:
    line = iteration_line(10, throughput=None, losses={"lm loss": 9.5}, grad_norm=None)
    (record,) = parse_log(as_text([line])).iterations
    assert (record.throughput_tflops, record.grad_norm) == (None, None)
    assert dict(record.losses) == {"lm loss": 9.5}


def test_iteration_line_of_a_moe_run_with_flags_the_record_has_no_place_for() -> None:
    losses = {"lm loss": 9.5, "load_balancing_loss": 1.02, "mtp_1 loss": 9.7}
    extra = " num zeros: 1234 | params norm: 250.123 |"
    (record,) = parse_log(as_text([iteration_line(10, losses=losses, extra=extra)])).iterations
    assert dict(record.losses) == losses


def test_nan_loss_is_kept() -> None:
    (record,) = parse_log(
        as_text([iteration_line(10, losses={"lm loss": float("nan")})])
    ).iterations
    assert record.losses["lm loss"] != record.losses["lm loss"]


def test_a_minimal_iteration_line() -> None:
    line = " iteration        3/      10 | elapsed time per iteration (ms): 12.5 |"
    (record,) = parse_log(as_text([line])).iterations
    assert record == IterationRecord(
        3, 10, None, 12.5, None, None, None, {}, None, None, None, None
    )


def test_memory_lines_of_several_ranks() -> None:
    lines = [memory_line(rank, 10, allocated=1000.0 + rank) for rank in (3, 0, 2, 1)]
    parsed = parse_log(as_text(lines))
    assert parsed.memory[0] == MemoryRecord(3, 10, 1003.0, 2006.0, 2500.0, 2600.0)
    assert [m.rank for m in parsed.memory] == [3, 0, 2, 1]
    assert parsed.timers == parsed.iterations == ()


def test_memory_line_with_total_device_memory() -> None:
    line = memory_line(0, 1) + " | total device memory used: 30000.00"
    assert parse_log(as_text([line])).memory == (
        MemoryRecord(0, 1, 1234.56, 2469.12, 2500.0, 2600.0),
    )


@pytest.mark.parametrize(
    ("iterations", "hint"),
    [([1, 10, 20, 30], 10), ([1, 5, 10], 5), ([101, 110, 120], 10), ([1, 10], None), ([1], None)],
)
def test_log_interval_hint(iterations: list[int], hint: int | None) -> None:
    parsed = parse_log(as_text([iteration_line(i, train_iters=200) for i in iterations]))
    assert parsed.log_interval_hint == hint


def test_everything_at_once() -> None:
    """Prefixes, timestamps, interleaved ranks, \\r, garbage, malformed and a cut last line."""
    ray3 = "(RankActor pid=23106, ip=10.0.0.2) "
    setup = with_logger(minmax_block({"model-and-optimizer-setup": (4100.0, 4125.5)}))
    block = with_logger(all_block(ALL_TIMES))
    maxes = max_block(MAX_TIMES)
    lines = [
        "Loading shards 1/4\rLoading shards 4/4\r",
        "2026-03-16 10:00:01,000 INFO " + setup[0],
        "2026-03-16 10:00:01,000 INFO " + setup[1] + "\r",
        "",
        ray3 + iteration_line(1),
        "(RankActor pid=48213) " + memory_line(0, 1),
        ray3 + block[0],
        "1: [default1]:" + memory_line(1, 1),
        *(ray3 + line for line in block[1:4]),
        "\x00☃\ufffd garbage from a dying process",
        "[rank2]: " + memory_line(2, 1).replace("max reserved", "max"),  # malformed
        *(ray3 + line for line in block[4:]),
        "\r",
        "3: " + iteration_line(10) + "\r",
        "3: [rank3]:" + TIMERS_LOGGER + maxes[0],
        "0: [rank0]: W0316 10:00:19.1 torch/distributed warning",
        *("3: [rank3]:" + line for line in maxes[1:]),
        TRAINING_LOGGER + iteration_line(20),
        "\x1b[36m(RankActor pid=23106, ip=10.0.0.2)\x1b[0m " + TIMERS_LOGGER + "max time across",
    ]
    parsed = parse_log("\n".join(lines))
    assert parsed.timers == (
        TimerRecord(0, None, None, "model-and-optimizer-setup", 4100.0, "min"),
        TimerRecord(0, None, None, "model-and-optimizer-setup", 4125.5, "max"),
        *records_all(1, 1),
        TimerRecord(2, 10, None, "forward-backward", 1236.25, "max"),
        TimerRecord(2, 10, None, "optimizer", 20.5, "max"),
    )
    assert [r.iteration for r in parsed.iterations] == [1, 10, 20]
    assert [(m.rank, m.iteration) for m in parsed.memory] == [(0, 1), (1, 1)]
    assert parsed.skipped_lines == 2  # the damaged memory line and the cut last line
    assert steady_intervals(parsed, warmup=1) == (2,)


def test_non_megatron_text_is_a_one_line_error() -> None:
    text = "\n  \nTraceback (most recent call last):\n" + "x" * 200 + "\n"
    with pytest.raises(MeasurementError) as error:
        parse_log(text, source="runs/a.log")
    assert str(error.value) == (
        "runs/a.log: no Megatron timers, iteration or memory lines found "
        "(line 3: 'Traceback (most recent call last):')"
    )


def test_error_for_empty_text_and_long_first_line() -> None:
    with pytest.raises(MeasurementError, match=r"^log: .* found \(the text is empty\)$"):
        parse_log("\n\n")
    with pytest.raises(MeasurementError) as error:
        parse_log("é" * 300 + "\r\nmore\n")
    message = str(error.value)
    assert "\n" not in message and message.endswith("(line 1: '" + "é" * 80 + "…')")


def test_malformed_lines_alone_are_an_error_that_says_why() -> None:
    with pytest.raises(MeasurementError) as error:
        parse_log(as_text(MALFORMED))
    assert str(error.value).startswith(
        "log: no Megatron timers, iteration or memory lines could be read: 6 line(s) that look "
        "like them were dropped, first line 1: '[2026-03-16"
    )
    assert str(error.value).endswith(
        "(an iteration line cut short or with a value that is no number)"
    )


def test_file_errors_name_the_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.log"
    path.write_text("hello\n")
    with pytest.raises(MeasurementError) as error:
        parse_log_file(path)
    assert str(error.value).startswith(f"{path}: no Megatron ")
    assert str(error.value).endswith("(line 1: 'hello')")
    with pytest.raises(ConfigError, match=r"missing\.log: cannot read \(No such file"):
        parse_log_file(tmp_path / "missing.log")
    os.mkfifo(tmp_path / "fifo.log")
    with pytest.raises(ConfigError, match=r"fifo\.log: a FIFO, not a regular file .*16,777,216"):
        parse_log_file(tmp_path / "fifo.log")  # would block for a writer, never end
    sparse = tmp_path / "sparse.log"
    with open(sparse, "wb") as handle:
        handle.truncate(9 * 2**30)  # 9 GB on paper, nothing on disk
    with pytest.raises(ConfigError, match=r"sparse\.log: 9,663,676,416 bytes, more than the"):
        parse_log_file(sparse)


def test_fixture_log_of_a_four_stage_run() -> None:
    """core_v0.16.1 output of a PP=4 run, --timing-log-level 2 --timing-log-option all
    --log-interval 10, started on Ray: a start-up block, then iterations 1, 10 and 20."""
    parsed = parse_log_file(FIXTURE)
    assert parsed.skipped_lines == 0
    assert [r.iteration for r in parsed.iterations] == [1, 10, 20]
    assert parsed.log_interval_hint == 10
    assert [(m.rank, m.iteration) for m in parsed.memory] == [
        (0, 1), (2, 1), (3, 1), (1, 1), (1, 10), (0, 10), (3, 10), (2, 10),
    ]  # fmt: skip
    assert parsed.memory[-1] == MemoryRecord(2, 10, 12869.8, 24601.3, 26212.0, 26212.0)
    assert parsed.intervals == (0, 1, 2, 3)
    assert parsed.training_intervals == (1, 2, 3)
    assert steady_intervals(parsed, warmup=1) == (2, 3)
    assert parsed.unknown_timers == (
        "model-and-optimizer-setup",
        "train/valid/test-data-iterators-setup",
    )
    per_interval = [[r for r in parsed.timers if r.interval == i] for i in parsed.intervals]
    assert [len(records) for records in per_interval] == [8, 70, 70, 70]
    assert {r.rank for r in parsed.timers} == {0, 1, 2, 3}

    def ms(interval: int, timer: str, rank: int) -> float:
        (record,) = [r for r in per_interval[interval] if (r.timer, r.rank) == (timer, rank)]
        return record.ms

    assert ms(0, "model-and-optimizer-setup", 0) == 4111.58
    # forward-recv: never on the first stage; forward-send: never on the last
    assert {r.rank for r in per_interval[3] if r.timer == "forward-recv"} == {1, 2, 3}
    assert {r.rank for r in per_interval[3] if r.timer == "forward-send"} == {0, 1, 2}
    # the first-interval quirk: one slow iteration / 10 is far below a steady interval
    first, steady = ms(1, "forward-backward", 3), ms(3, "forward-backward", 3)
    assert first < 0.4 * steady
    assert ms(3, "forward-compute", 3) == 371.97


_PREFIXES = ["", "(RankActor pid=7, ip=10.0.0.9) ", "(pid=7) ", "[default1]:", "[rank1]:", "1: "]
_NOISE = [
    "Traceback (most recent call last):",
    '  File "/opt/megatron/megatron/training/training.py", line 2034, in training_log',
    "WARNING: Logging before flag parsing goes to stderr.",
    "[W316 10:00:12.345 ProcessGroupNCCL.cpp:1168] Warning: something",
    "Exception ignored in: <function _MultiProcessingDataLoaderIter.__del__>",
    "validation loss at iteration 20 on validation set | lm loss value: 8.6E+00 |",
    "successfully saved checkpoint from iteration      20 to /ckpt [ t 1/1, p 4/4 ]",
    "[Rank 2] (before save_checkpoint for iteration 20) memory (MB) | allocated: 1.00",
    "Evaluating iter 3/10",
    "> building train, validation, and test datasets ...",
]
# Junk: other programs' lines.  Random text never holds a colon, so it cannot look like a timer
# name (``  name:``), a rank line or a dotted entry; the noise lines are real ones that do.
_JUNK = st.builds(
    str.__add__,
    st.sampled_from(_PREFIXES),
    st.one_of(
        st.text(st.characters(exclude_characters=":\r\n"), max_size=60),
        st.sampled_from(_NOISE),
    ),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(min_value=0), _JUNK), max_size=30))
def test_junk_lines_never_change_the_records(insertions: list[tuple[int, str]]) -> None:
    lines = [(_PREFIXES[1] if i % 2 else "") + line for i, line in enumerate(clean_lines())]
    base = parse_log(as_text(lines))
    for position, junk in insertions:
        lines.insert(position % (len(lines) + 1), junk)
    parsed = parse_log(as_text(lines))
    assert (parsed.timers, parsed.iterations, parsed.memory) == (
        base.timers,
        base.iterations,
        base.memory,
    )
    assert parsed.skipped_lines >= base.skipped_lines
    assert isinstance(parsed, ParsedLog)


# megatron-core 0.16.1's own Timers as the oracle (tests/helpers/measure_timers_oracle.py).


def oracle_expected(option: str) -> list[tuple[str, int | None, str, float]]:
    """(timer, rank, stat, ms) as Megatron computes them, before printing with 2 decimals."""
    rows = []
    for name, per_rank in ORACLE_MS.items():
        reported = [(rank, ms) for rank, ms in enumerate(per_rank) if ms > 0]
        if option == "all":
            rows += [(name, rank, "rank", ms) for rank, ms in reported]
        else:
            values = [ms for _, ms in reported]
            stats = [("max", max(values))] if option == "max" else [
                ("min", min(values)), ("max", max(values))]  # fmt: skip
            rows += [(name, None, stat, ms) for stat, ms in stats]
    return rows


@pytest.mark.parametrize("option", ["all", "minmax", "max"])
def test_the_parser_reads_what_megatron_core_timers_write(option, monkeypatch) -> None:
    text = megatron_timers_string(option, monkeypatch)
    parsed = parse_log(TIMERS_LOGGER + text + "\n")
    got = [(r.timer, r.rank, r.stat, r.ms) for r in parsed.timers]
    expected = oracle_expected(option)
    assert [row[:3] for row in got] == [row[:3] for row in expected]
    assert [row[3] for row in got] == pytest.approx([row[3] for row in expected], abs=0.006)
    assert {r.interval for r in parsed.timers} == {0} and parsed.skipped_lines == 0


# Megatron before core (megatron/timers.py, 2019-2022) printed one line on the last rank:
#   string = 'time (ms)'; string += ' | {}: {:.2f}'.format(name, elapsed_time) per timer.


def test_the_one_line_timer_format_of_megatron_before_core() -> None:
    lines = [
        iteration_line(10),
        "time (ms) | forward-compute: 193.77 | backward-compute: 402.34 | optimizer: 20.05",
        iteration_line(20),
        "[default7]:time (ms) | forward-compute: 190.12 | backward-compute: 401.00",
    ]
    parsed = parse_log(as_text(lines))
    assert parsed.timers == (
        TimerRecord(0, 10, None, "forward-compute", 193.77, "last"),
        TimerRecord(0, 10, None, "backward-compute", 402.34, "last"),
        TimerRecord(0, 10, None, "optimizer", 20.05, "last"),
        TimerRecord(1, 20, None, "forward-compute", 190.12, "last"),
        TimerRecord(1, 20, None, "backward-compute", 401.0, "last"),
    )
    assert parsed.training_intervals == (0, 1) and parsed.skipped_lines == 0


def test_deepspeeds_own_time_lines_are_not_megatrons() -> None:
    deepspeed = (
        "[2024-04-04 09:36:28,430] [INFO] [logging.py:96:log_dist] [Rank 0] time (ms) | "
        "fwd: 11336.33 | bwd: 7134.75 | step: 2564.02"
    )
    parsed = parse_log(as_text([deepspeed, iteration_line(1)]))
    assert parsed.timers == () and parsed.skipped_lines == 0


def test_an_iteration_line_with_a_segment_that_is_not_key_value_is_kept() -> None:
    line = iteration_line(4).replace(
        " | learning rate", " | iteration time: 270.125 s samples/sec: 3.8 | learning rate"
    )
    parsed = parse_log(as_text([line]))
    plain = parse_log(as_text([iteration_line(4)])).iterations[0]
    assert parsed.iterations[0] == replace(plain, unknown_segments=1)
    assert parsed.unknown_segments == 1


def test_records_glued_onto_one_line_are_split_and_all_kept() -> None:
    first, second = memory_line(9, 1), memory_line(8, 1)
    block = minmax_block(MINMAX_TIMES)
    lines = [first + second, iteration_line(10) + block[0], *block[1:3]]
    lines[-1] += "training ..."  # print_rank_0 output glued after the closing parenthesis
    parsed = parse_log(as_text(lines))
    assert [m.rank for m in parsed.memory] == [9, 8]
    assert [(r.interval, r.iteration, r.timer, r.stat) for r in parsed.timers] == [
        (0, 10, "forward-backward", "min"),
        (0, 10, "forward-backward", "max"),
        (0, 10, "optimizer", "min"),
        (0, 10, "optimizer", "max"),
    ]
    assert parsed.split_lines == 3 and parsed.skipped_lines == 0


@pytest.mark.parametrize("block", [all_block(ALL_TIMES), max_block(MAX_TIMES)])
def test_text_glued_onto_a_bare_value_drops_the_entry(block: list[str]) -> None:
    """``20.50training`` may be 20.50 with another writer's text, or a number with a tail:
    no reader can tell, so the entry is dropped and counted, never read as a guess."""
    lines = [*block[:-1], block[-1] + "training ..."]
    parsed = parse_log(as_text(lines))
    assert parsed.timers == parse_log(as_text(block[:-1])).timers
    assert parsed.skipped_examples == (
        f"line {len(lines)}: {block[-1].strip() + 'training ...'!r} "
        "(a timer entry whose value is no number)",
    )


def test_every_iteration_line_megatron_prints_is_a_heartbeat() -> None:
    line = log_format.iteration_line(12, 100, 768, 1234.5, 64, {"lm loss": 2.0}, grad_norm=1.0)
    assert ITERATION_LINE_START.search(line)
    assert ITERATION_LINE_START.search("(RankActor pid=1) " + line)
    assert not ITERATION_LINE_START.search("saving checkpoint at iteration      10 to /ckpt")
    assert not ITERATION_LINE_START.search("validation loss at iteration 20 on validation set |")


def test_every_line_the_parser_reads_as_an_iteration_is_a_heartbeat() -> None:
    """A run's heartbeat and the parser share one pattern, so a fork's key=value lines keep a
    run alive as long as they are measured (no run classed a hang while it trains)."""
    real = SHARED_DATA / "real_megatron_logs"
    if not real.is_dir():
        pytest.skip(f"{real} is absent (the published logs sit beside the checkout)")
    for log in sorted(real.glob("*.log")):
        text = log.read_text(encoding="utf-8", errors="replace")
        parsed = parse_log(text, str(log))
        beats = [line for line in text.splitlines() if ITERATION_LINE_START.search(line)]
        assert len(beats) >= len(parsed.iterations), log.name


IMPOSSIBLE = ["nan", "NaN", "inf", "-inf", "-1.5", "1e300", "-0.5e3"]


@pytest.mark.parametrize("value", IMPOSSIBLE)
@pytest.mark.parametrize("where", ["timer", "step", "memory", "minmax", "one-line"])
def test_a_value_no_run_can_have_refuses_the_log_naming_line_and_value(where, value) -> None:
    """NaN, infinite, negative or day-long times and memory are no measurement: the log is
    refused whole (nothing of it stored), naming the file, the line and the value."""
    lines = clean_lines()
    first = {
        "timer": "     rank  3: 410.00",
        "step": "(ms): 1234.5",
        "memory": "max allocated: 2469.12",
        "minmax": "(20.10, 20.50)",
    }
    if where == "one-line":
        at = len(lines)
        lines.append(f"time (ms) | forward-compute: {value} | backward-compute: 3.0 |")
    else:
        at = next(i for i, line in enumerate(lines) if first[where] in line)
        new = {"timer": f"rank  3: {value}", "minmax": f"(20.10, {value})"}.get(where)
        old = first[where].strip() if new else first[where].rsplit(" ", 1)[1]
        lines[at] = lines[at].replace(old, new or value)
    with pytest.raises(MeasurementError, match=rf"^run\.log: line {at + 1}: .*nothing") as refused:
        parse_log(as_text(lines), "run.log")
    assert repr(float(value)) in str(refused.value)


def test_losses_and_grad_norm_may_be_nan_as_a_diverging_run_prints_them() -> None:
    line = iteration_line(1, losses={"lm loss": float("nan")}, grad_norm=float("inf"))
    (record,) = parse_log(as_text([line])).iterations
    assert record.losses["lm loss"] != record.losses["lm loss"] and record.grad_norm == float("inf")


# What a line can be made of to make a pattern backtrack: blanks, digits, separators and the
# starts of every record the parser knows, in every state of its reader.
ADVERSARIAL = [
    " ",
    "\t",
    "|",
    ":",
    "=",
    ".",
    "1",
    "a",
    "(",
    ")",
    "e",
    "pid=1 ",
    "[Rank 0] (",
    "rank 0: 1",
    " ....: 1",
    "time (ms) | a: 1",
    "INFO:",
    "3:",
    "[default0]:",
    "a.b - ",
    "iteration 1/ 2 |",
    "memory (MB)",
    "times across ranks (ms):",
    "\x1b[",
]
OPEN_BLOCKS = [
    "",
    "times across ranks (ms):\n",
    "times across ranks (ms):\n  forward-compute:\n",
    "max time across ranks (ms):\n",
    "(min, max) time across ranks (ms):\n",
]


@settings(max_examples=80, deadline=None)
@example("", ["time (ms) | a: 1"], [" "], "x")  # the old one-line pattern: quadratic
@example("", ["time (ms) | a: 1"], [" | a: 1"], "x")  # and exponential
@example(OPEN_BLOCKS[2], ["rank 0: 1", "a"], [" "], "x")  # another writer's text, then blanks
@example(OPEN_BLOCKS[3], [" ....: 1", "a"], ["\t"], "x")
@example("", ["(", "pid=1 "], ["1"], "")  # Ray's prefix, never closed
@example("", ["("], ["pid=1 "], "")
@example("", ["iteration 1/ 2 |", "a"], [" "], " |")  # a segment of blanks without its colon
@given(
    st.sampled_from(OPEN_BLOCKS),
    st.lists(st.sampled_from(ADVERSARIAL), max_size=2),
    st.lists(st.sampled_from(ADVERSARIAL), min_size=1, max_size=3),
    st.sampled_from(["", "x", "|", " |", "1", ")"]),
)
def test_every_line_is_read_in_time_linear_in_its_length(opened, head, filler, tail) -> None:
    """A line just under the cap, of runs that make a backtracking pattern quadratic: read in
    well under a second (a quadratic pattern takes minutes on it)."""
    unit = "".join(filler)
    line = "".join(head) + unit * ((MAX_LINE_CHARS - 40) // len(unit)) + tail
    started = time.perf_counter()
    with contextlib.suppress(MeasurementError):
        parse_log(opened + line + "\n" + iteration_line(1) + "\n")
    assert time.perf_counter() - started < 2.0


def test_a_line_over_the_cap_is_skipped_with_a_note() -> None:
    long = "    rank 0:" + " " * 150_000 + "1.0"
    parsed = parse_log(as_text([*clean_lines(), long]))
    assert parsed.timers == CLEAN.timers
    assert parsed.skipped_lines == 1
    assert f"longer than {MAX_LINE_CHARS:,} characters" in parsed.skipped_examples[0]


@pytest.mark.parametrize(
    "line",
    [
        "    rank {n}: 1.0",
        "[Rank {n}] (after 1 iterations) memory (MB) | allocated: 1 | max allocated: 1 | reserved:"
        " 1 | max reserved: 1",
        "[Rank 0] (after {n} iterations) memory (MB) | allocated: 1 | max allocated: 1 | reserved:"
        " 1 | max reserved: 1",
        " iteration {n}/ 10 | elapsed time per iteration (ms): 1.0 |",
    ],
)
def test_a_count_of_thousands_of_digits_is_a_skipped_line_not_a_traceback(line) -> None:
    """Python's int() refuses 4,300 digits: such a count matches no pattern of the parser."""
    text = as_text([*all_block(ALL_TIMES), line.format(n="9" * 5000)])
    parsed = parse_log(text)
    assert parsed.timers == parse_log(as_text(all_block(ALL_TIMES))).timers


@pytest.mark.parametrize("size", ["9" * 5000, "8x", "4/2", "1.5", "-2"])
def test_a_world_size_that_is_no_count_refuses_the_log_in_one_line(size) -> None:
    """The world line is what a run's declaration is checked against: a size of it that is no
    count (``8x`` is not 8) leaves nothing to check, so the log is refused, naming the line."""
    world = f"using world size: 8, data-parallel size: {size}, pipeline-model-parallel size: 4"
    with pytest.raises(MeasurementError, match=r"^log: line \d+: data-parallel size .* count"):
        parse_log(as_text([*all_block(ALL_TIMES), world]))


def test_megatrons_none_and_a_glued_name_end_a_world_size() -> None:
    world = (
        "using world size: 8, data-parallel size: 2, hierarchical context-parallel sizes: "
        "Nonetensor-model-parallel size: 1, context-parallel size: None, "
        "pipeline-model-parallel size: 4expert-model-parallel size: 2"
    )
    parsed = parse_log(as_text([*all_block(ALL_TIMES), world]))
    assert dict(parsed.world.sizes) == {"dp": 2, "tp": 1, "pp": 4, "ep": 2}


# Every number of a log goes through one strict reader (ray_layout.measure.log_numbers).

SEPARATED = [  # (where in clean_lines(), the value as printed, printed with separators)
    ("     rank  0: 1234.56", "1234.56", "1,234.56"),
    ("forward-backward .", "1236.25", "1,236.25"),  # the max block
    ("(1230.50, 1236.25)", "(1230.50, 1236.25)", "(1_230.50, 1,236.25)"),
    ("model-and-optimizer-setup", "(4100.00, 4125.50)", "(4,100.00, 4,125.50)"),
    ("iteration       10/", "(ms): 1234.5", "(ms): 1,234.5"),
    ("iteration       20/", "samples:         1280", "samples: 1,280"),
    ("[Rank 3] (after 1", "max allocated: 2469.12", "max allocated: 2,469.12"),
]


@pytest.mark.parametrize(("where", "plain", "separated"), SEPARATED)
def test_a_number_with_thousands_separators_reads_as_the_value_it_prints(
    where: str, plain: str, separated: str
) -> None:
    lines = clean_lines()
    at = next(i for i, line in enumerate(lines) if where in line and plain in line)
    lines[at] = lines[at].replace(plain, separated)
    assert parse_log(as_text(lines)) == CLEAN


def test_a_timer_printed_with_a_thousands_separator_is_not_its_first_digit() -> None:
    """``rank  1: 1,392.00`` was once stored as 1.0 ms: the pattern took any tail."""
    parsed = parse_log(
        as_text([*all_block({"forward-compute": {0: 1.0}}), "     rank  1: 1,392.00"])
    )
    assert [(r.rank, r.ms) for r in parsed.timers] == [(0, 1.0), (1, 1392.0)]
    line = "time (ms) | forward-compute: 1,392.00 | backward-compute: 2_784.50 |"
    assert [r.ms for r in parse_log(as_text([line])).timers] == [1392.0, 2784.5]


TAILED = [  # (where in clean_lines(), the number, why the line is dropped)
    ("     rank  0: 1234.56", "1234.56", "a timer entry whose value is no number"),
    ("     rank  0: 1234.56", "rank  0", "a timer entry whose value is no number"),
    ("forward-backward .", "1236.25", "a timer entry whose value is no number"),
    ("(1230.50, 1236.25)", "1230.50", "a timer entry whose value is no number"),
    ("(1230.50, 1236.25)", "1236.25", "a timer entry whose value is no number"),
    ("iteration       10/", "1234.5", "an iteration line cut short or with a value that is no"),
    ("iteration       10/", "      10", "an iteration line cut short or with a value that is no"),
    ("iteration       10/", "/      30", "an iteration line cut short or with a value that is no"),
    ("iteration       10/", "1.000000E-04", "an iteration line cut short or with a value that"),
    ("iteration       10/", "1.041234E+01", "an iteration line cut short or with a value that"),
    ("iteration       10/", "3.456", "an iteration line cut short or with a value that is no"),
    ("iteration       10/", "54.8", "an iteration line cut short or with a value that is no"),
    ("iteration       10/", "scale: 1.0", "an iteration line cut short or with a value that is no"),
    ("iteration       10/", "640", "an iteration line cut short or with a value that is no"),
    (
        "[Rank 3] (after 1",
        "2469.12",
        "a memory line without its rank, iteration and four sizes, each a number",
    ),
    (
        "[Rank 3] (after 1",
        "Rank 3",
        "a memory line without its rank, iteration and four sizes, each a number",
    ),
    (
        "[Rank 3] (after 1",
        "after 1",
        "a memory line without its rank, iteration and four sizes, each a number",
    ),
]


@pytest.mark.parametrize("tail", ["x", "ms", ",5", "%", ".0.0", "e", "١"])
@pytest.mark.parametrize(("where", "number", "why"), TAILED)
def test_a_number_with_any_tail_drops_its_line_and_counts_it(where, number, why, tail) -> None:
    lines = clean_lines()
    at = next(i for i, line in enumerate(lines) if where in line and number in line)
    lines[at] = lines[at].replace(number, number + tail, 1)
    parsed = parse_log(as_text(lines))
    assert parsed.skipped_lines == 1
    assert parsed.skipped_examples[0].startswith(f"line {at + 1}: ")
    assert why in parsed.skipped_examples[0]
    assert len(parsed.timers) + len(parsed.iterations) + len(parsed.memory) < (
        len(CLEAN.timers) + len(CLEAN.iterations) + len(CLEAN.memory)
    )


def test_a_one_line_block_with_an_entry_that_is_no_number_is_dropped_and_counted() -> None:
    lines = [
        iteration_line(10),
        "time (ms) | forward-compute: 193.77 | backward-compute: 402.34x | optimizer: 20.05",
        "time (ms) | forward-compute 193.77 |",
    ]
    parsed = parse_log(as_text(lines))
    assert parsed.timers == () and parsed.skipped_lines == 2
    assert "a one-line timer block with an entry no `name: number`" in parsed.skipped_examples[0]


# Values no run has, refused at the line with the value (nothing of the log is used).
REFUSED = [
    ("(ms): 1234.5 |", "(ms): 0.0 |", r"elapsed time per iteration is 0\.0 ms: no step"),
    ("iteration       20/      30", "iteration       31/      30", r"iteration 31 is past .* 30"),
    ("iteration       20/      30", "iteration        5/      30", r"iteration 5 follows .* 10"),
    ("     rank  3: 410.00", "     rank -3: 410.00", r"forward-compute of rank -3: .*negative"),
    ("[Rank 3] (after 1", "[Rank -3] (after 1", r"rank -3's memory: rank -3 is negative"),
    ("[Rank 3] (after 1", "[Rank 3] (after -1", r"rank 3's memory \(after iteration -1\) is"),
]


@pytest.mark.parametrize(("old", "new", "problem"), REFUSED)
def test_a_step_an_iteration_or_a_rank_no_run_has_refuses_the_log_naming_the_line(
    old: str, new: str, problem: str
) -> None:
    lines = clean_lines()
    at = next(i for i, line in enumerate(lines) if old in line)
    lines[at] = lines[at].replace(old, new)
    with pytest.raises(MeasurementError, match=rf"^run\.log: line {at + 1}: .*{problem}") as no:
        parse_log(as_text(lines), "run.log")
    assert str(no.value).endswith("; nothing of this log is used") and "\n" not in str(no.value)


def test_a_negative_rank_is_refused_wherever_a_block_holds_it() -> None:
    for lines in (["     rank -1: 1.00"], [*all_block(ALL_TIMES), "     rank -1: 1.00"]):
        text = as_text([memory_line(0, 1), "times across ranks (ms):", "  forward-compute:"])
        with pytest.raises(MeasurementError, match=r"rank -1 is negative"):
            parse_log(text + as_text(lines))


# Container runtimes' records around every line (ray_layout.measure.log_wrappers).


def test_a_kubernetes_cri_log_reads_as_the_plain_log() -> None:
    """``<time> stdout F <text>`` on every line, long lines split into ``P`` records: the
    timers are read, not lost to the prefix ("found no per-rank timers")."""
    stamp = "2026-12-05T10:31:07.123456789Z"
    records = []
    for index, line in enumerate(clean_lines()):
        stream = "stderr" if "iteration" in line else "stdout"
        if len(line) > 40:
            records.append(f"{stamp} {stream} P {line[:40]}")
            if index % 3 == 0:
                records.append(f"{stamp} {'stdout' if stream == 'stderr' else 'stderr'} F noise")
            line = line[40:]
        records.append(f"{stamp} {stream} F {line}")
    assert parse_log(as_text(records)) == CLEAN


def test_a_docker_json_file_log_reads_as_the_plain_log() -> None:
    records = [
        json.dumps({"log": line + "\n", "stream": "stdout", "time": "2026-12-05T10:31:07Z"})
        for line in clean_lines()
    ]
    assert parse_log(as_text(records)) == CLEAN


def test_a_cri_record_cut_mid_line_is_skipped_as_a_cut_line() -> None:
    stamp = "2026-12-05T10:31:07Z"
    records = [f"{stamp} stdout F {line}" for line in clean_lines()]
    parsed = parse_log(as_text(records) + f"{stamp} stdout P      rank  3: 41\n")
    assert parsed.timers == CLEAN.timers and parsed.skipped_lines == 1
    assert "cut off: the log ends without a newline" in parsed.skipped_examples[0]


_PRINTED_AS = ["{:.2f}", "{:,.2f}", "{:_.2f}", "{:.1f}", "{:,.1f}", "{:.6E}", "{!r}"]
_IN_LINE = {  # a record holding one value, and how to find that value among the parsed records
    "all": (
        lambda v: [*all_block({"f": {0: 1.0}}), f"     rank  1: {v}"],
        lambda p: p.timers[-1].ms,
    ),
    "max": (
        lambda v: [f"max time across ranks (ms):\n    f .......: {v}"],
        lambda p: p.timers[0].ms,
    ),
    "minmax": (
        lambda v: [f"(min, max) time across ranks (ms):\n    f .......: ({v}, {v})"],
        lambda p: p.timers[1].ms,
    ),
    "one-line": (lambda v: [f"time (ms) | f: 1.00 | g: {v} |"], lambda p: p.timers[1].ms),
    "step": (
        lambda v: [f" iteration 3/ 9 | elapsed time per iteration (ms): {v} |"],
        lambda p: p.iterations[0].elapsed_ms,
    ),
    "memory": (
        lambda v: [memory_line(0, 1).replace("| reserved: 2500.00", f"| reserved: {v}")],
        lambda p: p.memory[0].reserved_mb,
    ),
}


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(sorted(_IN_LINE)),
    st.floats(min_value=0.01, max_value=1.6e7),
    st.sampled_from(_PRINTED_AS),
    st.one_of(st.just(""), st.sampled_from(["x", "ms", ",5", "%", "e", "0,0", "_1", ")"])),
)
def test_every_value_of_every_record_is_read_whole(where, value, form, junk) -> None:
    """Any value printed as Megatron or a fork prints it reads back to the value it prints, in
    every record; with anything appended, its line is dropped and counted, never read."""
    write, read = _IN_LINE[where]
    printed = form.format(value)
    number = float(printed.replace(",", "").replace("_", ""))
    assume(where != "step" or number > 0)  # a step of no time is refused: tested on its own
    whole = parse_log(as_text(write(printed)))
    assert read(whole) == number
    assert whole.skipped_lines == 0
    if not junk:
        return
    try:
        parsed = parse_log(as_text(write(printed + junk)))
    except MeasurementError as error:  # the dropped line was the log's only record
        assert "could be read: 1 line(s) that look like them were dropped" in str(error)
        return
    assert parsed.skipped_lines == 1
    assert len(parsed.timers) + len(parsed.memory) < len(whole.timers) + len(whole.memory)
