"""Megatron's log lines written out by hand, for the tests of the parser and of what it reads.

Written here from megatron/core/timers.py, training.py:training_log and
training/utils.py:report_memory, not with ``ray_layout.measure.log_format``, so that the parser's
tests do not lean on the writer they would check.
"""

from __future__ import annotations

TIMERS_LOGGER = "INFO:megatron.core.timers:"
TRAINING_LOGGER = "INFO:megatron.training.training:"
MAX_TIMES = {"forward-backward": 1236.25, "optimizer": 20.5}


def all_block(times: dict[str, dict[int, float]]) -> list[str]:
    """``--timing-log-option all``: zero values left out, a timer with none left out."""
    lines = ["times across ranks (ms):"]
    for name, by_rank in times.items():
        reported = [(rank, ms) for rank, ms in sorted(by_rank.items()) if ms > 0]
        if reported:
            lines.append(f"  {name}:")
            lines += [f"     rank {rank:2d}: {ms:.2f}" for rank, ms in reported]
    return lines


def max_block(times: dict[str, float]) -> list[str]:
    lines = ["max time across ranks (ms):"]
    return lines + [f"    {(name + ' ').ljust(48, '.')}: {ms:.2f}" for name, ms in times.items()]


def minmax_block(times: dict[str, tuple[float, float]]) -> list[str]:
    lines = ["(min, max) time across ranks (ms):"]
    return lines + [
        f"    {(name + ' ').ljust(48, '.')}: ({low:.2f}, {high:.2f})"
        for name, (low, high) in times.items()
    ]


def iteration_line(
    iteration: int,
    *,
    train_iters: int = 30,
    elapsed_ms: float = 1234.5,
    throughput: float | None = 54.8,
    losses: dict[str, float] | None = None,
    grad_norm: float | None = 3.456,
    extra: str = "",
) -> str:
    losses = {"lm loss": 10.41234, "mtp_1 loss": 10.52345} if losses is None else losses
    text = " [2026-03-16 10:00:12.345678]"
    text += f" iteration {iteration:8d}/{train_iters:8d} |"
    text += f" consumed samples: {iteration * 64:12d} |"
    text += f" elapsed time per iteration (ms): {elapsed_ms:.1f} |"
    if throughput is not None:
        text += f" throughput per GPU (TFLOP/s/GPU): {throughput:.1f} |"
    text += f" learning rate: {1e-4:.6E} |"
    text += f" global batch size: {64:5d} |"
    text += "".join(f" {key}: {value:.6E} |" for key, value in losses.items())
    text += f" loss scale: {1.0:.1f} |"
    if grad_norm is not None:
        text += f" grad norm: {grad_norm:.3f} |"
    text += extra
    text += f" number of skipped iterations: {0:3d} |"
    text += f" number of nan iterations: {0:3d} |"
    return text


def memory_line(rank: int, iteration: int, allocated: float = 1234.56) -> str:
    return (
        f"[Rank {rank}] (after {iteration} iterations) memory (MB)"
        f" | allocated: {allocated:.2f} | max allocated: {allocated * 2:.2f}"
        f" | reserved: {2500.0:.2f} | max reserved: {2600.0:.2f}"
    )


def as_text(lines: list[str]) -> str:
    return "\n".join(lines) + "\n"


def with_logger(block: list[str]) -> list[str]:
    """Python logging's default format prefixes the first line of the message only."""
    return [TIMERS_LOGGER + block[0], *block[1:]]
