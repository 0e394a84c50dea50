"""Megatron's pipeline schedules, simulated: 1F1B and interleaved, with blocking p2p.

Two steps, so that the expensive one runs once:

1. :func:`compile_schedule` turns (PP, VPP, micro-batches, group size) into a *program*: every
   rank's forward/backward computations and batched p2p calls in the order Megatron issues them
   (``schedules.py``, ``forward_backward_pipelining_without_interleaving`` and ``..._with_
   interleaving`` with ``overlap_p2p_comm`` off), each send paired with the receive it meets
   (NCCL matches the k-th send from a rank to a peer with the k-th receive posted there), and a
   topological order of all of it.  Nothing here depends on the layout.
2. ``search.simulator`` (the plain simulator, with timelines) and ``search.recurrence`` (the
   fast straight-line evaluator the planner uses) evaluate a program for a batch of duration
   sets at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache

import numpy as np

FORWARD, BACKWARD = "F", "B"
SEND_NEXT, SEND_PREV, RECV_PREV, RECV_NEXT = "send_next", "send_prev", "recv_prev", "recv_next"


@dataclass(frozen=True)
class Compute:
    """A forward or backward of one micro-batch through one virtual chunk."""

    kind: str  # FORWARD or BACKWARD
    microbatch: int
    chunk: int


@dataclass(frozen=True)
class P2PCall:
    """One batched p2p call of a rank; ``transfers`` lists its sends and receives."""

    name: str  # Megatron's function, e.g. send_forward_recv_backward
    transfers: tuple[str, ...]


Op = Compute | P2PCall


def _check_sizes(pp: int, vpp: int, num_microbatches: int, group_size: int) -> None:
    if pp < 1 or vpp < 1 or num_microbatches < 1:
        raise ValueError(f"PP, VPP and micro-batches must be >= 1 ({pp=}, {vpp=})")
    if vpp > 1:
        if pp < 2:
            raise ValueError("the interleaved schedule needs PP > 1")
        if group_size < pp:
            raise ValueError(f"micro-batch group size {group_size} must be >= PP={pp}")
        if num_microbatches < pp or (
            num_microbatches % group_size and num_microbatches < group_size
        ):
            raise ValueError(f"interleaving needs micro-batches ({num_microbatches}) >= PP ({pp})")


def _call(name: str, *transfers: str | None) -> P2PCall | None:
    kept = tuple(t for t in transfers if t)
    return P2PCall(name, kept) if kept else None


def one_f_one_b_ops(pp: int, rank: int, num_microbatches: int) -> list[Op]:
    """``forward_backward_pipelining_without_interleaving`` for one rank."""
    first, last = rank == 0, rank == pp - 1
    warmup = min(pp - rank - 1, num_microbatches)
    remaining = num_microbatches - warmup
    ops: list[Op | None] = []
    for i in range(warmup):
        ops += [
            _call("recv_forward", None if first else RECV_PREV),
            Compute(FORWARD, i, 0),
            _call("send_forward", None if last else SEND_NEXT),
        ]
    if remaining:
        ops.append(_call("recv_forward", None if first else RECV_PREV))
    for i in range(remaining):
        ops += [
            Compute(FORWARD, warmup + i, 0),
            _call("send_forward_recv_backward", *(() if last else (SEND_NEXT, RECV_NEXT))),
            Compute(BACKWARD, i, 0),
        ]
        if i == remaining - 1:
            ops.append(_call("send_backward", None if first else SEND_PREV))
        else:
            ops.append(
                _call("send_backward_recv_forward", *(() if first else (SEND_PREV, RECV_PREV)))
            )
    for i in range(warmup):
        ops += [
            _call("recv_backward", None if last else RECV_NEXT),
            Compute(BACKWARD, remaining + i, 0),
            _call("send_backward", None if first else SEND_PREV),
        ]
    return [op for op in ops if op is not None]


@cache
def schedule_table(num_microbatches: int, vpp: int, group_size: int) -> tuple[tuple[int, int], ...]:
    """(micro-batch, chunk) of each forward in order: for each group of ``group_size``
    micro-batches, every chunk in turn (``schedules.get_schedule_table``)."""
    table = []
    for start in range(0, num_microbatches, group_size):
        end = num_microbatches if start + group_size >= num_microbatches else start + group_size
        table += [(mb, chunk) for chunk in range(vpp) for mb in range(start, end)]
    return tuple(table)


def interleaved_warmup(pp: int, rank: int, vpp: int, num_microbatches: int, group_size: int):
    """(warm-up forwards, all forwards in warm-up) of ``get_pp_rank_microbatches``."""
    total = num_microbatches * vpp
    warmup = (pp - rank - 1) * 2 + (vpp - 1) * group_size
    return (total, True) if warmup >= total else (warmup, False)


def interleaved_ops(
    pp: int, rank: int, vpp: int, num_microbatches: int, group_size: int
) -> list[Op]:
    """``forward_backward_pipelining_with_interleaving`` (no p2p overlap) for one rank."""
    total = num_microbatches * vpp
    table = schedule_table(num_microbatches, vpp, group_size)
    warmup, all_warmup = interleaved_warmup(pp, rank, vpp, num_microbatches, group_size)
    remaining = total - warmup
    first, last = rank == 0, rank == pp - 1

    def chunk_of(virtual: int, forward: bool) -> int:
        chunk = table[virtual % total][1]
        return chunk if forward else vpp - 1 - chunk

    def receives(virtual: int, forward: bool) -> bool:
        """``recv_tensor_from_previous_stage``: does the next item of this direction arrive?"""
        leading = first if forward else last
        if not leading:
            return True
        if virtual < pp - 1:  # the ending stage has produced nothing yet
            return False
        return chunk_of(virtual - (pp - 1), forward) != (vpp - 1 if forward else 0)

    def forward(virtual: int) -> tuple[Compute, str | None]:
        chunk = chunk_of(virtual, True)
        sends = None if (last and chunk == vpp - 1) else SEND_NEXT
        return Compute(FORWARD, table[virtual][0], chunk), sends

    def backward(virtual: int) -> tuple[Compute, str | None]:
        chunk = chunk_of(virtual, False)
        sends = None if (first and chunk == 0) else SEND_PREV
        return Compute(BACKWARD, table[virtual % total][0], chunk), sends

    ops: list[Op | None] = [_call("recv_forward", None if first else RECV_PREV)]
    for k in range(warmup):
        compute, send_next = forward(k)
        recv_prev = receives(k, True) and k != total - 1
        ops.append(compute)
        if k == warmup - 1 and not all_warmup:
            recv_next = not last
            ops.append(
                _call(
                    "send_forward_backward_recv_forward_backward",
                    send_next,
                    RECV_PREV if recv_prev else None,
                    RECV_NEXT if recv_next else None,
                )
            )
        else:
            ops.append(
                _call("send_forward_recv_forward", send_next, RECV_PREV if recv_prev else None)
            )
    for k in range(remaining):
        f_compute, send_next = forward(k + warmup)
        b_compute, send_prev = backward(k)
        recv_prev = receives(k + warmup, True) and k != remaining - 1
        recv_next = receives(k, False)
        ops += [
            f_compute,
            b_compute,
            _call(
                "send_forward_backward_recv_forward_backward",
                send_next,
                send_prev,
                RECV_PREV if recv_prev else None,
                RECV_NEXT if recv_next else None,
            ),
        ]
    if all_warmup:
        ops.append(_call("recv_backward", None if last else RECV_NEXT))
    for k in range(remaining, total):
        compute, send_prev = backward(k)
        recv_next = receives(k, False) and k != total - 1
        ops += [
            compute,
            _call("send_backward_recv_backward", send_prev, RECV_NEXT if recv_next else None),
        ]
    return [op for op in ops if op is not None]


def rank_ops(pp: int, vpp: int, num_microbatches: int, group_size: int | None = None):
    """Every rank's op list in Megatron's order."""
    group_size = group_size or pp
    _check_sizes(pp, vpp, num_microbatches, group_size)
    if vpp == 1:
        return [one_f_one_b_ops(pp, rank, num_microbatches) for rank in range(pp)]
    return [interleaved_ops(pp, rank, vpp, num_microbatches, group_size) for rank in range(pp)]


def compute_order(pp: int, vpp: int, num_microbatches: int, group_size: int | None = None):
    """Per rank, the forward/backward computations alone, in order."""
    return [
        [op for op in ops if isinstance(op, Compute)]
        for ops in rank_ops(pp, vpp, num_microbatches, group_size)
    ]


@dataclass(frozen=True)
class Wave:
    """Ops that depend only on earlier waves, as index arrays (the ``-1`` op is a zero row)."""

    compute: np.ndarray  # op ids
    compute_previous: np.ndarray
    compute_slot: np.ndarray  # stage slot: chunk*PP + rank, + stages for a backward
    compute_index: np.ndarray  # position among compute ops (for per-op noise)
    calls: np.ndarray  # p2p call op ids
    call_previous: np.ndarray
    partner_previous: np.ndarray  # (calls, 4): previous op of each partner call (self-padded)
    links: np.ndarray  # (calls, 4): boundary rank of each transfer, PP (free) as padding


@dataclass(frozen=True)
class Program:
    """A schedule compiled for evaluation: op arrays grouped in dependency waves."""

    pp: int
    vpp: int
    num_microbatches: int
    group_size: int  # micro-batches per group of the interleaved schedule (PP by default)
    order: tuple[int, ...]  # op ids in an order where every dependency comes first
    rank: np.ndarray  # op id -> PP rank
    previous: np.ndarray  # op id -> previous op on the same rank, -1 for the first
    is_compute: np.ndarray
    compute_slot: np.ndarray  # op id -> (rank, chunk, F/B) slot: chunk*PP+rank, +S for backward
    transfers: tuple[tuple[tuple[int, int], ...], ...]  # op id -> ((partner op, link rank), ...)
    last_op: np.ndarray  # rank -> its last op id
    waves: tuple[Wave, ...] = field(repr=False)
    ops: tuple[Op, ...] = field(repr=False)

    @property
    def num_stages(self) -> int:
        return self.pp * self.vpp

    @property
    def num_compute(self) -> int:
        return int(self.is_compute.sum())


_MAX_TRANSFERS = 4


def _waves(
    order: Sequence[int],
    previous: np.ndarray,
    transfers: Sequence[tuple[tuple[int, int], ...]],
    is_compute: np.ndarray,
    slots: np.ndarray,
    pp: int,
) -> tuple[Wave, ...]:
    """Group ops by dependency depth: an op waits for its rank's previous op and for the
    previous op of each partner call (the partner's post time), never for the partner itself."""
    depth = np.zeros(len(previous), dtype=int)
    for op_id in order:
        needs = [previous[op_id]] + [previous[partner] for partner, _ in transfers[op_id]]
        depth[op_id] = 1 + max((depth[n] for n in needs if n >= 0), default=-1)
    compute_index = np.cumsum(is_compute) - 1
    waves = []
    for level in range(depth.max() + 1):
        members = np.flatnonzero(depth == level)
        compute = members[is_compute[members]]
        calls = members[~is_compute[members]]
        partner_previous = np.empty((len(calls), _MAX_TRANSFERS), dtype=int)
        links = np.full((len(calls), _MAX_TRANSFERS), pp)
        for row, call in enumerate(calls):
            partner_previous[row] = previous[call]
            for column, (partner, link) in enumerate(transfers[call]):
                partner_previous[row, column] = previous[partner]
                links[row, column] = link
        waves.append(
            Wave(
                compute=compute,
                compute_previous=previous[compute],
                compute_slot=slots[compute],
                compute_index=compute_index[compute],
                calls=calls,
                call_previous=previous[calls],
                partner_previous=partner_previous,
                links=links,
            )
        )
    return tuple(waves)


_PARTNER = {SEND_NEXT: RECV_PREV, RECV_PREV: SEND_NEXT, SEND_PREV: RECV_NEXT, RECV_NEXT: SEND_PREV}


@cache
def compile_schedule(
    pp: int, vpp: int, num_microbatches: int, group_size: int | None = None
) -> Program:
    """Pair every transfer with its partner call and order all ops so dependencies come first.

    Raises ``RuntimeError`` if the calls deadlock, which would mean the op lists are wrong.
    """
    per_rank = rank_ops(pp, vpp, num_microbatches, group_size)
    ops: list[Op] = []
    rank_of: list[int] = []
    ids: list[list[int]] = []
    for rank, rank_list in enumerate(per_rank):
        ids.append(list(range(len(ops), len(ops) + len(rank_list))))
        ops += rank_list
        rank_of += [rank] * len(rank_list)
    # FIFO queues per (rank, transfer kind) to pair the k-th send with the k-th receive.
    queues: dict[tuple[int, str], list[int]] = {}
    for op_id, op in enumerate(ops):
        if isinstance(op, P2PCall):
            for transfer in op.transfers:
                queues.setdefault((rank_of[op_id], transfer), []).append(op_id)
    transfers: list[tuple[tuple[int, int], ...]] = [()] * len(ops)
    for op_id, op in enumerate(ops):
        if not isinstance(op, P2PCall):
            continue
        rank = rank_of[op_id]
        paired = []
        for transfer in op.transfers:
            peer = (rank + 1) % pp if transfer in (SEND_NEXT, RECV_NEXT) else (rank - 1) % pp
            mine = queues[(rank, transfer)].index(op_id)
            theirs = queues.get((peer, _PARTNER[transfer]), [])
            if mine >= len(theirs):
                raise RuntimeError(f"rank {rank} {transfer} #{mine} has no partner on rank {peer}")
            link = rank if transfer in (SEND_NEXT, RECV_NEXT) else peer  # boundary peer->peer+1
            paired.append((theirs[mine], link))
        transfers[op_id] = tuple(paired)
    position = {op_id: index for rank_ids in ids for index, op_id in enumerate(rank_ids)}
    pointer = [0] * pp
    order: list[int] = []
    while len(order) < len(ops):
        progressed = False
        for rank in range(pp):
            while pointer[rank] < len(ids[rank]):
                op_id = ids[rank][pointer[rank]]
                partners_posted = all(
                    pointer[rank_of[partner]] >= position[partner]
                    for partner, _ in transfers[op_id]
                )
                if not partners_posted:
                    break
                order.append(op_id)
                pointer[rank] += 1
                progressed = True
        if not progressed:
            raise RuntimeError("the p2p calls deadlock; the schedule's op lists are inconsistent")
    stages = pp * vpp
    slots = np.full(len(ops), -1)
    for op_id, op in enumerate(ops):
        if isinstance(op, Compute):
            slots[op_id] = op.chunk * pp + rank_of[op_id] + (stages if op.kind == BACKWARD else 0)
    previous = np.array(
        [rank_ids[i - 1] if i else -1 for rank_ids in ids for i in range(len(rank_ids))]
    )
    is_compute = np.array([isinstance(op, Compute) for op in ops])
    return Program(
        pp=pp,
        vpp=vpp,
        num_microbatches=num_microbatches,
        group_size=group_size or pp,
        order=tuple(order),
        rank=np.array(rank_of),
        previous=previous,
        is_compute=is_compute,
        compute_slot=slots,
        transfers=tuple(transfers),
        last_op=np.array([rank_ids[-1] for rank_ids in ids]),
        waves=_waves(order, previous, transfers, is_compute, slots, pp),
        ops=tuple(ops),
    )
