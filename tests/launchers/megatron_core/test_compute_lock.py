"""The node's compute lock: one holder at a time, a bounded wait that bypasses, the clock
holding it only while it runs."""

from __future__ import annotations

from launchers.megatron_core.compute_lock import LOCK_ENV, ComputeLock, default_lock_path
from launchers.megatron_core.logical_clock import LogicalClock


class Recorder:
    def __init__(self) -> None:
        self.events: list[str] = []

    def acquire(self) -> None:
        self.events.append("acquire")

    def release(self) -> None:
        self.events.append("release")


def test_a_second_holder_waits_then_bypasses_after_its_patience(tmp_path):
    first = ComputeLock(tmp_path / "lock")
    second = ComputeLock(tmp_path / "lock", patience_s=0.05)
    first.acquire()
    second.acquire()
    assert first.held and not second.held and second.bypasses == 1
    second.acquire(patience_s=0.0)
    assert second.bypasses == 2
    first.release()
    second.acquire()
    assert second.held and second.bypasses == 2
    second.release()


def test_every_rank_of_a_node_names_one_file(monkeypatch, tmp_path):
    monkeypatch.delenv(LOCK_ENV, raising=False)
    assert default_lock_path() == default_lock_path()
    monkeypatch.setenv(LOCK_ENV, str(tmp_path / "mine"))
    assert default_lock_path() == tmp_path / "mine"


def test_the_clock_holds_the_lock_while_it_runs_and_gives_it_up_while_held():
    lock = Recorder()
    clock = LogicalClock(lambda: 0.0, lock=lock)
    assert lock.events == ["acquire"]
    with clock.hold():
        assert lock.events == ["acquire", "release"]
        with clock.hold():
            pass
        assert lock.events == ["acquire", "release"]
    assert lock.events == ["acquire", "release", "acquire"]


def test_waiting_for_the_lock_is_not_compute(tmp_path):
    cpu = [0.0]

    class SlowLock(Recorder):
        def acquire(self) -> None:
            cpu[0] += 4.0  # a polling wait that cost CPU time

    clock = LogicalClock(lambda: cpu[0], lock=SlowLock())
    cpu[0] += 1.0
    with clock.hold():
        pass
    assert clock.now() == 1.0
