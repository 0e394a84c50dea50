"""Megatron's pipeline schedules, simulated: 1F1B, and interleaved with blocking or overlapped p2p.

Two steps, so that the expensive one runs once:

1. :func:`compile_schedule` turns (PP, VPP, micro-batches, group size) into a *program*: every
   rank's forward/backward computations and batched p2p calls in the order Megatron issues them
   (``schedules.py``, ``forward_backward_pipelining_without_interleaving`` and ``..._with_
   interleaving`` with ``overlap_p2p_comm`` off; on, ``search.overlap``: calls that only post
   their transfers, and waits), each send paired with the receive it meets
   (NCCL matches the k-th send from a rank to a peer with the k-th receive posted there), and a
   topological order of all of it.  Nothing here depends on the layout.
2. ``search.simulator`` (the plain simulator, with timelines) and ``search.recurrence`` (the
   fast straight-line evaluator the planner uses) evaluate a program for a batch of duration
   sets at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cache

import numpy as np

FORWARD, BACKWARD = "F", "B"
ONE_F_ONE_B, INTERLEAVED, INTERLEAVED_OVERLAP_P2P = "1f1b", "interleaved", "interleaved-overlap-p2p"
COMBINED_1F1B = "combined-1f1b"


class Transfer(StrEnum):
    """One direction of a p2p call's traffic, named as Megatron's ``_communicate`` arguments."""

    SEND_NEXT = "send_next"
    SEND_PREV = "send_prev"
    RECV_PREV = "recv_prev"
    RECV_NEXT = "recv_next"


@dataclass(frozen=True)
class Compute:
    """A forward or backward of one micro-batch through one virtual chunk.  ``merged``: a
    backward that runs as one step with the forward just before it on its rank (megatron-core's
    combined 1F1B), each hiding its EP all-to-alls under the other's compute."""

    kind: str  # FORWARD or BACKWARD
    microbatch: int
    chunk: int
    merged: bool = False


@dataclass(frozen=True)
class P2PCall:
    """One p2p call of a rank; ``transfers`` lists its sends and receives.  A blocking call
    returns when they are done; with ``overlap_p2p_comm`` a call may only post them, and a
    :class:`Wait` later waits for each."""

    name: str  # Megatron's function, e.g. send_forward_recv_backward
    transfers: tuple[str, ...]
    blocking: bool = True


@dataclass(frozen=True)
class Wait:
    """A rank waits for a transfer it posted: the ``post``-th non-blocking one of its kind."""

    transfer: str
    post: int


Op = Compute | P2PCall | Wait


def _check_sizes(pp: int, vpp: int, num_microbatches: int, group_size: int) -> None:
    """megatron-core's own rules of the interleaved schedule (``forward_backward_pipelining_
    with_interleaving``), checked before any op is built, with its reasons."""
    if pp < 1 or vpp < 1 or num_microbatches < 1:
        raise ValueError(f"PP, VPP and micro-batches must be >= 1 ({pp=}, {vpp=})")
    if vpp == 1:
        return
    if pp < 2:
        raise ValueError("the interleaved schedule needs PP > 1")
    if num_microbatches < pp:
        raise ValueError(f"interleaving needs micro-batches ({num_microbatches}) >= PP ({pp})")
    if not pp <= group_size <= num_microbatches:
        raise ValueError(
            f"the micro-batch group of the interleaved schedule ({group_size}, "
            f"--microbatch-group-size-per-virtual-pipeline-stage) must lie in "
            f"[PP={pp}, micro-batches={num_microbatches}]"
        )
    remainder = num_microbatches % group_size
    if 0 < remainder < pp:
        raise ValueError(
            f"{num_microbatches} micro-batches in groups of {group_size} leave {remainder}, "
            f"fewer than PP={pp}: Megatron requires the remainder to be 0 or >= PP (a smaller "
            "last group stalls the pipeline); give a multiple of the group size"
        )


