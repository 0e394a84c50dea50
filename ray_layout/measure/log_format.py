"""Megatron's log lines, written exactly as core_v0.16.1 prints them.

The emulated Megatron prints these, and tests build synthetic logs from known costs with them;
``ray_layout.measure.logs`` reads them back.  Formats: ``megatron/core/timers.py`` (timer
blocks, names dot-padded to 48 characters in the max/minmax forms), ``training.py:training_log``
(the iteration line), ``training/utils.py:report_memory`` (the memory line) and
``training/arguments.py`` (the world line).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

TIMER_LOGGER_PREFIX = "INFO:megatron.core.timers:"
# The level-2 timer each of Megatron's p2p calls runs under (schedules.py / p2p_communication.py)
P2P_TIMER_OF_CALL = {
    "recv_forward": "forward-recv",
    "send_forward": "forward-send",
    "send_forward_recv_backward": "forward-send-backward-recv",
    "send_backward_recv_forward": "backward-send-forward-recv",
    "recv_backward": "backward-recv",
    "send_backward": "backward-send",
    "send_forward_recv_forward": "forward-send-forward-recv",
    "send_backward_recv_backward": "backward-send-backward-recv",
    "send_forward_backward_recv_forward_backward": "forward-backward-send-forward-backward-recv",
}


def _padded(name: str) -> str:
    return (name + " ").ljust(48, ".")


def timers_all(ms_by_timer: Mapping[str, Mapping[int, float]], prefix: str = "") -> str:
    """``--timing-log-option all``: every rank's value; zero values and empty timers left out."""
    lines = [prefix + "times across ranks (ms):"]
    for name, by_rank in ms_by_timer.items():
        reported = [(rank, ms) for rank, ms in sorted(by_rank.items()) if ms > 0]
        if reported:
            lines.append(f"  {name}:")
            lines += [f"     rank {rank:2d}: {ms:.2f}" for rank, ms in reported]
    return "\n".join(lines)


def timers_max(ms_by_timer: Mapping[str, float], prefix: str = "") -> str:
    """``--timing-log-option max``."""
    lines = [prefix + "max time across ranks (ms):"]
    lines += [f"    {_padded(name)}: {ms:.2f}" for name, ms in ms_by_timer.items()]
    return "\n".join(lines)


def timers_minmax(ms_by_timer: Mapping[str, tuple[float, float]], prefix: str = "") -> str:
    """``--timing-log-option minmax``."""
    lines = [prefix + "(min, max) time across ranks (ms):"]
    lines += [
        f"    {_padded(name)}: ({low:.2f}, {high:.2f})" for name, (low, high) in ms_by_timer.items()
    ]
    return "\n".join(lines)


def iteration_line(
    iteration: int,
    train_iters: int,
    consumed_samples: int,
    elapsed_ms: float,
    global_batch_size: int,
    losses: Mapping[str, float],
    *,
    learning_rate: float = 1e-4,
    throughput_tflops: float | None = None,
    loss_scale: float = 1.0,
    grad_norm: float | None = None,
    when: datetime | None = None,
) -> str:
    """``training_log``'s line, printed by the last rank at every log interval."""
    stamp = (when or datetime.now()).strftime("%Y-%m-%d %H:%M:%S.%f")
    text = f" [{stamp}]"
    text += f" iteration {iteration:8d}/{train_iters:8d} |"
    text += f" consumed samples: {consumed_samples:12d} |"
    text += f" elapsed time per iteration (ms): {elapsed_ms:.1f} |"
    if throughput_tflops is not None:
        text += f" throughput per GPU (TFLOP/s/GPU): {throughput_tflops:.1f} |"
    text += f" learning rate: {learning_rate:.6E} |"
    text += f" global batch size: {global_batch_size:5d} |"
    for name, value in losses.items():
        text += f" {name}: {value:.6E} |"
    text += f" loss scale: {loss_scale:.1f} |"
    if grad_norm is not None:
        text += f" grad norm: {grad_norm:.3f} |"
    text += " number of skipped iterations:   0 |"
    text += " number of nan iterations:   0 |"
    return text


def world_line(world_size: int, dp: int, cp: int, tp: int, pp: int) -> str:
    """``arguments.py``'s start-up line on rank 0, in the wording since hierarchical context
    parallelism (2024; none here); printed with ``print``, so no logger prefix."""
    return (
        f"using world size: {world_size}, data-parallel size: {dp}, context-parallel size: {cp}, "
        f"hierarchical context-parallel sizes: None, tensor-model-parallel size: {tp}, "
        f"pipeline-model-parallel size: {pp}"
    )


def memory_line(
    rank: int,
    iteration: int,
    allocated_mb: float,
    max_allocated_mb: float,
    reserved_mb: float,
    max_reserved_mb: float,
) -> str:
    """``report_memory``'s line, printed by every rank with DP rank 0."""
    return (
        f"[Rank {rank}] (after {iteration} iterations) memory (MB)"
        f" | allocated: {allocated_mb:.2f} | max allocated: {max_allocated_mb:.2f}"
        f" | reserved: {reserved_mb:.2f} | max reserved: {max_reserved_mb:.2f}"
    )
