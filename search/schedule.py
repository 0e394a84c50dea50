"""Megatron's pipeline schedules, simulated: 1F1B, and interleaved with blocking or overlapped p2p.

Two steps, so that the expensive one runs once:

1. :func:`compile_schedule` turns a :class:`~search.pipeline_ops.ScheduleShape` (PP, VPP,
   micro-batches, group size, p2p overlap, combined 1F1B) into a *program*: every rank's
   forward/backward computations and batched p2p calls in the order Megatron issues them
   (:func:`rank_ops`: ``schedules.py``, ``forward_backward_pipelining_without_interleaving`` and
   ``..._with_interleaving`` with ``overlap_p2p_comm`` off; on, ``search.overlap``: calls that
   only post their transfers, and waits), each send paired with the receive it meets
   (NCCL matches the k-th send from a rank to a peer with the k-th receive posted there), and a
   topological order of all of it.  Nothing here depends on the layout.
2. ``search.simulator`` (the plain simulator, with timelines) and ``search.recurrence`` (the
   fast straight-line evaluator the planner uses) evaluate a program for a batch of duration
   sets at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import cache

import numpy as np

from search.combined import no_pipelining_ops
from search.interleaved import interleaved_ops
from search.overlap import interleaved_overlap_ops
from search.pipeline_ops import (
    BACKWARD,
    FORWARD,
    Compute,
    Op,
    P2PCall,
    ScheduleShape,
    Transfer,
    Wait,
    one_f_one_b_ops,
)


def rank_ops(shape: ScheduleShape) -> list[list[Op]]:
    """Every rank's op list in Megatron's order: 1F1B, the interleaved schedule with blocking
    or overlapped p2p, each with combined 1F1B's merged steps where ``shape.combined``."""
    if shape.combined and shape.pp == 1:
        return [no_pipelining_ops(shape.num_microbatches)]
    if shape.vpp == 1:
        ops_of = one_f_one_b_ops
    else:
        ops_of = interleaved_overlap_ops if shape.p2p_overlap else interleaved_ops
    return [ops_of(shape, rank) for rank in range(shape.pp)]


def compute_order(shape: ScheduleShape) -> list[list[Compute]]:
    """Per rank, the forward/backward computations alone, in order (the same in both p2p
    modes, so taken from the blocking one; combined 1F1B runs one more forward in the
    warm-up)."""
    return [
        [op for op in ops if isinstance(op, Compute)]
        for ops in rank_ops(replace(shape, p2p_overlap=False))
    ]


@dataclass(frozen=True)
class Wave:
    """Ops that depend only on earlier waves, as index arrays (the ``-1`` op is a zero row)."""

    compute: np.ndarray  # op ids
    compute_previous: np.ndarray
    compute_slot: np.ndarray  # row of the evaluation table (``Program.evaluation_slot``)
    compute_index: np.ndarray  # position among compute ops (for per-op noise)
    calls: np.ndarray  # p2p call and wait op ids
    call_previous: np.ndarray
    own_previous: np.ndarray  # previous op of the call that posted its transfers (a wait's post)
    partner_previous: np.ndarray  # (calls, 4): previous op of each partner call (self-padded)
    links: np.ndarray  # (calls, 4): boundary rank of each transfer, PP (free) as padding


@dataclass(frozen=True)
class Program:
    """A schedule compiled for evaluation: op arrays grouped in dependency waves."""

    shape: ScheduleShape  # what it was compiled from
    order: tuple[int, ...]  # op ids in an order where every dependency comes first
    rank: np.ndarray  # op id -> PP rank
    previous: np.ndarray  # op id -> previous op on the same rank, -1 for the first
    is_compute: np.ndarray
    compute_slot: np.ndarray  # op id -> (rank, chunk, F/B) slot: chunk*PP+rank, +S for backward
    # op id -> row of the evaluation table: the compute slot, or for a merged backward 2S + its
    # pair (rank*VPP + forward chunk)*VPP + backward chunk, whose row is B less what it hides
    evaluation_slot: np.ndarray
    transfers: tuple[tuple[tuple[int, int], ...], ...]  # op id -> ((partner op, link rank), ...)
    own: np.ndarray  # op id -> the call that posts its transfers: itself, or a wait's post
    last_op: np.ndarray  # rank -> its last op id
    waves: tuple[Wave, ...] = field(repr=False)
    ops: tuple[Op, ...] = field(repr=False)

    @property
    def num_compute(self) -> int:
        return int(self.is_compute.sum())

    @property
    def pair_backward_slot(self) -> np.ndarray:
        """(PP x VPP x VPP,) the backward slot of each merged pair's row."""
        pp, vpp = self.shape.pp, self.shape.vpp
        rank, _, chunk = np.meshgrid(np.arange(pp), np.arange(vpp), np.arange(vpp), indexing="ij")
        return (self.shape.num_stages + chunk * pp + rank).ravel()

    def evaluation_table(self, forward_ms, backward_ms, hidden_ms=None) -> np.ndarray:
        """(rows, batch) durations the op's ``evaluation_slot`` indexes: forwards, backwards,
        and for combined 1F1B each merged pair's backward less ``hidden_ms`` (PP x VPP x VPP,
        batch; None: nothing hidden)."""
        table = np.concatenate([forward_ms, backward_ms])
        if not self.shape.combined:
            return table
        merged = table[self.pair_backward_slot]
        if hidden_ms is not None:
            merged = merged - hidden_ms
        return np.concatenate([table, merged])