def p2p_call(name: str, *transfers: str | None) -> P2PCall | None:
    """Megatron's p2p call ``name`` moving ``transfers`` (None: a direction it leaves out); no
    op where it moves nothing, since such a call takes no time in the simulation."""
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
            p2p_call("recv_forward", None if first else Transfer.RECV_PREV),
            Compute(FORWARD, i, 0),
            p2p_call("send_forward", None if last else Transfer.SEND_NEXT),
        ]
    if remaining:
        ops.append(p2p_call("recv_forward", None if first else Transfer.RECV_PREV))
    for i in range(remaining):
        ops += [
            Compute(FORWARD, warmup + i, 0),
            p2p_call(
                "send_forward_recv_backward",
                *(() if last else (Transfer.SEND_NEXT, Transfer.RECV_NEXT)),
            ),
            Compute(BACKWARD, i, 0),
        ]
        if i == remaining - 1:
            ops.append(p2p_call("send_backward", None if first else Transfer.SEND_PREV))
        else:
            ops.append(
                p2p_call(
                    "send_backward_recv_forward",
                    *(() if first else (Transfer.SEND_PREV, Transfer.RECV_PREV)),
                )
            )
    for i in range(warmup):
        ops += [
            p2p_call("recv_backward", None if last else Transfer.RECV_NEXT),
            Compute(BACKWARD, remaining + i, 0),
            p2p_call("send_backward", None if first else Transfer.SEND_PREV),
        ]
    return [op for op in ops if op is not None]


def rank_ops(
    pp: int,
    vpp: int,
    num_microbatches: int,
    group_size: int | None = None,
    overlap_p2p: bool = False,
    combined: bool = False,
):
    """Every rank's op list in Megatron's order; ``overlap_p2p`` (``overlap_p2p_comm``) applies
    to the interleaved schedule only, as in Megatron (1F1B always blocks); ``combined``
    (``overlap_moe_expert_parallel_comm``) merges each steady forward with its backward."""
    from search.combined import NEEDS_VPP, no_pipelining_ops  # all build on this vocabulary
    from search.interleaved import interleaved_ops
    from search.overlap import interleaved_overlap_ops

    group_size = group_size or pp
    _check_sizes(pp, vpp, num_microbatches, group_size)
    if combined and pp == 1:
        return [no_pipelining_ops(num_microbatches)]
    if combined and vpp == 1:
        raise ValueError(NEEDS_VPP)
    if vpp == 1:
        return [one_f_one_b_ops(pp, rank, num_microbatches) for rank in range(pp)]
    ops_of = interleaved_overlap_ops if overlap_p2p else interleaved_ops
    return [ops_of(pp, rank, vpp, num_microbatches, group_size, combined) for rank in range(pp)]


