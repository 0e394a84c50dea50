"""What the tune shows while it runs: a numbered line per phase, a bar per run on a terminal, plain
lines in a job log (``ray job logs`` has no terminal), and each phase's wall time."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ray_layout.runtime.run_spec import Watch

PHASES = ("size", "profile", "fit", "search", "A/B", "refit", "report")


class Phases:
    """A bar per phase and per run on a terminal; plain lines in a job log."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.seconds: dict[str, float] = {}

    @contextmanager
    def phase(self, name: str, what: str) -> Iterator[None]:
        step = f"[{PHASES.index(name) + 1}/{len(PHASES)}]"
        self.console.print(f"{step} [bold]{name}[/bold]: {what}", highlight=False)
        started = time.monotonic()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.monotonic() - started

    def say(self, text: str) -> None:
        self.console.print(f"  {text}", highlight=False, markup=False)

    @contextmanager
    def bars(self) -> Iterator[Bars]:
        live = self.console.is_terminal
        columns = (
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
        )
        with Progress(*columns, console=self.console, disable=not live) as progress:
            yield Bars(progress, None if live else self)


class Bars:
    """Progress of several runs: bars on a terminal, else a line every ``LOG_EVERY`` steps."""

    LOG_EVERY = 10

    def __init__(self, progress: Progress, log: Phases | None) -> None:
        self._progress, self._log = progress, log
        self._lock = threading.Lock()
        self._logged: dict[int, int] = {}

    def add(self, description: str, total: int) -> int:
        return self._progress.add_task(description, total=total)

    def update(self, task: int, completed: int, note: str = "") -> None:
        """Called from run threads as iterations come in."""
        self._progress.update(task, completed=completed)
        if self._log is None:
            return
        with self._lock:
            last = self._logged.get(task, 0)
            total = int(self._progress.tasks[task].total or 0)
            due = completed // self.LOG_EVERY > last // self.LOG_EVERY or completed >= total
            if (due and completed > last) or note:
                self._logged[task] = completed
                name = self._progress.tasks[task].description
                self._log.say(f"{name}: iteration {completed}/{total} {note}".rstrip())

    def watch(self, task: int) -> Watch:
        """A run watch that moves the bar with the iteration lines it sees (and never stops it);
        a retry starts the count again, so the bar shows the attempt that is running."""
        seen: dict[str, int] = {}

        def see(attempt: str, lines: list[str]) -> None:
            if attempt not in seen:
                seen.clear()
                with self._lock:
                    self._logged.pop(task, None)
            seen[attempt] = seen.get(attempt, 0) + len(lines)
            if lines:
                self.update(task, seen[attempt])

        return see
