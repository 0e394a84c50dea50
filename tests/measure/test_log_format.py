"""Megatron's log lines as ``log_format`` writes them: the bytes megatron-core and Megatron-LM
print, and what ``logs`` reads back from them."""

from __future__ import annotations

import inspect
import re
from datetime import datetime
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ray_layout.measure.log_format import (
    P2P_TIMER_OF_CALL,
    TIMER_LOGGER_PREFIX,
    iteration_line,
    memory_line,
    timers_all,
    timers_max,
    timers_minmax,
    world_line,
)
from ray_layout.measure.log_records import LEVEL2_TIMERS, MemoryRecord, TimerRecord
from ray_layout.measure.log_world import parse_world
from ray_layout.measure.logs import parse_iteration_line, parse_log
from tests.helpers.measure_timers_oracle import ORACLE_MS, megatron_timers_string
from tests.helpers.megatron_oracle import MEGATRON_CPU_WARNINGS
from tests.helpers.paths import SHARED_DATA

MEGATRON = [pytest.mark.megatron, *(pytest.mark.filterwarnings(w) for w in MEGATRON_CPU_WARNINGS)]
REAL_LOGS = SHARED_DATA / "real_megatron_logs"
# Megatron-LM main of March 2026 (SOURCES.md there): the newest upstream lines published
REAL_ITERATIONS = REAL_LOGS / "09a_slurm_aws_2026_iter.log"
REAL_TIMERS = REAL_LOGS / "09b_slurm_aws_2026_timers.log"

# Timer names as Megatron's are: lower-case words joined by '-'
NAMES = st.from_regex(r"[a-z][a-z-]{0,59}", fullmatch=True)
MS = st.floats(min_value=0.01, max_value=1e6)


def printed(value: float, spec: str) -> float:
    """``value`` as Megatron prints it with ``spec``, read back."""
    return float(format(value, spec))


def real_lines(path: Path) -> list[str]:
    if not path.exists():
        pytest.skip(f"{path} is not on this machine (the shared real-log fixtures)")
    return path.read_text().splitlines()


@pytest.mark.parametrize("option", ["all", "minmax", "max"])
def test_log_format_writes_the_bytes_megatron_core_writes(option, monkeypatch) -> None:
    """What the emulated Megatron and the synthetic runs print is Megatron's own text."""
    text = megatron_timers_string(option, monkeypatch)
    records = parse_log(text + "\n").timers
    if option == "all":
        by_rank: dict[str, dict[int, float]] = {name: {} for name in ORACLE_MS}
        for r in records:
            by_rank[r.timer][r.rank] = r.ms
        written = timers_all(by_rank)
    elif option == "max":
        written = timers_max({r.timer: r.ms for r in records})
    else:
        low = {r.timer: r.ms for r in records if r.stat == "min"}
        high = {r.timer: r.ms for r in records if r.stat == "max"}
        written = timers_minmax({name: (low[name], high[name]) for name in low})
    assert written == text


@pytest.mark.parametrize("call", [pytest.param(c, marks=MEGATRON) for c in P2P_TIMER_OF_CALL])
def test_each_p2p_call_runs_under_the_timer_megatron_core_starts(call: str) -> None:
    """The emulator files its p2p time under the timer megatron-core's P2PCommunicator starts
    in that call, one ``--timing-log-level 2`` logs."""
    p2p = pytest.importorskip("megatron.core.pipeline_parallel.p2p_communication")
    source = inspect.getsource(getattr(p2p.P2PCommunicator, call))
    assert re.findall(r"timers\('([^']+)', log_level=2\)", source) == [P2P_TIMER_OF_CALL[call]]
    assert P2P_TIMER_OF_CALL[call] in LEVEL2_TIMERS


