"""One rank's order of work: megatron-core's own schedule, with the p2p calls Megatron makes.

How many forwards warm up and which (micro-batch, chunk) comes k-th are megatron-core's
(``get_pp_rank_microbatches``, ``get_schedule_table``); the p2p calls follow
``forward_backward_pipelining_without_interleaving`` and ``..._with_interleaving`` with
``overlap_p2p_comm`` off.  The ops are written in the vocabulary of ``search.pipeline_ops``
(:class:`Compute`, :class:`P2PCall` and the transfer names) so that a test can hold the
emulator's order against the simulator's, an implementation of its own; nothing else of the
simulator is used here.  With ``overlap_p2p_comm`` on, the interleaved order is traced from
megatron-core's schedule function instead (``megatron_trace``).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from types import SimpleNamespace

from launchers.emulated.megatron_trace import traced_no_pipelining, traced_program
from search.pipeline_ops import BACKWARD, FORWARD, Compute, Op, P2PCall, ScheduleShape, Transfer


def _call(
    name: str,
    *,
    send_next: bool = False,
    send_prev: bool = False,
    recv_prev: bool = False,
    recv_next: bool = False,
) -> P2PCall:
    """A p2p call of Megatron's; an interleaved call with nothing to move still runs its timer."""
    wanted = (
        (Transfer.SEND_NEXT, send_next),
        (Transfer.SEND_PREV, send_prev),
        (Transfer.RECV_PREV, recv_prev),
        (Transfer.RECV_NEXT, recv_next),
    )
    return P2PCall(name, tuple(transfer for transfer, on in wanted if on))


def rank_program(shape: ScheduleShape, pp_rank: int) -> list[Op]:
    """One rank's computations and p2p calls in the order Megatron issues them, with blocking
    p2p and no merged steps (``shape``'s p2p overlap and combined 1F1B left aside).

    How many forwards warm up, and which (micro-batch, chunk) the k-th forward is, come from
    megatron-core's ``get_pp_rank_microbatches`` and ``get_schedule_table``; a backward runs
    chunk VPP-1-c.  The p2p calls follow ``forward_backward_pipelining_without_interleaving``
    and ``..._with_interleaving`` (``overlap_p2p_comm`` off).
    """
    with warnings.catch_warnings():  # "Transformer Engine and Apex are not installed"
        warnings.simplefilter("ignore")
        from megatron.core.pipeline_parallel import schedules

    pp, vpp, num_microbatches = shape.pp, shape.vpp, shape.num_microbatches
    group_size = shape.group_size
    communicator = SimpleNamespace(
        pp_group=SimpleNamespace(size=lambda: pp, rank=lambda: pp_rank),
        virtual_pipeline_model_parallel_size=vpp if vpp > 1 else None,
    )
    total, all_warmup, warmup, remaining = schedules.get_pp_rank_microbatches(
        num_microbatches, vpp, group_size, p2p_communicator=communicator
    )
    table = schedules.get_schedule_table(num_microbatches, vpp, group_size)
    if vpp == 1:
        ops = _one_f_one_b(pp, pp_rank, table, warmup, remaining)
    else:
        ops = _interleaved(pp, pp_rank, vpp, table, total, all_warmup, warmup, remaining)
    return [op for op in ops if op is not None]


def _one_f_one_b(
    pp: int, rank: int, table: Sequence[tuple[int, int]], warmup: int, remaining: int
) -> list[Op | None]:
    """Warm-up forwards, steady forward/backward pairs, cool-down backwards.  The first and last
    stage skip the calls toward the pipeline's ends, timers included."""
    first, last = rank == 0, rank == pp - 1
    recv_forward = None if first else _call("recv_forward", recv_prev=True)
    send_forward = None if last else _call("send_forward", send_next=True)
    recv_backward = None if last else _call("recv_backward", recv_next=True)
    send_backward = None if first else _call("send_backward", send_prev=True)
    ops: list[Op | None] = []
    for k in range(warmup):
        ops += [recv_forward, Compute(FORWARD, *table[k]), send_forward]
    if remaining:
        ops.append(recv_forward)
    for i in range(remaining):
        ops += [
            Compute(FORWARD, *table[warmup + i]),
            None if last else _call("send_forward_recv_backward", send_next=True, recv_next=True),
            Compute(BACKWARD, *table[i]),
        ]
        if i == remaining - 1:
            ops.append(send_backward)
        elif not first:
            ops.append(_call("send_backward_recv_forward", send_prev=True, recv_prev=True))
    for i in range(warmup):
        ops += [recv_backward, Compute(BACKWARD, *table[remaining + i]), send_backward]
    return ops


