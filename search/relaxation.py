"""A lower bound on every layout's step: the layout problem with fractional stage boundaries.

Every path through the schedule's dependency graph is a path for every layout, and its length is
linear in the stage durations (``search.paths``).  Stage durations are linear in how many items
of each run of equal items every stage holds, and every layout's counts lie in a polytope (the
runs in order, each stage non-empty, E first, MTP and L where the rules put them).  So

    min theta  s.t.  theta >= length of path p, for every path p, over that polytope

is a linear programme whose optimum is at most the best layout's step (the MTP-standalone factor,
the memory limit and a standalone rank's embedding copy only make layouts slower or fewer).  It
has one constraint per path, far too many to list, so they are generated (cutting planes): solve
with the paths known, simulate a fractional layout with the plain simulator, add the longest path
to each rank that ends after theta, repeat until a simulated fractional step meets theta.  The
layout simulated lies halfway between the LP's point and the best fractional layout so far
(in-out stabilisation: half the rounds of plain Kelley).  Each theta on the way is already a
bound; rows far from binding leave the LP and come back when a fractional layout needs them.
Where interleaving chains the ranks through blocking p2p, no path of one rank binds alone; the
LP finds the mix of paths that does (DeepSeek-V3, PP 16, VPP 2: within 0.3-0.4% of the best
layout, where per-rank sums leave 16-19%).

The LP's dual weights on the paths combine them into one fractional path
(``search.paths.combine``): its length is never above the longest path's, so it bounds every
layout, and it is a sum over stages, so the exact search applies it at every node, where the
placed stages count exactly.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
from scipy.optimize import linprog

from search.item_sums import ItemSums
from search.paths import PathCut, combine, critical_paths, least_completions
from search.progress import ProgressClock
from search.schedule import Program
from search.space import LayoutSpace

DROP = 0.2  # a path row this far (relative) below theta leaves the LP
STEP = 0.5  # in-out: how far from the best fractional layout towards the LP's point to look
TOLERANCE = 1e-7  # relative: the LP solver's; a fractional step this close to theta meets it


@dataclass(frozen=True)
class Relaxation:
    """The relaxation's answer: a bound on every layout's step and the path mix that makes it."""

    bound_ms: float  # no layout is faster: the mixed path's least length over every layout
    lp_ms: float  # the LP's optimum with the paths generated (no fractional layout is faster)
    fractional_ms: float  # the best simulated step of a fractional layout (the LP's optimum
    # lies between lp_ms and this)
    mixed: PathCut | None  # the dual-weighted combination of the paths
    paths: int  # paths generated
    rounds: int
    converged: bool  # the bound is the relaxation's optimum (it meets a fractional layout)


@dataclass(frozen=True)
class _Polytope:
    """The fractional layouts: ``below[g, k]`` items of run g in stages 0..k (k < S - 1)."""

    sizes: np.ndarray  # (runs,) items per run
    per_item: np.ndarray  # (runs, 3) forward, backward, tail ms of one item of the run
    upper: list[tuple[np.ndarray, float]]  # rows A x <= b over the below variables
    bounds: list[tuple[float, float]]

    @property
    def runs(self) -> int:
        return len(self.sizes)


def _runs(sums: ItemSums, alone: set[int]) -> tuple[np.ndarray, np.ndarray]:
    """Consecutive items with equal costs as one run; ``alone`` items are runs of their own."""
    items = np.stack([np.diff(sums.forward), np.diff(sums.backward), np.diff(sums.tail)], axis=1)
    sizes, costs = [], []
    for item, cost in enumerate(items):
        joins = sizes and item not in alone and item - 1 not in alone
        if joins and np.allclose(costs[-1], cost, rtol=1e-12, atol=1e-12):
            sizes[-1] += 1
        else:
            sizes.append(1)
            costs.append(cost)
    return np.array(sizes), np.array(costs)


def _polytope(space: LayoutSpace, sums: ItemSums) -> _Polytope:
    stages, n_items = space.num_stages, sums.items
    mtp_item = space.num_layers + 1 if space.mtp_num_layers else None
    alone = {0, n_items - 1} | ({mtp_item} if mtp_item is not None else set())
    sizes, per_item = _runs(sums, alone)
    first_item = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    runs, cuts = len(sizes), stages - 1
    width = runs * cuts + 1  # + theta

    def var(run: int, k: int) -> int:
        return run * cuts + k

    upper = []
    for run in range(runs):
        for k in range(cuts - 1):  # counts below a boundary grow with the boundary
            row = np.zeros(width)
            row[var(run, k)], row[var(run, k + 1)] = 1.0, -1.0
            upper.append((row, 0.0))
        if run + 1 < runs:  # the next run starts once this one is complete: in shares,
            for k in range(cuts):  # the next run's share below k is at most this run's
                row = np.zeros(width)
                row[var(run + 1, k)], row[var(run, k)] = sizes[run], -float(sizes[run + 1])
                upper.append((row, 0.0))
    for stage in range(stages):  # every stage holds one item at least
        row = np.zeros(width)
        for run in range(runs):
            if stage < cuts:
                row[var(run, stage)] -= 1.0
            if stage:
                row[var(run, stage - 1)] += 1.0
        upper.append((row, -1.0 + (n_items if stage == cuts else 0.0)))
    bounds = [(0.0, float(sizes[run])) for run in range(runs) for _ in range(cuts)]
    bounds.append((None, None))
    bounds[var(0, 0)] = (1.0, float(sizes[0]))  # E opens stage 0
    if mtp_item is not None:
        mtp_run = int(np.searchsorted(first_item, mtp_item))
        last_free = (
            space.num_stages - 1 if not space.allow_standalone_mtp else space.first_mtp_stage
        )
        for k in range(min(last_free, cuts)):
            bounds[var(mtp_run, k)] = (0.0, 0.0)
    bounds[var(runs - 1, cuts - 1)] = (0.0, 0.0)  # L closes the last stage
    return _Polytope(sizes, per_item, upper, bounds)


def _contents(polytope: _Polytope, below: np.ndarray, stages: int) -> np.ndarray:
    """(runs, S) items of each run in each stage."""
    table = below.reshape(polytope.runs, stages - 1)
    full = np.concatenate([np.zeros((polytope.runs, 1)), table, polytope.sizes[:, None]], axis=1)
    return np.diff(full, axis=1)


def _path_row(polytope: _Polytope, cut: PathCut, stages: int) -> tuple[np.ndarray, float]:
    """The path's constraint ``length <= theta`` as a row over (below, theta)."""
    # per (run, stage): the path's ms per item of the run in the stage
    weight = (
        polytope.per_item[:, :1] * cut.forward
        + polytope.per_item[:, 1:2] * cut.backward
        + polytope.per_item[:, 2:] * cut.tail
    )
    # contents[g, s] = below[g, s] - below[g, s - 1] (with below[g, S-1] = size): telescoped
    coefficients = weight[:, :-1] - weight[:, 1:]
    constant = float(polytope.sizes @ weight[:, -1]) + cut.constant_ms
    row = np.append(coefficients.ravel(), -1.0)
    return row, -constant