def test_the_iteration_line_is_the_one_megatron_lm_printed() -> None:
    """Rewritten from its own fields and time stamp, the real line comes back byte for byte."""
    (line,) = [line for line in real_lines(REAL_ITERATIONS) if " iteration " in line]
    record = parse_iteration_line(line)
    stamp = datetime.strptime(line.split("]")[0].strip(" ["), "%Y-%m-%d %H:%M:%S.%f")
    assert record is not None and record.throughput_tflops is None
    written = iteration_line(
        record.iteration,
        record.train_iters,
        record.consumed_samples,
        record.elapsed_ms,
        record.global_batch_size,
        record.losses,
        learning_rate=record.learning_rate,
        loss_scale=record.loss_scale,
        grad_norm=record.grad_norm,
        when=stamp,
    )
    assert written == line.rstrip()


def test_memory_lines_are_the_ones_megatron_lm_printed() -> None:
    """Every real memory line alone on its line (not glued to another rank's) comes back."""
    lines = [line for line in real_lines(REAL_ITERATIONS) if line.count("[Rank ") == 1]
    assert len(lines) > 10
    for line in lines:
        (record,) = parse_log(line + "\n").memory
        fields = (record.allocated_mb, record.max_allocated_mb)
        sizes = (*fields, record.reserved_mb, record.max_reserved_mb)
        assert memory_line(record.rank, record.iteration, *sizes) == line.rstrip()


def test_a_minmax_block_with_its_logger_prefix_is_the_one_megatron_lm_printed() -> None:
    lines = real_lines(REAL_TIMERS)
    start = next(i for i, line in enumerate(lines) if "across ranks" in line)
    block = lines[start : start + 3]
    records = parse_log("\n".join(block) + "\n").timers
    low = {r.timer: r.ms for r in records if r.stat == "min"}
    high = {r.timer: r.ms for r in records if r.stat == "max"}
    written = timers_minmax({t: (low[t], high[t]) for t in low}, prefix=TIMER_LOGGER_PREFIX)
    assert written == "\n".join(block)


def test_the_all_option_leaves_out_zero_values_and_timers_without_one() -> None:
    """Megatron prints a rank only where its timer ran: the first stage never receives."""
    text = timers_all({"forward-recv": {2: 3.0, 1: 0.0, 0: 5.0}, "forward-send": {0: 0.0}})
    assert (
        text == "times across ranks (ms):\n  forward-recv:\n     rank  0: 5.00\n     rank  2: 3.00"
    )
    assert timers_all({}) == "times across ranks (ms):"


def test_a_prefix_goes_on_the_header_alone() -> None:
    """Python logging prefixes the first line of a message, not the lines after it."""
    for text in (
        timers_all({"optimizer": {0: 1.0}}, prefix=TIMER_LOGGER_PREFIX),
        timers_max({"optimizer": 1.0}, prefix=TIMER_LOGGER_PREFIX),
        timers_minmax({"optimizer": (1.0, 2.0)}, prefix=TIMER_LOGGER_PREFIX),
    ):
        first, *rest = text.splitlines()
        assert first.startswith(TIMER_LOGGER_PREFIX) and first.endswith("across ranks (ms):")
        assert rest and not any(TIMER_LOGGER_PREFIX in line for line in rest)


@given(st.dictionaries(NAMES, st.dictionaries(st.integers(0, 99), MS, min_size=1), min_size=1))
def test_every_all_block_reads_back(ms_by_timer: dict[str, dict[int, float]]) -> None:
    parsed = parse_log(timers_all(ms_by_timer) + "\n")
    expected = tuple(
        TimerRecord(0, None, rank, name, printed(ms, ".2f"), "rank")
        for name, by_rank in ms_by_timer.items()
        for rank, ms in sorted(by_rank.items())
    )
    assert parsed.timers == expected


@given(st.dictionaries(NAMES, MS, min_size=1, max_size=6))
def test_every_max_block_reads_back(ms_by_timer: dict[str, float]) -> None:
    parsed = parse_log(timers_max(ms_by_timer) + "\n")
    expected = tuple(
        TimerRecord(0, None, None, name, printed(ms, ".2f"), "max")
        for name, ms in ms_by_timer.items()
    )
    assert parsed.timers == expected


