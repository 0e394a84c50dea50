"""The logical clock wired into megatron-core: its ``Timers`` read it, its p2p calls carry it,
its collectives are held off it.

Every ``P2PCommunicator._communicate`` call (blocking or overlapped) posts, beside its tensors,
one float64 stamp per send (the sender's clock at the post) and one receive per receive; a
receive ends at max(own clock, the sender's stamp + the link's transfer time), applied when the
call waits for it (at once when blocking, at the handle's ``wait()`` when overlapped).  The
communication itself is held off the clock: the rank's CPU time in gloo is not compute.

Every other collective (DDP's grad all-reduce and its coalescing manager, the tied embedding's
all-reduce, the optimizer's grad norm, MoE all-to-alls, barriers) is held too, to its handle's
``wait()`` when asynchronous: a rank waiting on a peer must not hold the compute lock.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

from launchers.megatron_core.logical_clock import LogicalClock, receive_end

# A forward message goes send_next -> recv_prev, a backward one send_prev -> recv_next; with
# PP 2 both directions link the same two processes, so each has its own tag.
_FORWARD_TAG, _BACKWARD_TAG = 71, 72


# torch.distributed's collectives megatron-core may call on this path; p2p is StampedP2P's
COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "_all_gather_base",
    "all_gather_object",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "_reduce_scatter_base",
    "all_to_all",
    "all_to_all_single",
    "broadcast",
    "broadcast_object_list",
    "reduce",
    "gather",
    "scatter",
    "barrier",
    "monitored_barrier",
)


# megatron-core modules that bind a collective to a name of their own when imported
# (``dist_all_gather_func = torch.distributed.all_gather_into_tensor``, ``_coalescing_manager``)
EARLY_BINDERS = (
    "megatron.core.tensor_parallel.mappings",
    "megatron.core.transformer.multi_token_prediction",
    "megatron.core.distributed.param_and_grad_buffer",
)


def hold_collectives(clock: LogicalClock) -> None:
    """Hold every collective off the clock (and an async one's handle until its ``wait()``),
    under torch.distributed's names and under any name a megatron-core module bound it to."""
    import importlib

    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    for module in EARLY_BINDERS:
        importlib.import_module(module)
    held: dict[int, Callable[..., Any]] = {}
    for name in COLLECTIVES:
        for module in (dist, c10d):  # each its own: the CPU adaptations replace some in dist
            call = getattr(module, name)
            if id(call) not in held:
                held[id(call)] = _held_call(clock, call)
            setattr(module, name, held[id(call)])
    manager = c10d._coalescing_manager
    held[id(manager)] = _held_coalescing(clock, manager)
    for module_name, module in list(sys.modules.items()):
        if module is None or not module_name.startswith("megatron.core"):
            continue
        for name, value in list(vars(module).items()):
            if id(value) in held:
                setattr(module, name, held[id(value)])


def _held_call(clock: LogicalClock, call: Callable[..., Any]) -> Callable[..., Any]:
    def held(*args: Any, **kwargs: Any) -> Any:
        with clock.hold():
            return _HeldWork.around(clock, call(*args, **kwargs))

    return held


def _held_coalescing(clock: LogicalClock, manager: Callable[..., Any]) -> Callable[..., Any]:
    @contextmanager
    def held(*args: Any, **kwargs: Any) -> Iterator[Any]:
        with clock.hold(), manager(*args, **kwargs) as coalesced:
            yield _HeldWork.around(clock, coalesced)

    return held


class _HeldWork:
    """An async collective's handle whose ``wait()`` is held off the clock."""

    def __init__(self, clock: LogicalClock, work: Any) -> None:
        self._clock, self._work = clock, work

    @classmethod
    def around(cls, clock: LogicalClock, result: Any) -> Any:
        return cls(clock, result) if hasattr(result, "wait") else result

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        with self._clock.hold():
            return self._work.wait(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._work, name)


def time_timers_by(clock: LogicalClock) -> None:
    """megatron-core's ``Timers`` call ``time.time()``: make that the rank's logical clock."""
    from megatron.core import timers

    timers.time = SimpleNamespace(time=clock.time)


class StampedP2P:
    """Wraps ``P2PCommunicator._communicate`` so that messages carry the sender's clock."""

    def __init__(self, clock: LogicalClock, transfer_seconds: Callable[[int], float]) -> None:
        self.clock = clock
        self.transfer_seconds = transfer_seconds  # by peer global rank

    def install(self) -> None:
        """Replace the communicator's ``_communicate`` in this process."""
        from megatron.core.pipeline_parallel.p2p_communication import P2PCommunicator

        original = P2PCommunicator._communicate
        hooks = self

        def communicate(communicator: Any, **kwargs: Any) -> Any:
            return hooks.communicate(original, communicator, **kwargs)

        P2PCommunicator._communicate = communicate

    def communicate(self, original: Callable[..., Any], communicator: Any, **kwargs: Any) -> Any:
        """The call as megatron-core makes it, with stamps posted beside its tensors."""
        import torch
        import torch.distributed as dist

        with self.clock.hold():
            posted = self.clock.now()
            group = communicator.pp_group
            sends, receives = [], []  # (request, stamp, key) / (request, buffer, peer, key)
            for tensor_key, peer, tag, key in (
                ("tensor_send_next", communicator.next_rank, _FORWARD_TAG, "send_next"),
                ("tensor_send_prev", communicator.prev_rank, _BACKWARD_TAG, "send_prev"),
            ):
                if kwargs.get(tensor_key) is not None:
                    stamp = torch.tensor([posted], dtype=torch.float64)
                    sends.append((dist.isend(stamp, peer, group=group, tag=tag), stamp, key))
            for flag, peer, tag, key in (
                ("recv_prev", communicator.prev_rank, _FORWARD_TAG, "recv_prev"),
                ("recv_next", communicator.next_rank, _BACKWARD_TAG, "recv_next"),
            ):
                if kwargs.get(flag):
                    buffer = torch.empty(1, dtype=torch.float64)
                    request = dist.irecv(buffer, peer, group=group, tag=tag)
                    receives.append((request, buffer, peer, key))
            received_prev, received_next, requests = original(communicator, **kwargs)
        if requests is None or not isinstance(requests, dict):  # blocking: already waited
            with self.clock.hold():
                for request, *_ in sends:
                    request.wait()
                for request, *_ in receives:
                    request.wait()
            for _, buffer, peer, _ in receives:
                self._arrived(buffer, peer)
            return received_prev, received_next, requests
        return received_prev, received_next, self._overlapped(requests, sends, receives)

    def _overlapped(self, requests: dict, sends: list, receives: list) -> dict:
        """Overlapped p2p: each handle's ``wait()`` also waits its stamp (and moves the clock)."""
        wrapped = dict(requests)
        for request, _stamp, key in sends:
            if key in requests:
                wrapped[key] = _Pair(requests[key], request, self.clock, lambda: None)
        for request, buffer, peer, key in receives:
            if key in requests:
                wrapped[key] = _Pair(
                    requests[key],
                    request,
                    self.clock,
                    lambda b=buffer, p=peer: self._arrived(b, p),
                )
        return wrapped

    def _arrived(self, buffer: Any, peer: int) -> None:
        sent = float(buffer.item())
        self.clock.reach(receive_end(self.clock.now(), sent, self.transfer_seconds(peer)))


class _Pair:
    """A megatron-core request and its stamp's request, waited together."""

    def __init__(self, data: Any, stamp: Any, clock: LogicalClock, done: Callable[[], None]):
        self.data, self.stamp, self.clock, self.done = data, stamp, clock, done

    def wait(self) -> None:
        with self.clock.hold():
            self.data.wait()
            self.stamp.wait()
        self.done()
