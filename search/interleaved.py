"""The interleaved schedule's pieces: megatron-core's schedule table and warm-up, one rank's
view of them, and its op list with blocking p2p (``overlap_p2p_comm`` off).

``forward_backward_pipelining_with_interleaving`` in megatron-core 0.16.1: what the k-th forward
and backward run and whether the next item of a direction arrives is shared by both p2p modes;
``search.overlap`` posts and waits the same transfers where this module blocks on them.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from search.pipeline_ops import (
    BACKWARD,
    FORWARD,
    Compute,
    Op,
    ScheduleShape,
    Transfer,
    p2p_call,
)


@cache
def schedule_table(num_microbatches: int, vpp: int, group_size: int) -> tuple[tuple[int, int], ...]:
    """(micro-batch, chunk) of each forward in order: for each group of ``group_size``
    micro-batches, every chunk in turn (``schedules.get_schedule_table``)."""
    table = []
    for start in range(0, num_microbatches, group_size):
        end = num_microbatches if start + group_size >= num_microbatches else start + group_size
        table += [(mb, chunk) for chunk in range(vpp) for mb in range(start, end)]
    return tuple(table)


@dataclass(frozen=True)
class InterleavedRank:
    """One rank of the interleaved schedule: which chunk the k-th forward or backward runs,
    what it sends, and whether the next item of a direction arrives (shared by both p2p
    modes, which differ only in when the calls are posted and waited)."""

    shape: ScheduleShape
    rank: int

    @property
    def total(self) -> int:
        return self.shape.num_microbatches * self.shape.vpp

    @property
    def first(self) -> bool:
        return self.rank == 0

    @property
    def last(self) -> bool:
        return self.rank == self.shape.pp - 1

    @property
    def warmup(self) -> tuple[int, bool]:
        """(warm-up forwards, all forwards in warm-up) of ``get_pp_rank_microbatches``; combined
        1F1B runs one more, so that each merged forward and backward are independent."""
        shape = self.shape
        warmup = (
            (shape.pp - self.rank - 1) * 2 + (shape.vpp - 1) * shape.group_size + shape.combined
        )
        return (self.total, True) if warmup >= self.total else (warmup, False)

    @property
    def table(self) -> tuple[tuple[int, int], ...]:
        shape = self.shape
        return schedule_table(shape.num_microbatches, shape.vpp, shape.group_size)

    def chunk(self, virtual: int, forward: bool) -> int:
        chunk = self.table[virtual % self.total][1]
        return chunk if forward else self.shape.vpp - 1 - chunk

    def receives(self, virtual: int, forward: bool) -> bool:
        """``recv_tensor_from_previous_stage``: does the next item of this direction arrive?"""
        leading = self.first if forward else self.last
        if not leading:
            return True
        if virtual < self.shape.pp - 1:  # the ending stage has produced nothing yet
            return False
        chunk = self.chunk(virtual - (self.shape.pp - 1), forward)
        return chunk != (self.shape.vpp - 1 if forward else 0)

    def forward(self, virtual: int) -> tuple[Compute, str | None]:
        """The forward and its send (the last stage's output goes to the loss)."""
        chunk = self.chunk(virtual, True)
        sends = None if (self.last and chunk == self.shape.vpp - 1) else Transfer.SEND_NEXT
        return Compute(FORWARD, self.table[virtual][0], chunk), sends

    def backward(self, virtual: int, merged: bool = False) -> tuple[Compute, str | None]:
        """The backward and its send; ``merged``: run in one step with the forward before it."""
        chunk = self.chunk(virtual, False)
        sends = None if (self.first and chunk == 0) else Transfer.SEND_PREV
        return Compute(BACKWARD, self.table[virtual % self.total][0], chunk, merged), sends


def interleaved_ops(shape: ScheduleShape, rank: int) -> list[Op]:
    """``forward_backward_pipelining_with_interleaving`` (no p2p overlap) for one rank; with
    ``overlap_moe_expert_parallel_comm`` where ``shape.combined`` (combined 1F1B)."""
    at = InterleavedRank(shape, rank)
    total, first, last, combined = at.total, at.first, at.last, shape.combined
    receives, forward, backward = at.receives, at.forward, at.backward
    warmup, all_warmup = at.warmup
    remaining = total - warmup

    ops: list[Op | None] = [p2p_call("recv_forward", None if first else Transfer.RECV_PREV)]
    for k in range(warmup):
        compute, send_next = forward(k)
        recv_prev = receives(k, True) and k != total - 1
        ops.append(compute)
        if k == warmup - 1 and not all_warmup:
            recv_next = not last
            ops.append(
                p2p_call(
                    "send_forward_backward_recv_forward_backward",
                    send_next,
                    Transfer.RECV_PREV if recv_prev else None,
                    Transfer.RECV_NEXT if recv_next else None,
                )
            )
        else:
            ops.append(
                p2p_call(
                    "send_forward_recv_forward",
                    send_next,
                    Transfer.RECV_PREV if recv_prev else None,
                )
            )
    for k in range(remaining):
        f_compute, send_next = forward(k + warmup)
        b_compute, send_prev = backward(k, combined)
        recv_prev = receives(k + warmup, True) and k != remaining - 1
        recv_next = receives(k, False)
        ops += [
            f_compute,
            b_compute,
            p2p_call(
                "send_forward_backward_recv_forward_backward",
                send_next,
                send_prev,
                Transfer.RECV_PREV if recv_prev else None,
                Transfer.RECV_NEXT if recv_next else None,
            ),
        ]
    if all_warmup:
        ops.append(p2p_call("recv_backward", None if last else Transfer.RECV_NEXT))
    for k in range(remaining, total):
        compute, send_prev = backward(k)
        recv_next = receives(k, False) and k != total - 1
        ops += [
            compute,
            p2p_call(
                "send_backward_recv_backward", send_prev, Transfer.RECV_NEXT if recv_next else None
            ),
        ]
    return [op for op in ops if op is not None]
