"""The emulated clock: an op ends at its scheduled time, real overhead inside it is absorbed,
overhead past it is counted (never slept back), and the summary line says how much."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from launchers.emulated import clock as clock_module
from launchers.emulated.clock import Clock


class RealTime:
    """Wall-clock time the test moves: by the work it says a rank did, and by the rank's sleeps."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def time(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


@pytest.fixture
def real(monkeypatch: pytest.MonkeyPatch) -> RealTime:
    fake = RealTime()
    monkeypatch.setattr(clock_module, "time", SimpleNamespace(time=fake.time, sleep=fake.sleep))
    return fake


def test_an_op_sleeps_only_what_its_overhead_left_of_its_cost(real):
    clock = Clock(time_scale=0.1)  # 10 emulated ms are 1 real ms
    assert clock.seconds(10.0) == pytest.approx(1e-3)
    real.now += 0.0004  # Python and gloo work inside the op
    clock.advance(10.0)
    assert real.slept == [pytest.approx(0.0006)]
    assert clock.now == pytest.approx(1000.001) and real.now == pytest.approx(clock.now)
    assert (clock.ops, clock.late_ops) == (1, 0)


def test_overhead_past_the_deadline_is_counted_and_the_schedule_keeps_its_time(real):
    clock = Clock(time_scale=0.1)
    real.now += 0.003  # 3 real ms of work in an op of 1 real ms
    clock.advance(10.0)
    assert real.slept == [] and clock.now == pytest.approx(1000.001)  # not moved to real time
    real.now += 0.0005
    clock.advance(20.0)  # scheduled to end at 1000.003, real time is 1000.0035
    assert (clock.ops, clock.late_ops) == (2, 2)
    assert clock.late_seconds == pytest.approx(0.002 + 0.0005)
    assert clock.worst_late_seconds == pytest.approx(0.002)
    assert clock.summary(3) == (
        "emulator: rank 3: 2 of 2 ops ended past their deadline, by 12.500 ms on average and "
        "20.000 ms at most (emulated)"
    )


def test_a_peers_stamp_moves_the_schedule_forward_never_back(real):
    clock = Clock(time_scale=1.0)
    clock.reach(1000.5)  # the sender's scheduled time: the receiver resumes there
    assert clock.now == 1000.5 and real.slept == [0.5]
    clock.reach(999.0)  # an old stamp
    assert clock.now == 1000.5
    real.now = 1005.0  # work that is not emulated (logging)
    clock.anchor()
    assert clock.now == 1005.0
    clock.anchor()
    assert clock.now == 1005.0


def test_a_clock_that_was_never_late_says_so(real):
    clock = Clock(time_scale=0.5)
    clock.advance(4.0)
    assert clock.summary(0) == (
        "emulator: rank 0: 0 of 1 ops ended past their deadline, by 0.000 ms on average and "
        "0.000 ms at most (emulated)"
    )