def compute_order(
    pp: int,
    vpp: int,
    num_microbatches: int,
    group_size: int | None = None,
    combined: bool = False,
):
    """Per rank, the forward/backward computations alone, in order (the same in both p2p
    modes; combined 1F1B runs one more forward in the warm-up)."""
    return [
        [op for op in ops if isinstance(op, Compute)]
        for ops in rank_ops(pp, vpp, num_microbatches, group_size, combined=combined)
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

    pp: int
    vpp: int
    num_microbatches: int
    group_size: int  # micro-batches per group of the interleaved schedule (PP by default)
    overlap_p2p: bool  # the interleaved schedule's p2p calls post early and are waited later
    combined: bool  # combined 1F1B: steady forwards and backwards merged (EP all-to-all overlap)
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
    def num_stages(self) -> int:
        return self.pp * self.vpp

    @property
    def schedule(self) -> str:
        """The schedule's name in reports and ``plan --json``."""
        if self.combined:
            return COMBINED_1F1B
        if self.vpp == 1:
            return ONE_F_ONE_B
        return INTERLEAVED_OVERLAP_P2P if self.overlap_p2p else INTERLEAVED

    @property
    def num_compute(self) -> int:
        return int(self.is_compute.sum())

    @property
    def pair_backward_slot(self) -> np.ndarray:
        """(PP x VPP x VPP,) the backward slot of each merged pair's row."""
        rank, _, chunk = np.meshgrid(
            np.arange(self.pp), np.arange(self.vpp), np.arange(self.vpp), indexing="ij"
        )
        return (self.num_stages + chunk * self.pp + rank).ravel()

    def evaluation_table(self, forward_ms, backward_ms, hidden_ms=None) -> np.ndarray:
        """(rows, batch) durations the op's ``evaluation_slot`` indexes: forwards, backwards,
        and for combined 1F1B each merged pair's backward less ``hidden_ms`` (PP x VPP x VPP,
        batch; None: nothing hidden)."""
        table = np.concatenate([forward_ms, backward_ms])
        if not self.combined:
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


@cache
def compile_schedule(
    pp: int,
    vpp: int,
    num_microbatches: int,
    group_size: int | None = None,
    overlap_p2p: bool = False,
    combined: bool = False,
) -> Program:
    """Pair every transfer with its partner call and order all ops so dependencies come first.
    A non-blocking call takes no time; each :class:`Wait` carries its post's transfer.

    Raises ``RuntimeError`` if the calls deadlock, which would mean the op lists are wrong.
    """
    overlap_p2p = overlap_p2p and vpp > 1
    per_rank = rank_ops(pp, vpp, num_microbatches, group_size, overlap_p2p, combined)
    ops: list[Op] = []
    rank_of: list[int] = []
    ids: list[list[int]] = []
    for rank, rank_list in enumerate(per_rank):
        ids.append(list(range(len(ops), len(ops) + len(rank_list))))
        ops += rank_list
        rank_of += [rank] * len(rank_list)

    def op_of(op_id: int) -> P2PCall:
        call = ops[op_id]
        assert isinstance(call, P2PCall)
        return call

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
            peer = (
                (rank + 1) % pp
                if transfer in (Transfer.SEND_NEXT, Transfer.RECV_NEXT)
                else (rank - 1) % pp
            )
            mine = queues[(rank, transfer)].index(op_id)
            theirs = queues.get((peer, _PARTNER[transfer]), [])
            if mine >= len(theirs):
                raise RuntimeError(f"rank {rank} {transfer} #{mine} has no partner on rank {peer}")
            link = (
                rank if transfer in (Transfer.SEND_NEXT, Transfer.RECV_NEXT) else peer
            )  # boundary peer->peer+1
            paired.append((theirs[mine], link))
        transfers[op_id] = tuple(paired)
    own = np.arange(len(ops))
    posted = {key: [i for i in ids if op_of(i).blocking is False] for key, ids in queues.items()}
    for op_id, op in enumerate(ops):
        if isinstance(op, Wait):
            post = posted[(rank_of[op_id], op.transfer)][op.post]
            own[op_id] = post
            transfers[op_id] = (transfers[post][op_of(post).transfers.index(op.transfer)],)
    for key_ids in posted.values():  # a post takes no time: its transfers end at its waits
        for post in key_ids:
            transfers[post] = ()
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
    previous = np.array(
        [rank_ids[i - 1] if i else -1 for rank_ids in ids for i in range(len(rank_ids))]
    )
    is_compute = np.array([isinstance(op, Compute) for op in ops])
    return Program(
        pp=pp,
        vpp=vpp,
        num_microbatches=num_microbatches,
        group_size=group_size or pp,
        overlap_p2p=overlap_p2p,
        combined=combined,
        order=tuple(order),
        rank=np.array(rank_of),
        previous=previous,
        is_compute=is_compute,
        compute_slot=slots,
        evaluation_slot=evaluation,
        transfers=tuple(transfers),
        own=own,
        last_op=np.array([rank_ids[-1] for rank_ids in ids]),
        waves=_waves(order, previous, transfers, own, is_compute, evaluation, pp),
        ops=tuple(ops),
    )