@given(st.dictionaries(NAMES, st.tuples(MS, MS), min_size=1, max_size=6))
def test_every_minmax_block_reads_back(ms_by_timer: dict[str, tuple[float, float]]) -> None:
    parsed = parse_log(timers_minmax(ms_by_timer) + "\n")
    expected = tuple(
        TimerRecord(0, None, None, name, printed(ms, ".2f"), stat)
        for name, pair in ms_by_timer.items()
        for stat, ms in zip(("min", "max"), pair, strict=True)
    )
    assert parsed.timers == expected


LOSS_NAMES = st.sampled_from(["lm loss", "mtp_1 loss", "mtp_2 loss", "load_balancing_loss"])
FINITE = st.floats(allow_nan=False, allow_infinity=False, min_value=-1e30, max_value=1e30)
POSITIVE = st.floats(min_value=0.0, max_value=1e7)


@given(
    iteration=st.integers(0, 10**8),
    more=st.integers(0, 10**8),
    consumed=st.integers(0, 10**12),
    elapsed_ms=POSITIVE,
    batch=st.integers(1, 10**6),
    losses=st.dictionaries(LOSS_NAMES, FINITE, max_size=4),
    learning_rate=st.floats(min_value=0.0, max_value=1.0),
    throughput=st.none() | POSITIVE,
    loss_scale=POSITIVE,
    grad_norm=st.none() | POSITIVE,
)
def test_every_iteration_line_reads_back(
    iteration: int,
    more: int,
    consumed: int,
    elapsed_ms: float,
    batch: int,
    losses: dict[str, float],
    learning_rate: float,
    throughput: float | None,
    loss_scale: float,
    grad_norm: float | None,
) -> None:
    line = iteration_line(
        iteration,
        iteration + more,
        consumed,
        elapsed_ms,
        batch,
        losses,
        learning_rate=learning_rate,
        throughput_tflops=throughput,
        loss_scale=loss_scale,
        grad_norm=grad_norm,
    )
    record = parse_iteration_line(line)
    assert record is not None
    assert (record.iteration, record.train_iters) == (iteration, iteration + more)
    assert (record.consumed_samples, record.global_batch_size) == (consumed, batch)
    assert record.elapsed_ms == printed(elapsed_ms, ".1f")
    assert record.learning_rate == printed(learning_rate, ".6E")
    assert dict(record.losses) == {name: printed(v, ".6E") for name, v in losses.items()}
    assert list(record.losses) == list(losses)
    assert record.loss_scale == printed(loss_scale, ".1f")
    assert record.throughput_tflops == (None if throughput is None else printed(throughput, ".1f"))
    assert record.grad_norm == (None if grad_norm is None else printed(grad_norm, ".3f"))
    assert (record.skipped_iterations, record.nan_iterations, record.unknown_segments) == (0, 0, 0)


@given(st.integers(0, 10**5), st.integers(0, 10**8), st.lists(POSITIVE, min_size=4, max_size=4))
def test_every_memory_line_reads_back(rank: int, iteration: int, sizes: list[float]) -> None:
    (record,) = parse_log(memory_line(rank, iteration, *sizes) + "\n").memory
    assert record == MemoryRecord(rank, iteration, *(printed(mb, ".2f") for mb in sizes))


SIZE = st.integers(1, 4096)


@given(SIZE, SIZE, SIZE, SIZE, SIZE)
def test_every_world_line_reads_back(world: int, dp: int, cp: int, tp: int, pp: int) -> None:
    stated = parse_world("starting\n" + world_line(world, dp, cp, tp, pp) + "\n")
    assert stated is not None and (stated.world_size, stated.line) == (world, 2)
    assert dict(stated.sizes) == {"dp": dp, "cp": cp, "tp": tp, "pp": pp}
