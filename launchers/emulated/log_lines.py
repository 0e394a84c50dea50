"""What an emulated rank prints, in Megatron's formats (``ray_layout.measure.log_format``):
its timers and timer blocks, iteration lines and memory lines."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager

from launchers.emulated.config import RunConfig
from launchers.emulated.rank_costs import RESERVED_SLACK
from ray_layout.measure.log_format import (
    TIMER_LOGGER_PREFIX,
    iteration_line,
    memory_line,
    timers_all,
    timers_max,
    timers_minmax,
)
from ray_layout.measure.log_records import LEVEL1_TIMERS, LEVEL2_TIMERS
from ray_layout.model.fields import ModelSpec
from ray_layout.model.sizing import training_flops_per_iteration
from search.memory import StageMemory

# training_log's timers_to_log order: forward-backward, compute, the level-2 p2p timers, then
# the rest of level 1 (LEVEL1_TIMERS and LEVEL2_TIMERS list the same names by level).
COMPUTE_TIMERS = ("forward-compute", "backward-compute")
TIMERS_TO_LOG = (
    LEVEL1_TIMERS[0],
    *COMPUTE_TIMERS,
    *(name for name in LEVEL2_TIMERS if name not in COMPUTE_TIMERS),
    *LEVEL1_TIMERS[1:],
)
_LEVEL1 = frozenset(LEVEL1_TIMERS)


class Timers:
    """Megatron's timers on one rank: seconds accumulated per name until reset, read from
    ``now`` (the emulated clock's scheduled time, so real overhead stays out of them)."""

    def __init__(self, now: Callable[[], float]) -> None:
        self.now = now
        self.seconds: defaultdict[str, float] = defaultdict(float)

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        start = self.now()
        try:
            yield
        finally:
            self.seconds[name] += self.now() - start


def timer_block(
    gathered: Sequence[Mapping[str, float]],
    option: str,
    level: int,
    normalizer: float,
) -> str | None:
    """Megatron's timer block over every rank's seconds, each divided by ``normalizer`` seconds
    (log interval x time scale / 1000): ``max`` and ``minmax`` look only at ranks with a value;
    None when nothing was timed, as Megatron prints nothing then."""
    names = [n for n in TIMERS_TO_LOG if level >= (1 if n in _LEVEL1 else 2)]
    ms = {n: [seconds.get(n, 0.0) / normalizer for seconds in gathered] for n in names}
    if option == "all":
        if not any(value > 0 for values in ms.values() for value in values):
            return None
        return timers_all({n: dict(enumerate(v)) for n, v in ms.items()}, TIMER_LOGGER_PREFIX)
    timed = {n: [value for value in values if value > 0] for n, values in ms.items()}
    timed = {n: values for n, values in timed.items() if values}
    if not timed:
        return None
    if option == "max":
        return timers_max({n: max(v) for n, v in timed.items()}, TIMER_LOGGER_PREFIX)
    return timers_minmax({n: (min(v), max(v)) for n, v in timed.items()}, TIMER_LOGGER_PREFIX)


def _losses(model: ModelSpec, iteration: int) -> dict[str, float]:
    """Falling losses under Megatron's names (``lm loss``, ``mtp_1 loss``...); the values mean
    nothing."""
    lm = 11.0 / (1 + 0.01 * iteration)
    return {"lm loss": lm} | {
        f"mtp_{d} loss": lm * (1 + 0.01 * d) for d in range(1, model.mtp_num_layers + 1)
    }


def iteration_report(config: RunConfig, iteration: int, elapsed_ms: float, world_size: int) -> str:
    """Megatron's iteration line for ``iteration``, ``elapsed_ms`` per iteration."""
    batch = config.global_batch_size
    throughput = None
    if config.log_throughput:
        flops = training_flops_per_iteration(config.model, batch)
        throughput = flops / (elapsed_ms / 1e3 * world_size * 1e12)
    return iteration_line(
        iteration,
        config.train_iters,
        iteration * batch,
        elapsed_ms,
        batch,
        _losses(config.model, iteration),
        learning_rate=config.learning_rate,
        throughput_tflops=throughput,
        grad_norm=2.0 / math.sqrt(iteration),
    )


def memory_report(rank: int, iteration: int, memory: StageMemory) -> str:
    """Megatron's memory line: PyTorch's allocator only (no CUDA context or NCCL), at the peak."""
    peak_mb = (memory.total - memory.overhead) / 2**20
    static_mb = (memory.weights + memory.gradients + memory.optimizer) / 2**20
    reserved_mb = peak_mb * RESERVED_SLACK
    return memory_line(rank, iteration, static_mb, peak_mb, reserved_mb, reserved_mb)
