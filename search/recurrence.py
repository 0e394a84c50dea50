"""The step time as a straight-line max-plus recurrence: the planner's fast evaluator.

Every op's end time is a max of sums of earlier end times: a compute op ends its duration after
the rank's previous op; a p2p call ends when its last transfer is done, a transfer finishing
``link`` after both calls are posted; with overlapped p2p a post ends at once and a wait when
its transfer (from its post) is done, or with the rank's previous op.  The compiled schedule is
turned once into a list of such instructions in dependency order, and a batch of layouts is
evaluated by running the list over contiguous (batch,) vectors: no gathers over an (ops x batch)
table as in ``search.simulator``, and only the posted times still to be read are kept.  The
result equals the plain simulator's exactly (the same additions in the same order; tested on
random spaces).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import numpy as np

from search.pipeline_ops import ScheduleShape
from search.schedule import Program, compile_schedule


@dataclass(frozen=True)
class Instruction:
    """One op: a computation (``slot``/``noise_row`` set) or a p2p call (``transfers`` set)."""

    rank: int
    slot: int  # compute: row of the program's evaluation table; -1 for a call
    noise_row: int  # compute: its row among the compute ops (per-op noise)
    call: int  # p2p call: its op id, the key of its posted time
    own: int  # the call whose posted time starts its transfers: itself, or a wait's post
    transfers: tuple[tuple[int, tuple[int, ...]], ...]  # (link, partner calls over that link)
    posts: int  # the op id of the rank's next op if that is a call, else -1
    frees: tuple[int, ...]  # calls whose posted time nobody reads after this op


@cache
def instructions(shape: ScheduleShape) -> tuple[tuple[Instruction, ...], tuple[int, ...]]:
    """The program as instructions in dependency order, and the calls posted at time zero."""
    program = compile_schedule(shape)
    following = {int(prev): op for op, prev in enumerate(program.previous) if prev >= 0}
    posting = ~program.is_compute & (program.own == np.arange(len(program.own)))
    last_read: dict[int, int] = {}
    for position, op in enumerate(program.order):
        if not program.is_compute[op]:
            last_read[int(program.own[op])] = position
            for partner, _ in program.transfers[op]:
                last_read[partner] = max(last_read.get(partner, -1), position)
    frees: dict[int, list[int]] = {}
    for call, position in last_read.items():
        frees.setdefault(position, []).append(call)
    noise_rows = np.cumsum(program.is_compute) - 1
    code = []
    for position, op in enumerate(program.order):
        after = following.get(op)
        by_link: dict[int, list[int]] = {}
        for partner, link in program.transfers[op]:
            by_link.setdefault(link, []).append(partner)
        code.append(
            Instruction(
                rank=int(program.rank[op]),
                slot=int(program.evaluation_slot[op]),
                noise_row=int(noise_rows[op]),
                call=-1 if program.is_compute[op] else op,
                own=int(program.own[op]),
                transfers=tuple((link, tuple(p)) for link, p in by_link.items()),
                posts=after if after is not None and posting[after] else -1,
                frees=tuple(frees.get(position, ())),
            )
        )
    first_calls = tuple(op for op, prev in enumerate(program.previous) if prev < 0 and posting[op])
    return tuple(code), first_calls


def finish_times(
    program: Program,
    durations: np.ndarray,
    p2p_ms: np.ndarray,
    noise: np.ndarray | None = None,
) -> np.ndarray:
    """(PP, batch) when each rank's last pipeline op ends.

    ``durations``: the program's evaluation table (``Program.evaluation_table``); ``p2p_ms``:
    (PP,) or (PP, batch) per boundary; ``noise``: optional (compute ops, batch) multipliers.
    """
    code, first_calls = instructions(program.shape)
    zero = np.zeros(durations.shape[1])
    links = list(np.asarray(p2p_ms, dtype=float).reshape(program.shape.pp, -1))
    links = [float(link[0]) if len(link) == 1 else link for link in links]
    clock = [zero] * program.shape.pp
    posted = dict.fromkeys(first_calls, zero)
    for op in code:
        if op.call < 0:
            duration = durations[op.slot]
            if noise is not None:
                duration = duration * noise[op.noise_row]
            done = clock[op.rank] + duration
        else:
            own = posted[op.own]
            done = None
            for link, partners in op.transfers:
                ready = np.maximum(own, posted[partners[0]])
                for partner in partners[1:]:
                    np.maximum(ready, posted[partner], out=ready)
                ready += links[link]
                done = ready if done is None else np.maximum(done, ready, out=done)
            if op.own != op.call:  # a wait ends no sooner than the rank's previous op
                done = np.maximum(done, clock[op.rank], out=done)
            elif done is None:  # a post takes no time
                done = clock[op.rank]
        clock[op.rank] = done
        if op.posts >= 0:
            posted[op.posts] = done
        for call in op.frees:
            del posted[call]
    return np.array(clock)


def step_ms(
    program: Program,
    forward_ms: np.ndarray,
    backward_ms: np.ndarray,
    p2p_ms: np.ndarray,
    tail_ms: np.ndarray,
    noise: np.ndarray | None = None,
    hidden_ms: np.ndarray | None = None,
) -> np.ndarray:
    """(batch,) step time: the slowest rank's pipeline end plus its tail.  ``forward_ms``,
    ``backward_ms``, ``tail_ms`` and ``hidden_ms`` as ``simulator.simulate`` takes them."""
    table = program.evaluation_table(forward_ms, backward_ms, hidden_ms)
    durations = np.ascontiguousarray(table, dtype=float)
    return (finish_times(program, durations, p2p_ms, noise) + tail_ms).max(axis=0)
