"""What a Megatron log holds: the timer names, the records a log's lines become, the parsed log
and which of its timer blocks are steady training.

``ray_layout.measure.logs`` reads a log into these; the fit, ingest and the emulator's tests read
them.  Values are kept exactly as Megatron printed them, quirks included (see
:func:`steady_intervals`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from ray_layout.measure.log_world import LogWorld
from ray_layout.model.fields import MAX_WORLD_SIZE

# ``training_log``'s timers_to_log: --timing-log-level 1, then what level 2 adds.
LEVEL1_TIMERS = (
    "forward-backward",
    "layernorm-grads-all-reduce",
    "embedding-grads-all-reduce",
    "all-grads-sync",
    "params-all-gather",
    "optimizer-copy-to-main-grad",
    "optimizer-unscale-and-check-inf",
    "optimizer-clip-main-grad",
    "optimizer-count-zeros",
    "optimizer-inner-step",
    "optimizer-copy-main-to-model-params",
    "optimizer",
)
LEVEL2_TIMERS = (
    "batch-generator",
    "forward-compute",
    "backward-compute",
    "forward-recv",
    "forward-send",
    "backward-recv",
    "backward-send",
    "forward-send-forward-recv",
    "forward-send-backward-recv",
    "backward-send-forward-recv",
    "backward-send-backward-recv",
    "forward-backward-send-forward-backward-recv",
)
TIMER_NAMES = LEVEL1_TIMERS + LEVEL2_TIMERS
# Blocks of these alone are start-up, evaluation or checkpoint timing, never a training step's.
NON_TRAINING_TIMERS = frozenset(
    {
        "model-and-optimizer-setup",
        "train/valid/test-data-iterators-setup",
        "load-checkpoint",
        "save-checkpoint",
        "evaluate",
    }
)

SKIPPED_EXAMPLES = 5  # how many skipped lines ParsedLog keeps to show
# Training blocks dropped before any fit: the first shows one iteration / --log-interval, the
# second still holds that first, slow iteration (see steady_intervals).
WARMUP_INTERVALS = 2
MIN_STEADY_INTERVALS = 3  # after the WARMUP_INTERVALS the fit drops: enough for a mean and a spread
# A profiling run of fewer iterations (one timer block each) is one the fit refuses.
MIN_PROFILE_ITERATIONS = WARMUP_INTERVALS + MIN_STEADY_INTERVALS
FIT_NEEDS = (
    f"the fit drops the first {WARMUP_INTERVALS} timer blocks and needs {MIN_STEADY_INTERVALS} more"
)


# What a run's numbers can be; a log with a value outside is refused (no timer is NaN, negative
# or a day long, no GPU holds 16 TiB).  Megatron prints per-iteration values (accumulated ms /
# --log-interval).  Losses and the grad norm may be NaN or infinite in a diverging run: they
# are kept as printed and never fitted.
MAX_LOGGED_MS = 86_400_000.0  # a day per iteration
MAX_MEMORY_MB = 2.0**24  # 16 TiB on one GPU
MAX_TFLOPS = 1e5  # per GPU: a hundred times any GPU's peak
MAX_LOSS_SCALE = 2.0**128
MAX_COUNT = 10**15  # iterations, samples, batch sizes: far above any run, inside int64
_LIMITS = {"ms": (MAX_LOGGED_MS, "a day"), "MiB": (MAX_MEMORY_MB, "16 TiB")}


def out_of_range(what: str, value: float, unit: str = "", upper: float | None = None) -> str | None:
    """Why ``value`` cannot be ``what`` (a NaN, an infinity, a negative, above the bound of its
    unit or ``upper``), or None when it can."""
    bound, label = _LIMITS.get(unit, (math.inf, "")) if upper is None else (upper, f"{upper:g}")
    printed = f"{value!r} {unit}".rstrip()
    if math.isnan(value):
        return f"{what} is {printed}: not a number"
    if value < 0:
        return f"{what} is {printed}: negative"
    if value > bound:
        return f"{what} is {printed}: " + ("infinite" if math.isinf(value) else f"over {label}")
    return None


def impossible_rank(of: str, rank: int | None) -> str | None:
    """Why ``rank`` (None: the record names none) is no GPU of a world, or None."""
    if rank is not None and rank < 0:
        return f"{of}: rank {rank} is negative"
    if rank is not None and rank >= MAX_WORLD_SIZE:
        return f"{of}: rank above the largest world ({MAX_WORLD_SIZE:,} GPUs)"
    return None


def impossible_timer(
    timer: str, rank: int | None, values: tuple[tuple[str, float], ...]
) -> str | None:
    """Why a timer entry's values or rank cannot be a run's, or None."""
    of = f"timer {timer}" + ("" if rank is None else f" of rank {rank}")
    ranges = (out_of_range(of, ms, "ms") for _, ms in values)
    return _first([impossible_rank(of, rank), *ranges])


def _first(problems: list[str | None]) -> str | None:
    return next((problem for problem in problems if problem is not None), None)


def impossible_iteration(record: IterationRecord) -> str | None:
    """Why an iteration line's step time, throughput, loss scale or counts cannot be a run's:
    out of range, a step of no time, or an iteration past the run's ``--train-iters``."""
    counts = {
        "the iteration": record.iteration,
        "the train iterations": record.train_iters,
        "consumed samples": record.consumed_samples,
        "the global batch size": record.global_batch_size,
        "skipped iterations": record.skipped_iterations,
        "nan iterations": record.nan_iterations,
    }
    floats = {
        "the elapsed time per iteration": (record.elapsed_ms, "ms", None),
        "the throughput per GPU (TFLOP/s)": (record.throughput_tflops, "", MAX_TFLOPS),
        "the loss scale": (record.loss_scale, "", MAX_LOSS_SCALE),
    }
    return _first(
        [
            *(
                out_of_range(what, float(count), upper=MAX_COUNT)
                for what, count in counts.items()
                if count is not None
            ),
            *(
                out_of_range(what, value, unit, upper)
                for what, (value, unit, upper) in floats.items()
                if value is not None
            ),
            f"the elapsed time per iteration is {record.elapsed_ms!r} ms: no step takes no time"
            if record.elapsed_ms == 0
            else None,
            f"iteration {record.iteration} is past the run's --train-iters {record.train_iters}"
            if record.iteration > record.train_iters
            else None,
        ]
    )