def _interleaved(
    pp: int,
    rank: int,
    vpp: int,
    table: Sequence[tuple[int, int]],
    total: int,
    all_warmup: bool,
    warmup: int,
    remaining: int,
) -> list[Op | None]:
    """``forward_backward_pipelining_with_interleaving`` with ``overlap_p2p_comm`` off."""
    first, last = rank == 0, rank == pp - 1

    def chunk(k: int, forward: bool) -> int:
        c = table[k % total][1]
        return c if forward else vpp - 1 - c

    def forward(k: int) -> tuple[Compute, bool]:
        """The k-th forward and whether it sends (the last stage's output goes to the loss)."""
        c = chunk(k, True)
        return Compute(FORWARD, table[k % total][0], c), not (last and c == vpp - 1)

    def backward(k: int) -> tuple[Compute, bool]:
        c = chunk(k, False)
        return Compute(BACKWARD, table[k % total][0], c), not (first and c == 0)

    def receives(k: int, forward: bool) -> bool:
        """``recv_tensor_from_previous_stage``: the stage that starts this direction receives
        nothing until the ring has filled, nor for a chunk the ring does not feed."""
        if not (first if forward else last):
            return True
        if k < pp - 1:
            return False
        return chunk(k - (pp - 1), forward) != (vpp - 1 if forward else 0)

    ops: list[Op | None] = [None if first else _call("recv_forward", recv_prev=True)]
    for k in range(warmup):
        compute, send_next = forward(k)
        recv_prev = receives(k, True) and k != total - 1
        ops.append(compute)
        if k == warmup - 1 and not all_warmup:
            name = "send_forward_backward_recv_forward_backward"
            ops.append(_call(name, send_next=send_next, recv_prev=recv_prev, recv_next=not last))
        else:
            ops.append(_call("send_forward_recv_forward", send_next=send_next, recv_prev=recv_prev))
    for k in range(remaining):
        f_compute, send_next = forward(k + warmup)
        b_compute, send_prev = backward(k)
        ops += [
            f_compute,
            b_compute,
            _call(
                "send_forward_backward_recv_forward_backward",
                send_next=send_next,
                send_prev=send_prev,
                recv_prev=receives(k + warmup, True) and k != remaining - 1,
                recv_next=receives(k, False),
            ),
        ]
    if all_warmup:
        ops.append(None if last else _call("recv_backward", recv_next=True))
    for k in range(remaining, total):
        compute, send_prev = backward(k)
        recv_next = receives(k, False) and k != total - 1
        ops += [
            compute,
            _call("send_backward_recv_backward", send_prev=send_prev, recv_next=recv_next),
        ]
    return ops


def pipeline_programs(shape: ScheduleShape) -> tuple[list[Op], ...]:
    """Every PP rank's program in PP rank order: :func:`rank_program`, or with overlapped p2p
    (interleaving only) or EP all-to-all overlap (combined 1F1B) megatron-core's schedule
    itself, traced (``megatron_trace``).  One process computes them for the whole job:
    importing megatron-core takes seconds of CPU, which every rank of a job on one machine
    would otherwise pay at once."""
    if shape.combined and shape.pp == 1:
        return (traced_no_pipelining(shape.num_microbatches),)
    if (shape.p2p_overlap or shape.combined) and shape.vpp > 1:
        return tuple(traced_program(shape, rank) for rank in range(shape.pp))
    return tuple(rank_program(shape, rank) for rank in range(shape.pp))


def held_at_peak(program: Sequence[Op], vpp: int) -> dict[int, int]:
    """Micro-batches of each chunk whose activations the rank holds (forward done, backward
    not yet) at the first moment it holds the most."""
    held, peak = [0] * vpp, [0] * vpp
    for op in program:
        if isinstance(op, Compute):
            held[op.chunk] += 1 if op.kind == FORWARD else -1
            if sum(held) > sum(peak):
                peak = list(held)
    return dict(enumerate(peak))
