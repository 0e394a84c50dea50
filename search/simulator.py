"""The plain simulator: a compiled schedule evaluated wave by wave, with timelines.

A compute op ends ``duration`` after the rank's previous op; a blocking p2p call ends when every
transfer in it is done, a transfer starting when both its calls have been posted (a combined
send/receive completes only when both partners reach it).  With overlapped p2p a call that only
posts takes no time, and a wait ends when its transfer does (started at its post) or at once if
that is done already.  The step then adds each rank's tail: data-parallel
gradient sync and the optimizer step.  This is the reference every faster path
(``search.recurrence``, the bounds of ``search.exact``) is tested against.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from search.pipeline_ops import Compute, Wait
from search.schedule import Program


@dataclass(frozen=True)
class StepTimes:
    """Simulated times for a batch of duration sets (last axis: layout x sample)."""

    step: np.ndarray  # (batch,) step time
    finish: np.ndarray  # (PP, batch) when each rank's last pipeline op ends
    busy: np.ndarray  # (PP, batch) compute time of each rank
    tail: np.ndarray  # (PP, batch) gradient sync + optimizer of each rank
    start: np.ndarray | None = None  # (ops, batch), kept only when asked for a timeline
    end: np.ndarray | None = None

    @property
    def idle(self) -> np.ndarray:
        return self.step - self.busy - self.tail

    @property
    def bubble_fraction(self) -> np.ndarray:
        """Share of the pipeline phase the ranks spend waiting, averaged over ranks."""
        pipeline = self.finish.max(axis=0)
        return 1.0 - self.busy.mean(axis=0) / pipeline


def simulate(
    program: Program,
    forward_ms: np.ndarray,
    backward_ms: np.ndarray,
    p2p_ms: np.ndarray,
    tail_ms: np.ndarray | None = None,
    noise: np.ndarray | None = None,
    keep_events: bool = False,
    hidden_ms: np.ndarray | None = None,
) -> StepTimes:
    """Evaluate ``program`` for a batch of duration sets.

    ``forward_ms``/``backward_ms``: (stages, batch) per flat stage (chunk*PP + rank) and micro-
    batch; ``p2p_ms``: (PP, batch), one transfer across the boundary after rank r (r -> r+1,
    wrapping); ``tail_ms``: (PP, batch) after the pipeline; ``noise``: optional (compute ops,
    batch) multipliers for each compute op in program order of op ids; ``hidden_ms``: for
    combined 1F1B, (PP x VPP x VPP, batch) what each merged pair hides (``search.combined``).
    """
    forward_ms = np.atleast_2d(np.asarray(forward_ms, dtype=float))
    backward_ms = np.atleast_2d(np.asarray(backward_ms, dtype=float))
    batch = forward_ms.shape[1]
    durations = program.evaluation_table(forward_ms, backward_ms, hidden_ms)  # slot -> duration
    links = np.zeros((program.shape.pp + 1, batch))  # the extra row is the free padding link
    links[:-1] = np.broadcast_to(
        np.asarray(p2p_ms, dtype=float).reshape(program.shape.pp, -1), (program.shape.pp, batch)
    )
    count = len(program.ops)
    end = np.zeros((count + 1, batch))  # row -1 stays zero: "posted at time 0"
    start = np.zeros((count + 1, batch)) if keep_events else None
    compute_time = np.zeros((program.num_compute, batch))
    for wave in program.waves:
        if len(wave.compute):
            duration = durations[wave.compute_slot]
            if noise is not None:
                duration = duration * noise[wave.compute_index]
            compute_time[wave.compute_index] = duration
            posted = end[wave.compute_previous]
            end[wave.compute] = posted + duration
            if start is not None:
                start[wave.compute] = posted
        if len(wave.calls):
            posted = end[wave.call_previous]
            own_posted = end[wave.own_previous]  # a wait's transfer started at its post
            partner_posted = end[wave.partner_previous]  # (calls, 4, batch)
            done = np.maximum(own_posted[:, None], partner_posted) + links[wave.links]
            end[wave.calls] = np.maximum(posted, done.max(axis=1))
            if start is not None:
                start[wave.calls] = posted
    compute_rank = program.rank[program.is_compute]
    busy = np.zeros((program.shape.pp, batch))
    np.add.at(busy, compute_rank, compute_time)
    finish = end[program.last_op]
    tail = (
        np.zeros_like(finish)
        if tail_ms is None
        else np.broadcast_to(
            np.asarray(tail_ms, dtype=float).reshape(program.shape.pp, -1), finish.shape
        )
    )
    step = (finish + tail).max(axis=0)
    return StepTimes(
        step=step,
        finish=finish,
        busy=busy,
        tail=np.array(tail),
        start=start[:-1] if start is not None else None,
        end=end[:-1] if keep_events else None,
    )


@dataclass(frozen=True)
class Event:
    """One bar of a timeline: a computation or a p2p call on a rank."""

    rank: int
    label: str  # F3 / B3 (chunk suffix .c with VPP) or the p2p call's name
    is_compute: bool
    start: float
    end: float


def timeline(program: Program, times: StepTimes, column: int = 0) -> list[Event]:
    """The events of one duration set of a ``simulate(..., keep_events=True)`` result."""
    if times.start is None or times.end is None:
        raise ValueError("simulate with keep_events=True to draw a timeline")
    events = []
    for op_id, op in enumerate(program.ops):
        if isinstance(op, Compute):
            label = f"{op.kind}{op.microbatch}" + (f".{op.chunk}" if program.shape.vpp > 1 else "")
        elif isinstance(op, Wait):
            label = f"wait_{op.transfer}"
        else:
            label = op.name if op.blocking else f"post_{op.name}"
        events.append(
            Event(
                rank=int(program.rank[op_id]),
                label=label,
                is_compute=isinstance(op, Compute),
                start=float(times.start[op_id, column]),
                end=float(times.end[op_id, column]),
            )
        )
    return events


def stage_durations(values: Sequence[float], batch: int = 1) -> np.ndarray:
    """(stages,) per-stage numbers broadcast to the (stages, batch) shape ``simulate`` takes."""
    return np.repeat(np.asarray(values, dtype=float)[:, None], batch, axis=1)