def impossible_memory(record: MemoryRecord) -> str | None:
    """Why a memory line's rank, iteration or sizes cannot be a run's, or None."""
    of = f"rank {record.rank}'s memory"
    if (problem := impossible_rank(of, record.rank)) is not None:
        return problem
    sizes = {
        "allocated": record.allocated_mb,
        "max allocated": record.max_allocated_mb,
        "reserved": record.reserved_mb,
        "max reserved": record.max_reserved_mb,
    }
    after = f"{of} (after iteration {record.iteration})"
    return _first(
        [
            out_of_range(after, float(record.iteration), upper=MAX_COUNT),
            *(out_of_range(f"{of} ({name})", mb, "MiB") for name, mb in sizes.items()),
        ]
    )


@dataclass(frozen=True)
class TimerRecord:
    """One value of one timer block.

    ``interval`` numbers the blocks in log order from 0; ``iteration`` is the iteration line
    printed before the block (None before the first).  ``stat`` is ``"rank"`` under
    ``--timing-log-option all`` (one record per rank that reported a non-zero value), ``"max"``
    under ``max``, ``"min"``/``"max"`` under ``minmax`` (``rank`` None: across all ranks) and
    ``"last"`` in the one-line format of Megatron before core (the last rank's value, rank
    unknown to the log).
    ``ms`` is Megatron's printed value: accumulated milliseconds / ``--log-interval``.
    ``line`` is where the log printed it (None when read back from the store), for messages
    only: two records of the same values are equal wherever they were printed.
    """

    interval: int
    iteration: int | None
    rank: int | None
    timer: str
    ms: float
    stat: str
    line: int | None = field(default=None, compare=False)


