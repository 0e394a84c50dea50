"""The clock in megatron-core: its timers read it, and a blocking p2p receive waits for the
sender's stamp plus the transfer (with fake gloo requests, one process)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from launchers.megatron_core import clock_hooks
from launchers.megatron_core.clock_hooks import StampedP2P, time_timers_by
from launchers.megatron_core.logical_clock import LogicalClock
from tests.helpers.megatron_oracle import MEGATRON_CPU_WARNINGS


class FakeCpu:
    seconds = 0.0

    def __call__(self) -> float:
        return self.seconds


class Done:
    def wait(self) -> None:
        pass


@pytest.fixture
def fake_gloo(monkeypatch):
    """isend records the stamp sent; irecv fills in a stamp of 5 seconds."""
    sent = []

    def isend(tensor, peer, group=None, tag=0):
        sent.append((float(tensor.item()), peer, tag))
        return Done()

    def irecv(tensor, peer, group=None, tag=0):
        tensor.fill_(5.0)
        return Done()

    monkeypatch.setattr(dist, "isend", isend)
    monkeypatch.setattr(dist, "irecv", irecv)
    return sent


def test_a_blocking_receive_waits_for_the_sender_plus_the_transfer(fake_gloo):
    cpu = FakeCpu()
    clock = LogicalClock(cpu)
    cpu.seconds = 1.0
    hooks = StampedP2P(clock, lambda peer: 0.25)
    communicator = SimpleNamespace(pp_group=None, next_rank=1, prev_rank=1)

    def original(communicator, **kwargs):
        cpu.seconds += 100.0  # gloo's own time is not compute
        return torch.zeros(1), None, None

    hooks.communicate(
        original,
        communicator,
        tensor_send_next=torch.ones(1),
        tensor_send_prev=None,
        recv_prev=False,
        recv_next=True,
        tensor_shape=(1,),
    )
    assert fake_gloo == [(1.0, 1, clock_hooks._FORWARD_TAG)]
    assert clock.now() == 5.25


@pytest.mark.megatron
@pytest.mark.filterwarnings(*MEGATRON_CPU_WARNINGS)
def test_megatron_core_timers_read_the_clock(monkeypatch):
    from megatron.core import timers

    monkeypatch.setattr(timers, "time", timers.time)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    cpu = FakeCpu()
    clock = LogicalClock(cpu)
    time_timers_by(clock)
    group = timers.Timers(2, "all")
    group("forward-compute", log_level=2).start()
    cpu.seconds += 0.125
    group("forward-compute").stop()
    assert group("forward-compute").elapsed() == 0.125


@pytest.fixture
def fake_collectives(monkeypatch):
    """Every collective burns 7 CPU seconds and returns a handle whose wait burns 3 more, and the
    coalescing manager burns 6 as its block ends (where it issues the queued collectives); the
    originals come back after the test (hold_collectives replaces them in place)."""
    import importlib
    from contextlib import contextmanager

    import torch.distributed.distributed_c10d as c10d
    from megatron.core.distributed import param_and_grad_buffer

    cpu = FakeCpu()

    class Burning:
        def wait(self) -> None:
            cpu.seconds += 3.0

    def collective(*args, **kwargs):
        cpu.seconds += 7.0
        return Burning()

    for name in clock_hooks.COLLECTIVES:
        monkeypatch.setattr(dist, name, collective)
        monkeypatch.setattr(c10d, name, collective)
    for module in clock_hooks.EARLY_BINDERS:  # the names megatron-core bound them to
        module = importlib.import_module(module)
        for name, value in vars(module).items():
            if callable(value) and getattr(value, "__module__", "") == c10d.__name__:
                monkeypatch.setattr(module, name, value)

    @contextmanager
    def coalescing(group, async_ops=False):
        yield Burning()
        cpu.seconds += 6.0

    monkeypatch.setattr(c10d, "_coalescing_manager", coalescing)
    monkeypatch.setattr(param_and_grad_buffer, "_coalescing_manager", coalescing)
    return cpu


def test_collectives_and_their_handles_are_held_off_the_clock(fake_collectives):
    cpu = fake_collectives
    clock = LogicalClock(cpu)
    clock_hooks.hold_collectives(clock)
    cpu.seconds += 1.0
    handle = dist.all_reduce(torch.zeros(1), async_op=True)
    dist.barrier()
    handle.wait()
    cpu.seconds += 0.5
    assert clock.now() == 1.5


def test_a_collective_bound_to_a_megatron_core_name_is_held_too(fake_collectives, monkeypatch):
    from megatron.core.tensor_parallel import mappings

    monkeypatch.setattr(mappings, "dist_all_gather_func", dist.all_gather_into_tensor)
    clock = LogicalClock(fake_collectives)
    clock_hooks.hold_collectives(clock)
    mappings.dist_all_gather_func(torch.zeros(2), torch.zeros(1))  # the alltoall dispatcher's
    assert clock.now() == 0.0


def test_a_collective_the_cpu_adaptations_replaced_stays_replaced(fake_collectives, monkeypatch):
    import torch.distributed.distributed_c10d as c10d

    calls = []
    monkeypatch.setattr(dist, "all_to_all_single", lambda *a, **k: calls.append("adapted"))
    clock_hooks.hold_collectives(LogicalClock(fake_collectives))
    dist.all_to_all_single(torch.zeros(2), torch.zeros(2))
    c10d.all_to_all_single(torch.zeros(2), torch.zeros(2))
    assert calls == ["adapted"]


def test_ddp_coalesced_grad_reduce_is_held_off_the_clock(fake_collectives):
    from megatron.core.distributed import param_and_grad_buffer

    cpu = fake_collectives
    clock = LogicalClock(cpu)
    clock_hooks.hold_collectives(clock)
    cpu.seconds += 1.0
    with param_and_grad_buffer._coalescing_manager(None, async_ops=True) as coalesced:
        dist.all_reduce(torch.zeros(1), async_op=True)
    coalesced.wait()
    assert clock.now() == 1.0