_MAX_TRANSFERS = 4


def _waves(
    order: Sequence[int],
    previous: np.ndarray,
    transfers: Sequence[tuple[tuple[int, int], ...]],
    own: np.ndarray,
    is_compute: np.ndarray,
    slots: np.ndarray,
    pp: int,
) -> tuple[Wave, ...]:
    """Group ops by dependency depth: an op waits for its rank's previous op and for the
    previous op of each partner call (the partner's post time), never for the partner itself;
    a wait also for its own post's."""
    depth = np.zeros(len(previous), dtype=int)
    for op_id in order:
        needs = [previous[op_id], previous[own[op_id]]]
        needs += [previous[partner] for partner, _ in transfers[op_id]]
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
                own_previous=previous[own[calls]],
                partner_previous=partner_previous,
                links=links,
            )
        )
    return tuple(waves)


_PARTNER = {
    Transfer.SEND_NEXT: Transfer.RECV_PREV,
    Transfer.RECV_PREV: Transfer.SEND_NEXT,
    Transfer.SEND_PREV: Transfer.RECV_NEXT,
    Transfer.RECV_NEXT: Transfer.SEND_PREV,
}
Pairs = tuple[tuple[int, int], ...]  # a call's transfers: (partner call, boundary rank) each


@cache
def compile_schedule(shape: ScheduleShape) -> Program:
    """The ops of :func:`rank_ops` as a program, in steps: all ranks' ops in one list
    (:func:`_flatten`); every transfer paired with its partner call (:func:`_pair_transfers`);
    each non-blocking post's transfers carried by the waits for them, as a post takes no time
    (:func:`_post_at_waits`); all ops ordered so that dependencies come first
    (:func:`_dependency_order`); each computation's rows of the evaluation table
    (:func:`_slots`); and the ops grouped in dependency waves (:func:`_waves`).

    Raises ``RuntimeError`` if the calls deadlock, which would mean the op lists are wrong.
    """
    ops, rank_of, ids = _flatten(rank_ops(shape))
    queues = _call_queues(ops, rank_of)
    transfers, own = _post_at_waits(
        ops, rank_of, queues, _pair_transfers(ops, rank_of, queues, shape.pp)
    )
    order = _dependency_order(ids, rank_of, transfers)
    slots, evaluation = _slots(ops, rank_of, shape)
    previous = np.array(
        [rank_ids[i - 1] if i else -1 for rank_ids in ids for i in range(len(rank_ids))]
    )
    is_compute = np.array([isinstance(op, Compute) for op in ops])
    return Program(
        shape=shape,
        order=tuple(order),
        rank=np.array(rank_of),
        previous=previous,
        is_compute=is_compute,
        compute_slot=slots,
        evaluation_slot=evaluation,
        transfers=tuple(transfers),
        own=own,
        last_op=np.array([rank_ids[-1] for rank_ids in ids]),
        waves=_waves(order, previous, transfers, own, is_compute, evaluation, shape.pp),
        ops=tuple(ops),
    )


def _flatten(per_rank: list[list[Op]]) -> tuple[list[Op], list[int], list[list[int]]]:
    """Every rank's ops in one list, numbered in rank order: the ops, each op's rank, and each
    rank's op ids."""
    ops: list[Op] = []
    rank_of: list[int] = []
    ids: list[list[int]] = []
    for rank, rank_list in enumerate(per_rank):
        ids.append(list(range(len(ops), len(ops) + len(rank_list))))
        ops += rank_list
        rank_of += [rank] * len(rank_list)
    return ops, rank_of, ids


