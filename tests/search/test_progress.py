"""The progress clock: silent until the work has run its interval, then a line each interval,
described only when due, and nothing at all without a reader."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from search import progress as progress_module
from search.progress import ProgressClock


@pytest.fixture
def now(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The clock's monotonic time, set by the test."""
    current = [100.0]
    monkeypatch.setattr(progress_module, "time", SimpleNamespace(monotonic=lambda: current[0]))
    return current


def test_a_line_is_due_once_the_interval_has_passed_and_every_interval_after(now):
    lines: list[str] = []
    asked: list[float] = []

    def describe() -> str:
        asked.append(now[0])
        return "12 of 40 layouts"

    clock = ProgressClock(lines.append, every_s=2.0)
    for t in (100.5, 101.9, 102.0, 103.0, 104.2, 106.1, 106.2):
        now[0] = t
        clock.tick(describe)
    assert lines == ["2 s: 12 of 40 layouts", "4 s: 12 of 40 layouts", "6 s: 12 of 40 layouts"]
    assert asked == [102.0, 104.2, 106.2]  # described only when due: 2 s after the last line
    assert clock.elapsed_s == pytest.approx(6.2)


def test_without_a_reader_nothing_is_described(now):
    clock = ProgressClock(None, every_s=0.0)
    now[0] = 1e6
    clock.tick(lambda: pytest.fail("described with no one to report to"))


def test_the_default_interval_is_read_when_the_clock_starts(now, monkeypatch):
    monkeypatch.setattr(progress_module, "PROGRESS_AFTER_S", 5.0)
    lines: list[str] = []
    clock = ProgressClock(lines.append)
    now[0] = 104.9
    clock.tick(lambda: "early")
    now[0] = 105.0
    clock.tick(lambda: "due")
    assert clock.every_s == 5.0 and lines == ["5 s: due"]