def _durations(polytope: _Polytope, below: np.ndarray, pp: int, stages: int):
    contents = _contents(polytope, below, stages)
    forward, backward, tail = (polytope.per_item[:, i] @ contents for i in range(3))
    return forward, backward, tail.reshape(stages // pp, pp).sum(axis=0)


def relax(
    space: LayoutSpace,
    program: Program,
    p2p_ms: np.ndarray,
    sums: ItemSums,
    seeds: list[PathCut],
    time_limit_s: float = 2.0,
    rounds: int = 200,
    clock: ProgressClock | None = None,
) -> Relaxation:
    """Cutting planes from the ``seeds`` paths (say, those of the incumbents) until a
    fractional layout's simulated step meets the LP's optimum, or the budget ends."""
    stages, pp = space.num_stages, space.pp
    polytope = _polytope(space, sums)
    structure = np.array([row for row, _ in polytope.upper])
    limits = np.array([b for _, b in polytope.upper])
    paths: list[PathCut] = []
    rows: list[np.ndarray] = []
    constants: list[float] = []
    index: dict[bytes, int] = {}

    def add(cuts: list[PathCut]) -> Iterator[int]:
        """The paths' indices, adding those not known yet."""
        for cut in cuts:
            row, constant = _path_row(polytope, cut, stages)
            key = np.round(np.append(row, constant), 6).tobytes()
            if key not in index:
                index[key] = len(paths)
                paths.append(cut)
                rows.append(row)
                constants.append(constant)
            yield index[key]

    def cutting(indices: Iterator[int], point: np.ndarray, theta: float) -> set[int]:
        """The paths among ``indices`` longer than theta at the LP's point."""
        return {i for i in indices if rows[i][:-1] @ point - constants[i] > theta * (1 + TOLERANCE)}

    active = sorted(set(add(seeds)))  # rows in the LP: one far from binding is dropped
    objective = np.zeros(structure.shape[1])
    objective[-1] = 1.0
    deadline = time.monotonic() + time_limit_s
    lp, upper, center, mixed, done = -np.inf, np.inf, None, None, 0
    for count in range(1, rounds + 1):
        done = count
        solution = linprog(
            objective,
            A_ub=np.vstack([structure, *(rows[i] for i in active)]),
            b_ub=np.concatenate([limits, [constants[i] for i in active]]),
            bounds=polytope.bounds,
            method="highs-ds",
            options={"presolve": False},
        )
        if solution.status != 0:
            break
        point, theta = solution.x[:-1], float(solution.x[-1])
        weights = np.maximum(-solution.ineqlin.marginals[len(limits) :], 0.0)
        if theta > lp and weights.sum() > 0:
            lp, used = theta, np.flatnonzero(weights)
            mixed = combine([paths[active[i]] for i in used], weights[used])
        slack = solution.ineqlin.residual[len(limits) :]
        active = [i for i, gap in zip(active, slack, strict=True) if gap <= DROP * abs(theta)]
        joining: set[int] = set()
        # query between the LP's point and the best fractional layout so far (in-out: fewer
        # zig-zags), or the LP's point itself when the paths found there do not cut it off
        for query in [point] if center is None else [STEP * point + (1 - STEP) * center, point]:
            forward, backward, tail = _durations(polytope, query, pp, stages)
            ends, found = critical_paths(program, forward, backward, p2p_ms, tail, theta)
            if ends.max() < upper:
                center, upper = query, float(ends.max())
            joining = cutting(add(found), point, theta) - set(active)
            if joining or upper <= theta * (1 + TOLERANCE):
                break
        if upper <= theta * (1 + TOLERANCE) or not joining or time.monotonic() > deadline:
            break
        active += sorted(joining)
        if clock is not None:
            line = (
                f"exact search, LP relaxation round {done}, {len(paths)} schedule paths, "
                f"no layout faster than {lp:,.1f} ms"
            )
            clock.tick(lambda line=line: line)
    converged = upper <= lp * (1 + TOLERANCE)
    if mixed is None:
        return Relaxation(-np.inf, lp, upper, None, len(paths), done, converged)
    # the bound is the mixed path's own least length over the layouts, not the LP's theta:
    # valid for any weights, whatever the solver's tolerances
    mtp_item = space.num_layers + 1 if space.mtp_num_layers else None
    least = least_completions(
        mixed, sums, mtp_item, space.allow_standalone_mtp, space.first_mtp_stage
    )
    bound = float(least[0, 0]) + mixed.constant_ms
    return Relaxation(bound, lp, upper, mixed, len(paths), done, converged)
