"""The interleaved schedule with overlapped p2p (``overlap_p2p_comm``, Megatron's default there).

megatron-core 0.16.1's ``forward_backward_pipelining_with_interleaving`` with
``overlap_p2p_comm`` on and ``overlap_p2p_comm_warmup_flush`` off: the warm-up's calls block
as without overlap, except that the last warm-up forward also posts the first gradient's
receive; in the steady phase each forward and backward posts its send and the next item's
receive (non-blocking), the receive is waited just before the compute that needs it, and a
send only when the next send of its direction is posted; the cool-down blocks again, then waits
for the last gradient it sent.  Each :class:`Wait` names the post it waits for (the n-th
non-blocking post of that transfer on the rank), as Megatron keeps one handle per post.
"""

from __future__ import annotations

from search.interleaved import InterleavedRank
from search.pipeline_ops import Op, P2PCall, ScheduleShape, Transfer, Wait, p2p_call


class _Handles:
    """Megatron's wait handles: receives queued per direction, the latest send of each."""

    def __init__(self, ops: list[Op]) -> None:
        self.ops = ops
        self.posts: dict[str, int] = {}
        self.receives: dict[str, list[int]] = {Transfer.RECV_PREV: [], Transfer.RECV_NEXT: []}
        self.send: dict[str, int | None] = {}

    def post(self, name: str, send: str | None, receive: str | None) -> None:
        """Post a send and a receive without waiting; then wait for this direction's previous
        send (``send_next_wait_handle.wait()``) and keep the new one."""
        kept = tuple(t for t in (send, receive) if t)
        if kept:
            self.ops.append(P2PCall(name, kept, blocking=False))
        numbered = {}
        for transfer in kept:
            numbered[transfer] = self.posts.get(transfer, 0)
            self.posts[transfer] = numbered[transfer] + 1
        direction = "next" if name == "send_forward_recv_forward" else "prev"
        previous = self.send.get(direction)
        if previous is not None:
            self.ops.append(Wait(f"send_{direction}", previous))
        self.send[direction] = numbered.get(send) if send else None
        if receive:
            self.receives[receive].append(numbered[receive])

    def wait_receive(self, receive: str) -> None:
        """Wait for the oldest pending receive of this direction, if any."""
        if self.receives[receive]:
            self.ops.append(Wait(receive, self.receives[receive].pop(0)))


def interleaved_overlap_ops(shape: ScheduleShape, rank: int) -> list[Op]:
    """One rank's interleaved schedule with overlapped p2p, in Megatron's order.  Combined 1F1B
    (``shape.combined``): each steady step waits for both of its inputs first, runs its forward
    and backward as one step, then posts both sends (the schedule plan's hooks)."""
    at = InterleavedRank(shape, rank)
    total, first, last, combined, vpp = at.total, at.first, at.last, shape.combined, shape.vpp
    warmup, all_warmup = at.warmup
    remaining = total - warmup
    ops: list[Op] = [] if first else [P2PCall("recv_forward", (Transfer.RECV_PREV,))]
    handles = _Handles(ops)
    for k in range(warmup):
        compute, send_next = at.forward(k)
        recv_prev = at.receives(k, True) and k != total - 1
        ops.append(compute)
        receive = Transfer.RECV_PREV if recv_prev else None
        ops += filter(None, [p2p_call("send_forward_recv_forward", send_next, receive)])
        if k == warmup - 1 and not all_warmup:
            handles.post("send_backward_recv_backward", None, None if last else Transfer.RECV_NEXT)
    for k in range(remaining):
        forward_k = k + warmup
        f_compute, send_next = at.forward(forward_k)
        b_compute, send_prev = at.backward(k, combined)
        recv_prev = at.receives(forward_k, True) and k != remaining - 1
        receive_prev = Transfer.RECV_PREV if recv_prev else None
        receive_next = Transfer.RECV_NEXT if at.receives(k, False) else None
        wait_prev = not (first and f_compute.chunk == 0)
        wait_next = not (last and b_compute.chunk == vpp - 1)
        if combined:
            if wait_prev:
                handles.wait_receive(Transfer.RECV_PREV)
            if wait_next:
                handles.wait_receive(Transfer.RECV_NEXT)
            ops += [f_compute, b_compute]
            handles.post("send_forward_recv_forward", send_next, receive_prev)
            handles.post("send_backward_recv_backward", send_prev, receive_next)
            continue
        if wait_prev:
            handles.wait_receive(Transfer.RECV_PREV)
        ops.append(f_compute)
        handles.post("send_forward_recv_forward", send_next, receive_prev)
        if wait_next:
            handles.wait_receive(Transfer.RECV_NEXT)
        ops.append(b_compute)
        handles.post("send_backward_recv_backward", send_prev, receive_next)
    if all_warmup and not last:
        ops.append(P2PCall("recv_backward", (Transfer.RECV_NEXT,)))
    for k in range(remaining, total):
        if not (last and at.chunk(k, False) == vpp - 1) and k != 0:
            handles.wait_receive(Transfer.RECV_NEXT)
        compute, send_prev = at.backward(k)
        recv_next = at.receives(k, False) and k != total - 1
        ops.append(compute)
        receive = Transfer.RECV_NEXT if recv_next else None
        ops += filter(None, [p2p_call("send_backward_recv_backward", send_prev, receive)])
    if handles.send.get("prev") is not None:
        ops.append(Wait("send_prev", handles.send["prev"]))
    return ops