@dataclass(frozen=True)
class IterationRecord:
    """``training_log``'s iteration line; fields Megatron prints only when set are None if absent.

    ``losses`` holds every ``… loss …`` field in print order (``lm loss``, ``mtp_1 loss``,
    ``load_balancing_loss``…), never ``loss scale``.  Fields this record has no place for
    (``skipped samples``, ``num zeros``, ``params norm``, energy and power) are ignored, and so
    are segments that are not ``key: value`` at all (counted in ``unknown_segments``).
    """

    iteration: int
    train_iters: int
    consumed_samples: int | None
    elapsed_ms: float
    throughput_tflops: float | None
    learning_rate: float | None
    global_batch_size: int | None
    losses: Mapping[str, float] = field(hash=False)
    loss_scale: float | None
    grad_norm: float | None
    skipped_iterations: int | None
    nan_iterations: int | None
    unknown_segments: int = 0  # segments that are not ``key: value`` (a fork's own fields)

    def __post_init__(self) -> None:
        object.__setattr__(self, "losses", MappingProxyType(dict(self.losses)))


@dataclass(frozen=True)
class MemoryRecord:
    """``report_memory``'s ``[Rank N] (after K iterations) memory (MB)`` line, in MiB."""

    rank: int
    iteration: int
    allocated_mb: float
    max_allocated_mb: float
    reserved_mb: float
    max_reserved_mb: float


@dataclass(frozen=True)
class ParsedLog:
    """Everything a log held, in log order, and how many lines looked Megatron's but did not parse.

    ``skipped_examples`` shows the first few of those with their line numbers and why each was
    dropped.  ``unknown_segments`` counts iteration-line segments that were not ``key: value``;
    ``split_lines`` the physical lines that held records of several writers glued together.

    ``log_interval_hint`` is ``--log-interval`` read off the iteration numbers: every iteration
    logged after the first is a multiple of it, and two consecutive ones pin it down (their GCD);
    None with fewer than two.
    """

    timers: tuple[TimerRecord, ...]
    iterations: tuple[IterationRecord, ...]
    memory: tuple[MemoryRecord, ...]
    skipped_lines: int
    skipped_examples: tuple[str, ...]  # the first SKIPPED_EXAMPLES, as "line N: '…' (why)"
    log_interval_hint: int | None
    unknown_segments: int = 0
    split_lines: int = 0
    world: LogWorld | None = None  # the sizes rank 0 states at start-up, when its log is here
    # the arguments rank 0 prints at start-up (name -> value as printed), when its log is here
    arguments: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}), hash=False)

    @property
    def intervals(self) -> tuple[int, ...]:
        """The timer blocks that hold at least one record, in log order."""
        return tuple(sorted({record.interval for record in self.timers}))

    @property
    def training_intervals(self) -> tuple[int, ...]:
        """The blocks ``training_log`` printed: the first block after each iteration line that
        holds a timer outside NON_TRAINING_TIMERS.

        Start-up blocks (``model-and-optimizer-setup``, ``load-checkpoint``) come before any
        iteration line; ``evaluate`` and ``save-checkpoint`` blocks follow the training block of
        the same iteration, or stand alone when the run logged no training timers, and are never
        taken for one.  Assumes one run per log: a restart appended to the same file keeps the
        previous run's iteration until its own first iteration line.
        """
        iteration_of = {record.interval: record.iteration for record in self.timers}
        names: dict[int, set[str]] = {}
        for record in self.timers:
            names.setdefault(record.interval, set()).add(record.timer)
        chosen, previous = [], None
        for interval in self.intervals:
            if names[interval] <= NON_TRAINING_TIMERS:
                continue
            iteration = iteration_of[interval]
            if iteration is not None and iteration != previous:
                chosen.append(interval)
            previous = iteration
        return tuple(chosen)

    @property
    def unknown_timers(self) -> tuple[str, ...]:
        """Timer names outside TIMER_NAMES, first seen first: kept, but worth a look."""
        known = set(TIMER_NAMES)
        return tuple(dict.fromkeys(r.timer for r in self.timers if r.timer not in known))


def steady_intervals(parsed: ParsedLog, warmup: int = WARMUP_INTERVALS) -> tuple[int, ...]:
    """The training intervals left after dropping the first ``warmup`` (WARMUP_INTERVALS, what
    the fit and the log checks drop, unless told otherwise).

    Megatron logs the first iteration without resetting its timers, yet divides them by
    ``--log-interval``: that block shows one iteration's time / log_interval, far too small.  The
    next block then holds log_interval iterations including that first, slow one (allocator and
    kernel warm-up), so both go.  The printed values are left as they are.
    """
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, not {warmup}")
    return parsed.training_intervals[warmup:]
