"""What the tune shows while it runs: a numbered line per phase and its wall time, plain lines in
a job log (no terminal) every few iterations, and bars moved by a run's iteration lines."""

from __future__ import annotations

import io
from types import SimpleNamespace

import pytest
from rich.console import Console

from ray_layout.tuning import display
from ray_layout.tuning.display import PHASES, Phases


def job_log() -> tuple[Phases, io.StringIO]:
    """Phases printing to a file, as in ``ray job logs``: no terminal."""
    out = io.StringIO()
    return Phases(Console(file=out, width=120)), out


@pytest.fixture
def clock(monkeypatch):
    now = SimpleNamespace(value=100.0)
    monkeypatch.setattr(display, "time", SimpleNamespace(monotonic=lambda: now.value))
    return now


def test_each_phase_is_numbered_and_its_wall_time_adds_up(clock):
    phases, out = job_log()
    with phases.phase("profile", "2 runs of PP=4"):
        clock.value += 30.0
    with pytest.raises(RuntimeError), phases.phase("profile", "again"):
        clock.value += 12.5
        raise RuntimeError("a run failed")  # its time still counts
    with phases.phase("report", "report.md"):
        clock.value += 1.0
    assert out.getvalue().splitlines() == [
        f"[2/{len(PHASES)}] profile: 2 runs of PP=4",
        f"[2/{len(PHASES)}] profile: again",
        f"[{len(PHASES)}/{len(PHASES)}] report: report.md",
    ]
    assert phases.seconds == {"profile": 42.5, "report": 1.0}


def test_a_note_is_indented_and_its_brackets_are_not_markup():
    phases, out = job_log()
    phases.say("your Megatron flags: replaced [bold]--train-iters[/bold] 500000 with 30")
    assert (
        out.getvalue()
        == "  your Megatron flags: replaced [bold]--train-iters[/bold] 500000 with 30\n"
    )


def test_in_a_job_log_a_run_says_its_progress_every_few_iterations_and_at_its_end():
    phases, out = job_log()
    with phases.bars() as bars:
        task = bars.add("profile Et*5|t*6|t*5|mL", 25)
        for completed in (3, 9, 10, 14, 21, 25, 25):
            bars.update(task, completed)
        bars.update(task, 25, "(from the store)")
    assert out.getvalue().splitlines() == [
        "  profile Et*5|t*6|t*5|mL: iteration 10/25",
        "  profile Et*5|t*6|t*5|mL: iteration 21/25",
        "  profile Et*5|t*6|t*5|mL: iteration 25/25",
        "  profile Et*5|t*6|t*5|mL: iteration 25/25 (from the store)",
    ]


def test_a_watch_moves_its_bar_by_the_iteration_lines_it_sees_and_never_stops_the_run():
    phases, out = job_log()
    with phases.bars() as bars:
        watch = bars.watch(bars.add("A/B candidate-1", 14))
        assert watch("attempt-1", [f"iteration {i}" for i in range(1, 9)]) is None
        assert watch("attempt-1", []) is None
        assert watch("attempt-1", ["iteration 9", "iteration 10"]) is None
    assert out.getvalue() == "  A/B candidate-1: iteration 10/14\n"


def test_a_retry_counts_its_own_iterations_from_zero():
    """The bar of a retried run shows the attempt that runs, never a count past its total."""
    phases, out = job_log()
    with phases.bars() as bars:
        task = bars.add("profile x", 12)
        watch = bars.watch(task)
        watch("run-a", [f"iteration {i}" for i in range(1, 11)])
        watch("run-a-retry1", [f"iteration {i}" for i in range(1, 13)])
        assert bars._progress.tasks[task].completed == 12
    assert out.getvalue().splitlines() == [
        "  profile x: iteration 10/12",
        "  profile x: iteration 12/12",
    ]


def test_on_a_terminal_there_are_bars_and_no_progress_lines():
    out = io.StringIO()
    phases = Phases(Console(file=out, width=120, force_terminal=True))
    with phases.bars() as bars:
        task = bars.add("profile x", 10)
        bars.update(task, 10)
    assert "profile x" in out.getvalue() and "iteration 10/10" not in out.getvalue()
