"""The vocabulary of Megatron's pipeline schedules: the ops a rank issues, the shape of a
schedule with megatron-core's own rules for it, and the plain 1F1B order.

Everything else of the schedule builds on this module and nothing here imports it: the
interleaved orders (``search.interleaved``, ``search.overlap``, ``search.combined``), the
dispatcher and compiler (``search.schedule``), and the emulator (``launchers.emulated``), which
writes its own order in these ops so that a test can hold the two side by side.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

FORWARD, BACKWARD = "F", "B"
ONE_F_ONE_B, INTERLEAVED, INTERLEAVED_OVERLAP_P2P = "1f1b", "interleaved", "interleaved-overlap-p2p"
COMBINED_1F1B = "combined-1f1b"

# Megatron's own rule for combined 1F1B (transformer_config.py and arguments.py, 0.16.1)
NEEDS_VPP = (
    "--overlap-moe-expert-parallel-comm with PP > 1 needs a virtual pipeline (VPP > 1): "
    "megatron-core's rule 'virtual_pipeline_model_parallel_size must be specified when "
    "pipeline_model_parallel_size > 1'"
)


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
    returns when they are done; with p2p overlap a call may only post them, and a :class:`Wait`
    later waits for each."""

    name: str  # Megatron's function, e.g. send_forward_recv_backward
    transfers: tuple[str, ...]
    blocking: bool = True


@dataclass(frozen=True)
class Wait:
    """A rank waits for a transfer it posted: the ``post``-th non-blocking one of its kind."""

    transfer: str
    post: int


Op = Compute | P2PCall | Wait


@dataclass(frozen=True)
class ScheduleShape:
    """What a schedule's order depends on, nothing of the layout: PP, VPP, micro-batches, the
    interleaved schedule's micro-batch group, whether its p2p calls overlap, whether steady
    forwards and backwards merge.  Built only where megatron-core would run it (its reasons
    otherwise, as ``ValueError``); frozen and hashable, so a compiled program is cached by it."""

    pp: int
    vpp: int
    num_microbatches: int
    group_size: int | None = None  # None: PP (set so on construction)
    # Megatron's overlap_p2p_comm: interleaved p2p posted, waited later (1F1B always blocks)
    p2p_overlap: bool = False
    combined: bool = False  # combined 1F1B (EP all-to-all overlap): steady F and B merged

    def __post_init__(self) -> None:
        object.__setattr__(self, "group_size", self.group_size or self.pp)
        object.__setattr__(self, "p2p_overlap", self.p2p_overlap and self.vpp > 1)
        _check_sizes(self.pp, self.vpp, self.num_microbatches, self.group_size)
        if self.combined and self.pp > 1 and self.vpp == 1:
            raise ValueError(NEEDS_VPP)

    @property
    def num_stages(self) -> int:
        return self.pp * self.vpp

    @property
    def name(self) -> str:
        """The schedule's name in reports and ``plan --json``."""
        if self.combined:
            return COMBINED_1F1B
        if self.vpp == 1:
            return ONE_F_ONE_B
        return INTERLEAVED_OVERLAP_P2P if self.p2p_overlap else INTERLEAVED


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


def one_f_one_b_ops(shape: ScheduleShape, rank: int) -> list[Op]:
    """``forward_backward_pipelining_without_interleaving`` for one rank."""
    pp, num_microbatches = shape.pp, shape.num_microbatches
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
