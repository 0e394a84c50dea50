"""The logical clock: compute advances it by CPU time, a hold stops it, a receive waits for the
sender's clock plus the transfer."""

from __future__ import annotations

from launchers.megatron_core.logical_clock import LogicalClock, receive_end


class FakeCpu:
    def __init__(self) -> None:
        self.seconds = 10.0

    def __call__(self) -> float:
        return self.seconds


def test_compute_advances_the_clock_by_cpu_time():
    cpu = FakeCpu()
    clock = LogicalClock(cpu)
    cpu.seconds += 0.25
    assert clock.now() == 0.25
    assert clock.time() == clock.now()


def test_a_hold_keeps_communication_and_logging_off_the_clock():
    cpu = FakeCpu()
    clock = LogicalClock(cpu)
    cpu.seconds += 1.0
    with clock.hold():
        cpu.seconds += 5.0
        with clock.hold():
            cpu.seconds += 5.0
        assert clock.now() == 1.0
    cpu.seconds += 0.5
    assert clock.now() == 1.5


def test_reach_moves_only_forward():
    cpu = FakeCpu()
    clock = LogicalClock(cpu)
    cpu.seconds += 2.0
    clock.reach(1.0)
    assert clock.now() == 2.0
    clock.reach(3.0)
    cpu.seconds += 0.5
    assert clock.now() == 3.5


def test_a_receive_ends_after_the_message_crossed_the_link():
    assert receive_end(own=1.0, sent=2.0, transfer_seconds=0.5) == 2.5
    assert receive_end(own=3.0, sent=2.0, transfer_seconds=0.5) == 3.0
