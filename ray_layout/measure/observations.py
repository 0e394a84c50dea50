"""A profiling run as the fit sees it: timers per steady interval and PP rank, from a log or
the store."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ray_layout.errors import ConfigError, MeasurementError
from ray_layout.measure.log_records import WARMUP_INTERVALS, MemoryRecord, ParsedLog, TimerRecord
from ray_layout.model.layout import Layout
from ray_layout.model.spec import ParallelConfig

BLOCKING_ONLY_TIMER = "forward-backward-send-forward-backward-recv"

STEP_WARMUP = 3  # iterations whose step time carries start-up work (allocator, first batch)


@dataclass(frozen=True)
class RunObservation:
    """One profiling run, reduced to what the fit needs: per steady interval and PP rank."""

    name: str
    layout: Layout
    num_microbatches: int
    forward_ms: np.ndarray  # (intervals, PP) forward-compute per iteration, peers averaged
    backward_ms: np.ndarray  # (intervals, PP)
    timers: dict[str, np.ndarray] = field(default_factory=dict)  # other timers, (intervals, PP)
    max_allocated_mb: np.ndarray | None = None  # (PP,) peak allocated memory, NaN where unseen
    step_ms: float | None = None  # mean step time over the steady iterations, when logged
    parallel: ParallelConfig | None = None  # the run's own sizes, when known

    @property
    def overlapped_p2p(self) -> bool:
        """Whether an interleaved run overlapped its p2p (Megatron's default there): its
        timers lack the combined send/receive call, which only the blocking schedule makes."""
        return self.layout.vpp > 1 and BLOCKING_ONLY_TIMER not in self.timers


def unmeasurable(timers: Sequence[TimerRecord]) -> str | None:
    """Why no unit cost can come from these timers (none per rank, or no forward-compute), or
    None: such a log is neither fitted nor stored."""
    pooled = next((record for record in timers if record.rank is None), None)
    if pooled is not None:
        return (
            f"the timers hold one {pooled.stat!r} value across ranks, not each rank's "
            "(--timing-log-option max/minmax, or Megatron's older one-line format): they time "
            "the slowest rank, not each PP stage, so no unit cost can be told apart; profile "
            "with --timing-log-level 2 --timing-log-option all"
        )
    if not any(record.timer == "forward-compute" for record in timers):
        found = ", ".join(sorted({record.timer for record in timers})) or "no per-rank timers"
        return (
            f"no timer block holds forward-compute (found {found}); profile with "
            "--timing-log-level 2 --timing-log-option all"
        )
    return None


def observation_from_log(
    name: str,
    parsed: ParsedLog,
    layout: Layout,
    parallel: ParallelConfig,
    num_microbatches: int,
    warmup_intervals: int = WARMUP_INTERVALS,
) -> RunObservation:
    """A run's timers per steady interval and PP rank, from a parsed log."""
    steps = [record.elapsed_ms for record in parsed.iterations]
    return observation_from_records(
        name,
        parsed.timers,
        parsed.memory,
        layout,
        parallel,
        num_microbatches,
        warmup_intervals,
        steps,
    )


def observation_from_records(
    name: str,
    timer_records: Iterable[TimerRecord],
    memory_records: Iterable[MemoryRecord],
    layout: Layout,
    parallel: ParallelConfig,
    num_microbatches: int,
    warmup_intervals: int = WARMUP_INTERVALS,
    steps_ms: Sequence[float] = (),
) -> RunObservation:
    """A run's timers per steady interval and PP rank, TP/CP/DP peers averaged, and its mean
    step time without the first ``STEP_WARMUP`` iterations (``steps_ms`` in iteration order).

    Megatron's global rank order is tp-cp-ep-dp-pp with PP outermost, so PP rank = rank //
    (world / PP).  The first WARMUP_INTERVALS logged intervals are dropped: Megatron does not
    reset the timers at the first, so the second still carries the first iteration (see
    ``log_records.steady_intervals``).  Only blocks with ``forward-compute`` count: start-up
    timer blocks carry none.
    """
    per_stage = parallel.world_size // layout.pp
    by_interval: dict[int, dict[str, np.ndarray]] = {}
    counts: dict[int, dict[str, np.ndarray]] = {}
    timer_records = list(timer_records)
    problem = unmeasurable(timer_records)
    if problem is not None:
        raise MeasurementError(f"{name}: {problem}")
    for record in timer_records:
        pp_rank = record.rank // per_stage
        if pp_rank >= layout.pp:
            raise ConfigError(
                f"{name}: rank {record.rank} is outside a world of {parallel.world_size} "
                f"(TP·CP·DP·PP); check the run's parallel sizes"
            )
        sums = by_interval.setdefault(record.interval, {})
        seen = counts.setdefault(record.interval, {})
        sums.setdefault(record.timer, np.zeros(layout.pp))[pp_rank] += record.ms
        seen.setdefault(record.timer, np.zeros(layout.pp))[pp_rank] += 1
    compute = [i for i in sorted(by_interval) if "forward-compute" in by_interval[i]]
    steady = compute[warmup_intervals:]
    if not steady:
        raise MeasurementError(
            f"{name}: no steady timer interval (found {len(compute)} with forward-compute, the "
            f"first {warmup_intervals} dropped); run more iterations with --log-interval 1"
        )

    def table(timer: str) -> np.ndarray:
        rows = []
        for interval in steady:
            total = by_interval[interval].get(timer, np.zeros(layout.pp))
            seen = counts[interval].get(timer, np.zeros(layout.pp))
            rows.append(np.divide(total, seen, out=np.zeros(layout.pp), where=seen > 0))
        return np.array(rows)

    timers = {t: table(t) for t in {t for i in steady for t in by_interval[i]}}
    memory = np.full(layout.pp, np.nan)
    for record in memory_records:
        pp_rank = record.rank // per_stage
        if pp_rank < layout.pp:
            memory[pp_rank] = np.fmax(memory[pp_rank], record.max_allocated_mb)
    return RunObservation(
        name=name,
        layout=layout,
        num_microbatches=num_microbatches,
        forward_ms=timers.pop("forward-compute"),
        backward_ms=timers.pop("backward-compute", np.zeros((len(steady), layout.pp))),
        timers=timers,
        max_allocated_mb=memory,
        step_ms=float(np.mean(steps_ms[STEP_WARMUP:])) if len(steps_ms) > STEP_WARMUP else None,
        parallel=parallel,
    )
