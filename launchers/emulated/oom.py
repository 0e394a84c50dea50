"""The line PyTorch raises when a rank's modelled peak does not fit the profile's HBM."""

from __future__ import annotations

from launchers.emulated.rank_costs import RESERVED_SLACK, RankCosts
from ray_layout.model.sizing import GIB


def fits(rank: RankCosts, hbm_gib: float) -> bool:
    """Whether the rank's modelled peak fits in ``hbm_gib`` GiB."""
    return rank.memory.total <= hbm_gib * GIB


def _size(count: float) -> str:
    """PyTorch's ``format_size``."""
    return f"{count / GIB:.2f} GiB" if count >= GIB else f"{count / 2**20:.2f} MiB"


def out_of_memory_message(rank: RankCosts, hbm_gib: float, device: int) -> str:
    """The line PyTorch raises when the rank's peak passes ``hbm_gib``: the allocation that
    fails is one more micro-batch's activations (the optimizer state if none are held)."""
    memory = rank.memory
    held = memory.activations + memory.logits
    request = held / rank.held_microbatches if rank.held_microbatches else memory.optimizer
    capacity = hbm_gib * GIB
    in_use = min(memory.total - request, capacity)
    reserved = max(in_use - memory.overhead, 0.0)  # the overhead is CUDA context and NCCL
    allocated = reserved / RESERVED_SLACK
    return (
        f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {_size(request)}. "
        f"GPU {device} has a total capacity of {_size(capacity)} of which "
        f"{_size(capacity - in_use)} is free. Including non-PyTorch memory, this process has "
        f"{_size(in_use)} memory in use. Of the allocated memory {_size(allocated)} is "
        f"allocated by PyTorch, and {_size(reserved - allocated)} is reserved by PyTorch but "
        "unallocated. If reserved but unallocated memory is large try setting "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See "
        "documentation for Memory Management  "
        "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
    )