def _call(ops: Sequence[Op], op_id: int) -> P2PCall:
    call = ops[op_id]
    assert isinstance(call, P2PCall)
    return call


def _call_queues(ops: Sequence[Op], rank_of: Sequence[int]) -> dict[tuple[int, str], list[int]]:
    """The calls of each (rank, transfer kind) in order: NCCL pairs the k-th send from a rank
    to a peer with the k-th receive posted there."""
    queues: dict[tuple[int, str], list[int]] = {}
    for op_id, op in enumerate(ops):
        if isinstance(op, P2PCall):
            for transfer in op.transfers:
                queues.setdefault((rank_of[op_id], transfer), []).append(op_id)
    return queues


def _pair_transfers(
    ops: Sequence[Op], rank_of: Sequence[int], queues: dict[tuple[int, str], list[int]], pp: int
) -> list[Pairs]:
    """Per op, each transfer of a call with the partner call it meets and the boundary it
    crosses (rank r: r -> r + 1, the last wrapping to rank 0); nothing for a computation."""
    transfers: list[Pairs] = [()] * len(ops)
    for op_id, op in enumerate(ops):
        if not isinstance(op, P2PCall):
            continue
        rank = rank_of[op_id]
        paired = []
        for transfer in op.transfers:
            downstream = transfer in (Transfer.SEND_NEXT, Transfer.RECV_NEXT)
            peer = (rank + 1) % pp if downstream else (rank - 1) % pp
            mine = queues[(rank, transfer)].index(op_id)
            theirs = queues.get((peer, _PARTNER[transfer]), [])
            if mine >= len(theirs):
                raise RuntimeError(f"rank {rank} {transfer} #{mine} has no partner on rank {peer}")
            paired.append((theirs[mine], rank if downstream else peer))
        transfers[op_id] = tuple(paired)
    return transfers


def _post_at_waits(
    ops: Sequence[Op],
    rank_of: Sequence[int],
    queues: dict[tuple[int, str], list[int]],
    paired: Sequence[Pairs],
) -> tuple[list[Pairs], np.ndarray]:
    """Each :class:`Wait` with its post's transfer, and a post with none: a post takes no time,
    its transfers end at its waits.  Also per op, the call that posts its transfers (itself,
    or a wait's post)."""
    transfers = list(paired)
    own = np.arange(len(ops))
    posted = {
        key: [i for i in calls if _call(ops, i).blocking is False] for key, calls in queues.items()
    }
    for op_id, op in enumerate(ops):
        if isinstance(op, Wait):
            post = posted[(rank_of[op_id], op.transfer)][op.post]
            own[op_id] = post
            transfers[op_id] = (transfers[post][_call(ops, post).transfers.index(op.transfer)],)
    for posts in posted.values():
        for post in posts:
            transfers[post] = ()
    return transfers, own


def _dependency_order(
    ids: Sequence[Sequence[int]], rank_of: Sequence[int], transfers: Sequence[Pairs]
) -> list[int]:
    """All ops in an order where each comes after its rank's previous op and after its partner
    calls have been posted, each rank running as far as it can in turn."""
    position = {op_id: index for rank_ids in ids for index, op_id in enumerate(rank_ids)}
    pointer = [0] * len(ids)
    order: list[int] = []
    while len(order) < len(position):
        progressed = False
        for rank, rank_ids in enumerate(ids):
            while pointer[rank] < len(rank_ids):
                op_id = rank_ids[pointer[rank]]
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
    return order


def _slots(
    ops: Sequence[Op], rank_of: Sequence[int], shape: ScheduleShape
) -> tuple[np.ndarray, np.ndarray]:
    """Per op, its compute slot (chunk*PP + rank, + stages for a backward) and its row of the
    evaluation table (the slot, or a merged backward's pair row); -1 for a call."""
    pp, vpp, stages = shape.pp, shape.vpp, shape.num_stages
    slots = np.full(len(ops), -1)
    evaluation = np.full(len(ops), -1)
    for op_id, op in enumerate(ops):
        if isinstance(op, Compute):
            slots[op_id] = op.chunk * pp + rank_of[op_id] + (stages if op.kind == BACKWARD else 0)
            evaluation[op_id] = slots[op_id]
            if op.merged:
                forward = ops[op_id - 1]
                assert isinstance(forward, Compute) and forward.kind == FORWARD
                pair = (rank_of[op_id] * vpp + forward.chunk) * vpp + op.chunk
                evaluation[op_id] = 2 * stages + pair
    return slots, evaluation
