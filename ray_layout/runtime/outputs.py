"""What each rank printed, parsed on its own node and sent back to the driver through Ray.

No shared file system is needed: a rank's actor keeps its output, parses it there
(:func:`rank_output`) and returns the records with the raw log; the driver merges the ranks'
records into one run (:func:`run_log`) and alone writes the store and, where asked, the logs.
Megatron prints the iteration lines and the timer blocks (every rank's values gathered) on the
last rank, and each rank with DP rank 0 prints its own memory line on its own output.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from ray_layout.errors import MeasurementError
from ray_layout.measure.log_records import ParsedLog
from ray_layout.measure.logs import parse_log


@dataclass(frozen=True)
class RankOutput:
    """One rank's raw output and what its node parsed of it (None: nothing Megatron's)."""

    log: bytes
    parsed: ParsedLog | None
    parse_error: str | None = None

    @property
    def text(self) -> str:
        return self.log.decode("utf-8", errors="replace")


def rank_output(text: str, source: str) -> RankOutput:
    """Parse one rank's output; a rank that printed nothing Megatron's (a middle rank with
    DP rank > 0, a rank that died at start-up) is kept with the reason instead."""
    try:
        parsed, error = parse_log(text, source), None
    except MeasurementError as exc:
        parsed, error = None, str(exc)
    return RankOutput(text.encode("utf-8", errors="replace"), parsed, error)


def run_log(outputs: Sequence[RankOutput | None]) -> tuple[str, ParsedLog]:
    """The run as one log: the last rank's timers and iterations, every rank's memory lines,
    the world sizes rank 0 states; the text is every rank's log in rank order (its digest is
    the stored run's id).  Raises :class:`MeasurementError` when the last rank's output is
    missing or holds nothing Megatron's."""
    if not outputs or outputs[-1] is None:
        raise MeasurementError("the last rank's output never came back (its actor was lost)")
    last = outputs[-1]
    if last.parsed is None:
        raise MeasurementError(f"the last rank's output: {last.parse_error}")
    parsed = [output.parsed for output in outputs if output and output.parsed]
    memory = sorted((m for p in parsed for m in p.memory), key=lambda m: (m.rank, m.iteration))
    world = next((p.world for p in parsed if p.world is not None), None)
    text = "".join(
        f"=== rank {rank} ===\n{output.text if output else '(lost)'}\n"
        for rank, output in enumerate(outputs)
    )
    return text, replace(last.parsed, memory=tuple(memory), world=world)


def write_logs(folder: Path, outputs: Sequence[RankOutput | None]) -> list[Path]:
    """Each rank's raw log as ``folder/rank-<r>.log`` on the driver's machine."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for rank, output in enumerate(outputs):
        path = folder / f"rank-{rank}.log"
        path.write_bytes(output.log if output else b"")
        paths.append(path)
    return paths
