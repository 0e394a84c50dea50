"""Critical paths as lower bounds for every layout: cuts taken from simulated layouts.

The schedule's dependency graph does not depend on the layout.  So the critical path of one
simulated layout is a path in every layout's graph, and its length under another layout's stage
durations is a lower bound on that layout's step: a sum over stages of (forward ops on the path)
x F_s + (backward ops) x B_s, the p2p transfers it crosses, and the step tail of the rank where it
ends.  That sum is separable over stages, so the least it can be over every completion of a
partial layout is a shortest-path dynamic programme over stage boundaries.  The exact search
takes such cuts from its incumbents: where the per-rank bounds of ``search.bounds`` miss how the
interleaved order chains two ranks (rank 0's chunk 1 waiting on the last rank's chunk 1, group
after group), a cut through those ops sees it.  Any duration set gives paths, fractional layouts
too (``search.relaxation`` simulates them), and a convex combination of paths (``combine``) is a
cut as well: never longer than the longest of them, still a sum over stages.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from search.item_sums import ItemSums
from search.schedule import Program
from search.simulator import simulate


@dataclass(frozen=True)
class PathCut:
    """A path through the schedule, as coefficients per flat stage."""

    forward: np.ndarray  # (S,) forward ops of each stage on the path
    backward: np.ndarray  # (S,) backward ops
    tail: np.ndarray  # (S,) 1 for the stages of the rank where the path ends (its tail follows)
    constant_ms: float  # the p2p transfers on the path


def critical_paths(
    program: Program,
    forward: np.ndarray,
    backward: np.ndarray,
    p2p: np.ndarray,
    tail: np.ndarray,
    longer_than: float = -np.inf,
) -> tuple[np.ndarray, list[PathCut]]:
    """Per rank, when it ends (its last op, then its ``tail``), and the longest path there for
    each rank that ends after ``longer_than``, in rank order: one simulation of one duration
    set (per-stage ``forward``/``backward`` ms, per-rank ``tail`` ms), walked back."""
    times = simulate(
        program, forward[:, None], backward[:, None], p2p, tail[:, None], keep_events=True
    )
    end = times.end[:, 0]
    ends = times.finish[:, 0] + tail
    walked = np.flatnonzero(ends > longer_than)
    return ends, [_walk_back(program, end, p2p, int(rank)) for rank in walked]


def critical_path(
    program: Program, forward: np.ndarray, backward: np.ndarray, p2p: np.ndarray, tail: np.ndarray
) -> PathCut:
    """The longest path of one duration set's simulated step, to the rank that ends it."""
    ends, paths = critical_paths(program, forward, backward, p2p, tail)
    return paths[int(np.argmax(ends))]


def _walk_back(program: Program, end: np.ndarray, p2p: np.ndarray, rank: int) -> PathCut:
    """From the rank's last op back to time zero, through whichever dependency ended last."""
    stages = program.shape.num_stages
    counts = np.zeros(2 * stages)
    constant = 0.0
    op = int(program.last_op[rank])
    while op >= 0:
        previous = int(program.previous[op])
        if program.is_compute[op]:
            counts[program.compute_slot[op]] += 1
            op = previous
            continue
        # a wait may end with the rank's previous op; its transfer started at its post
        own = int(program.previous[program.own[op]])
        posted = end[own] if own >= 0 else 0.0
        waits = program.own[op] != op
        best = (end[previous] if previous >= 0 else 0.0) if waits else -np.inf
        step_to, link_ms = previous, 0.0
        for partner, link in program.transfers[op]:
            before = int(program.previous[partner])
            partner_posted = end[before] if before >= 0 else 0.0
            done = max(posted, partner_posted) + p2p[link]
            if done > best:
                best, link_ms = done, p2p[link]
                step_to = own if posted >= partner_posted else before
        constant += link_ms
        op = step_to
    ends_on = (np.arange(stages) % program.shape.pp == rank).astype(float)
    return PathCut(counts[:stages], counts[stages:], ends_on, constant)


def combine(cuts: list[PathCut], weights: np.ndarray) -> PathCut:
    """A convex combination of paths: never longer than the longest of them, so a bound too,
    and still a sum over stages (weights >= 0 are normalised to sum to one)."""
    weights = np.asarray(weights, dtype=float) / np.sum(weights)
    return PathCut(
        *(
            sum(w * getattr(cut, name) for w, cut in zip(weights, cuts, strict=True))
            for name in ("forward", "backward", "tail", "constant_ms")
        )
    )


def allowed_ends(
    stages: int,
    items: int,
    stage: int,
    mtp_item: int | None,
    standalone: bool,
    first_mtp_stage: int,
) -> np.ndarray:
    """(items + 1,) which item a stage may end at (the exact search's own rules)."""
    ends = np.zeros(items + 1, dtype=bool)
    if stage == stages - 1:
        ends[items] = True
        return ends
    ends[1 : items - (stages - 1 - stage) + 1] = True
    if mtp_item is not None and (not standalone or stage < first_mtp_stage):
        ends[mtp_item + 1 :] = False
    return ends


def stage_costs(cut: PathCut, stage: int, sums: ItemSums) -> np.ndarray:
    """[a, b]: the path's length through stage ``stage`` holding items a..b-1."""
    f, tl = sums.forward, sums.tail
    return (
        cut.forward[stage] * (f[None, :] - f[:, None])
        + cut.backward[stage] * sums.stage_backward()
        + cut.tail[stage] * (tl[None, :] - tl[:, None])
    )


def least_completions(
    cut: PathCut, sums: ItemSums, mtp_item: int | None, standalone: bool, first_mtp_stage: int
) -> np.ndarray:
    """(S + 1, items + 1): the least length of the path's part in stages k.. when stage k
    starts at item a, over every completion (inf where none exists)."""
    stages, n = len(cut.forward), sums.items + 1
    best = np.full((stages + 1, n), np.inf)
    best[stages, n - 1] = 0.0
    starts, ends = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    for stage in range(stages - 1, -1, -1):
        table = stage_costs(cut, stage, sums) + best[stage + 1][None, :]
        valid = (ends > starts) & allowed_ends(
            stages, n - 1, stage, mtp_item, standalone, first_mtp_stage
        )[None, :]
        best[stage] = np.where(valid, table, np.inf).min(axis=1)
    return best


class CutBounds:
    """Lower bounds from several cuts at once, along the exact search's descent."""

    def __init__(
        self,
        cuts: list[PathCut],
        sums: ItemSums,
        mtp_item: int | None,
        standalone: bool,
        first_mtp_stage: int,
    ):
        stages = len(cuts[0].forward)
        self.costs = np.array([[stage_costs(cut, s, sums) for s in range(stages)] for cut in cuts])
        self.least = np.array(
            [least_completions(cut, sums, mtp_item, standalone, first_mtp_stage) for cut in cuts]
        )
        self.constant = np.array([cut.constant_ms for cut in cuts])[:, None]

    @property
    def start(self) -> np.ndarray:
        """What every cut has travelled before the first stage."""
        return np.zeros(len(self.constant))

    def children(
        self, travelled: np.ndarray, stage: int, start: int, ends: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """(bound, travelled by each cut) for the children ending ``stage`` at ``ends``."""
        through = travelled[:, None] + self.costs[:, stage, start, ends]
        bound = (through + self.least[:, stage + 1, ends] + self.constant).max(axis=0)
        return bound, through
