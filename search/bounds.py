"""Lower bounds on the noise-free step of every completion of a partial layout.

Every bound here is the length of a path that exists in the compiled schedule's dependency graph
whatever the layout, so it never exceeds the simulated step (tests compare with the simulator).

1F1B (one chunk per rank): everything before stage r sits on earlier ranks and everything after
on later ones, so each path below depends on stage r's item range ``[a, b)`` alone (through
prefix sums over the items), and a dynamic programme over stage boundaries gives the least
possible largest bound of the unplaced stages exactly.  Per rank r (warm-up w, R = M - w):

* fill: micro-batch 0 reaches the rank, then M micro-batches of its work and its p2p calls,
  then its own step tail or the drain back to rank 0;
* first backward: micro-batch 0 goes forward through everything and back to the rank, which
  then still has M backwards and M - q forwards, then the drain or its tail;
* two round trips: micro-batch 0's forward, its round trip through the later stages, the R - 1
  steady iterations from B0 to F(M - 1), the last micro-batch's round trip, B(M - 1), the
  drain.  This is the critical path of a pipeline whose early rank is the bottleneck, and what
  makes the 1F1B bound tight (DeepSeek-V3's optimum is proven in seconds with it).

Interleaved schedules: unplaced work is spread by water-filling over the ranks still open
(``InterleavedBound``).

Each schedule's bound is one object behind one interface (``Bound``), chosen once per search by
``bound_for``: the exact search asks it for its children's bounds and for what each child
carries down (``Node.state``), never which schedule it searches.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Generic, Protocol, TypeVar

import numpy as np

from search.cost_model import CostModel
from search.item_sums import ItemSums
from search.pipeline_ops import BACKWARD
from search.schedule import Program, compute_order
from search.space import LayoutSpace

PRUNE_TOLERANCE_MS = 1e-5  # ms: a bound this close to a step may be its own path summed otherwise

StateT = TypeVar("StateT")


@dataclass(frozen=True)
class Node(Generic[StateT]):
    """A partial layout of the exact search: the stages before ``stage`` end at ``cuts``, stage
    ``stage`` starts at item ``start``; its children are the ends that stage may take."""

    stage: int
    start: int
    cuts: tuple[int, ...]
    state: StateT  # what the schedule's bound carries down from the placed stages
    travelled: np.ndarray | None = None  # per cut (``search.paths``): its length so far


@dataclass(frozen=True)
class Children:
    """Bounds for the children of a node, one per end of its stage."""

    lower: np.ndarray  # no layout below the child is faster: prune by it
    explore: np.ndarray  # the order to explore them in, lowest first
    carried: tuple[np.ndarray, ...] = ()  # per child, what the bound passes down (its own use)


class Bound(Protocol[StateT]):
    """Lower bounds on the step of every layout below a node's children, for one schedule."""

    def root(self) -> StateT:
        """The state of the root, where no stage is placed."""
        ...

    def children(self, node: Node[StateT], ends: np.ndarray, threshold: float) -> Children:
        """Bounds of the children ending the node's stage at ``ends``; ``threshold``: the
        step to beat (a child that cannot may be bounded above it)."""
        ...

    def child(self, node: Node[StateT], children: Children, index: int, end: int) -> StateT:
        """The state of child ``index``, whose stage ends at ``end``."""
        ...


def water_levels(
    values: np.ndarray, open_ranks: np.ndarray, work: np.ndarray, rates: np.ndarray | None = None
) -> np.ndarray:
    """(n,) the lowest T per row such that raising each open rank's value to T absorbs
    ``work`` (rank r's value rises ``rates[r]`` per unit of work it takes); never below the
    row's highest value."""
    highest = values.max(axis=1)
    if not open_ranks.any():
        return highest
    rates = np.ones(values.shape[1]) if rates is None else rates
    order = np.argsort(values[:, open_ranks], axis=1)
    levels = np.take_along_axis(values[:, open_ranks], order, axis=1)
    inverse = (1.0 / rates[open_ranks])[order]
    level = (work[:, None] + np.cumsum(levels * inverse, axis=1)) / np.cumsum(inverse, axis=1)
    upper = np.concatenate([levels[:, 1:], np.full((len(levels), 1), np.inf)], axis=1)
    fits = level <= upper  # the j-th candidate level stays below the next rank's value
    water = level[np.arange(len(levels)), fits.argmax(axis=1)]
    return np.maximum(water, highest)


def serial_p2p(program: Program, p2p_ms: np.ndarray, chunk: int = 0) -> np.ndarray:
    """(PP,) time each rank must spend inside its blocking p2p calls from its first forward of
    ``chunk`` to its last call (each lasts at least its fastest transfer), which adds to its
    compute; with overlapped p2p a post takes no time and a wait may take none, so neither
    counts.  The calls before that forward overlap micro-batch 0's way to it, and the first
    and last calls the fill and drain."""
    totals = np.zeros(program.shape.pp)
    calls: list[list[int]] = [[] for _ in range(program.shape.pp)]
    first_forward = [
        next(
            op
            for op in range(len(program.rank))
            if program.rank[op] == rank
            and program.compute_slot[op] == chunk * program.shape.pp + rank
        )
        for rank in range(program.shape.pp)
    ]
    for op_id, transfers in enumerate(program.transfers):  # each rank's ops in its own order
        if transfers and program.own[op_id] == op_id:
            rank = int(program.rank[op_id])
            if not calls[rank] or op_id > first_forward[rank]:
                totals[rank] += min(p2p_ms[link] for _, link in transfers)
            calls[rank].append(op_id)
    for rank, ids in enumerate(calls):
        for op_id in {ids[0], ids[-1]} if ids else ():
            totals[rank] -= min(p2p_ms[link] for _, link in program.transfers[op_id])
    return totals


def forwards_before_first_backward(program: Program) -> list[int]:
    """Per rank, how many forwards it runs before its first backward, in Megatron's order
    without combined 1F1B's extra warm-up forward."""
    order = compute_order(replace(program.shape, combined=False))
    everything = program.shape.num_microbatches * program.shape.vpp
    return [
        next((i for i, op in enumerate(ops) if op.kind == BACKWARD), everything) for ops in order
    ]


@dataclass(frozen=True)
class OneFOneBPaths:
    """[rank][a, b]: the longest of the paths of the module docstring up to the rank's finish,
    for a stage r holding items a..b-1, and what follows: the rank's own tail, or the drain to
    rank 0 and rank 0's tail."""

    paths: list[np.ndarray]
    drains: list[np.ndarray]  # [rank][a, b]: the drain from rank r's stage to rank 0
    tail: np.ndarray
    hops: np.ndarray  # (PP,) p2p from rank 0 to rank r
    backward: np.ndarray  # prefix sums of the items' backward ms

    def own(self, rank: int, start: int, ends: np.ndarray, settled: float) -> np.ndarray:
        """Lower bounds on the step of layouts whose stage ``rank`` holds items start..end-1.
        ``settled``: the most any earlier rank q adds after the drain reaches it, tail_q -
        (drain to q), from the stages already placed (rank 0's tail is at least the
        embedding's)."""
        return self.paths[rank][start, ends] + np.maximum(
            self.tail[start, ends], self.drains[rank][start, ends] + settled
        )

    def settled_after(self, rank: int, start: int, ends: np.ndarray, settled: float):
        """``settled`` once stage ``rank`` holds items start..end-1, for each end."""
        own = self.tail[start, ends] - self.backward[start] - self.hops[rank]
        return np.maximum(settled, own)


def one_f_one_b_paths(program: Program, sums: ItemSums, p2p_ms: np.ndarray) -> OneFOneBPaths:
    m, pp = program.shape.num_microbatches, program.shape.pp
    f, bw, tl = sums.forward, sums.backward, sums.tail
    n = len(f)
    a, b = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    forward, backward = f[b] - f[a], sums.stage_backward()
    hops = np.concatenate([[0.0], np.cumsum(p2p_ms[:-1])])  # p2p from rank 0 to rank r
    links = np.asarray(p2p_ms, dtype=float)
    serial = serial_p2p(program, p2p_ms)
    paths, drains = [], []
    queued_forwards = forwards_before_first_backward(program)
    for rank in range(pp):
        fill = f[a] + hops[rank] + m * (forward + backward) + serial[rank]
        queued = queued_forwards[rank]
        round_trip = 2 * (hops[-1] - hops[rank])
        first = f[-1] + bw[-1] - bw[b] + round_trip + m * backward + (m - queued) * forward
        path = np.maximum(fill, first)
        steady = m - min(pp - rank - 1, m)
        if steady >= 2:  # B0 precedes F(M - 1) on the rank
            trip = f[-1] - f[b] + bw[-1] - bw[b] + 2 * (hops[-1] - hops[rank])
            calls = (steady - 1) * (links[rank - 1] if rank else 0.0) + max(steady - 2, 0) * (
                links[rank] if rank < pp - 1 else 0.0
            )
            path = np.maximum(
                path, f[a] + hops[rank] + steady * (forward + backward) + 2 * trip + calls
            )
        paths.append(np.where(b > a, path, np.inf))
        drains.append(bw[a] + hops[rank])
    return OneFOneBPaths(paths, drains, tl[b] - tl[a], hops, bw)


def settled_levels(paths: OneFOneBPaths, start: float, elements: float = 2e7) -> np.ndarray:
    """A grid of ``settled`` values from ``start`` (rank 0's least tail) to the largest any stage
    can set; as many levels as keep the dynamic programme near ``elements`` numbers."""
    n, stages = paths.tail.shape[0], len(paths.paths)
    highest = max(
        float(
            np.max(np.where(np.isfinite(path), paths.tail - paths.backward[:, None] - hop, -np.inf))
        )
        for path, hop in zip(paths.paths, paths.hops, strict=True)
    )
    count = int(np.clip(elements / (n * n * stages), 16, 128))
    return np.linspace(start, max(start, highest), count)


def suffix_minmax(
    paths: OneFOneBPaths, levels: np.ndarray, mtp_item: int | None, standalone: bool
) -> np.ndarray:
    """(S + 1, items + 1, levels): the least possible largest stage bound over stages k.. when
    stage k starts at item a and the stages before settled at least ``levels[l]`` (dynamic
    programming over the stage boundaries; settled values are rounded down to the grid, so the
    bound stays a bound)."""
    stages, n, count = len(paths.paths), paths.tail.shape[0], len(levels)
    best = np.full((stages + 1, n, count), np.inf)
    best[stages, n - 1, :] = 0.0
    rows = np.arange(n)[None, :, None]
    for k in range(stages - 1, -1, -1):
        own = paths.paths[k][:, :, None] + np.maximum(
            paths.tail[:, :, None], paths.drains[k][:, :, None] + levels
        )
        settles = paths.tail - paths.backward[:, None] - paths.hops[k]
        raised = np.searchsorted(levels, settles, side="right") - 1
        after = np.maximum(np.arange(count), raised[:, :, None])
        table = np.maximum(own, best[k + 1][rows, after])
        if k == stages - 1:
            table[:, : n - 1, :] = np.inf
            if mtp_item is not None and not standalone:
                table[mtp_item + 1 :] = np.inf  # the last stage must hold the MTP block
        elif mtp_item is not None and not standalone:
            table[:, mtp_item + 1 :] = np.inf  # earlier stages end before the MTP block
        best[k] = table.min(axis=1)
    return best


def level_of(levels: np.ndarray, settled: np.ndarray) -> np.ndarray:
    """The grid level at or below each settled value."""
    return np.maximum(np.searchsorted(levels, settled, side="right") - 1, 0)


@dataclass(frozen=True)
class OneFOneBState:
    worst: float  # the largest bound of a placed stage
    settled: float  # max over placed ranks q of tail_q - (drain to q)


class OneFOneBBound:
    """1F1B: each child's own stage exactly, and the least largest bound of the stages after it
    (``suffix_minmax``), so the bound of a node is the most any of its stages forces."""

    def __init__(self, space: LayoutSpace, program: Program, cost_model: CostModel, sums: ItemSums):
        self.paths = one_f_one_b_paths(program, sums, cost_model.p2p_ms)
        self.root_settled = float(sums.tail[1])  # rank 0 holds the embedding's tail at least
        self.levels = settled_levels(self.paths, self.root_settled)
        mtp_item = space.num_layers + 1 if space.mtp_num_layers else None
        self.suffix = suffix_minmax(self.paths, self.levels, mtp_item, space.allow_standalone_mtp)

    def root(self) -> OneFOneBState:
        return OneFOneBState(0.0, self.root_settled)

    def children(self, node: Node[OneFOneBState], ends: np.ndarray, threshold: float) -> Children:
        stage, start, settled = node.stage, node.start, node.state.settled
        worst = np.maximum(node.state.worst, self.paths.own(stage, start, ends, settled))
        after = self.paths.settled_after(stage, start, ends, settled)
        lower = np.maximum(worst, self.suffix[stage + 1, ends, level_of(self.levels, after)])
        return Children(lower, lower, (worst, after))

    def child(
        self, node: Node[OneFOneBState], children: Children, index: int, end: int
    ) -> OneFOneBState:
        worst, after = children.carried
        return OneFOneBState(float(worst[index]), float(after[index]))


@dataclass(frozen=True)
class InterleavedState:
    loads: np.ndarray  # (PP,) each rank's load from the placed stages
    tails: np.ndarray  # (PP,) and its step tail


class InterleavedBound:
    """Lower bounds for the children of a node of an interleaved (VPP > 1) layout search.

    Rank r's first forward of chunk c waits for micro-batch 0 to cross every flat stage before
    (c, r); before it the rank has run only the c x G chunk-0..c-1 forwards of the first group;
    after its last op (a chunk-0 backward) the gradient still crosses the chunk-0 stages before
    r.  So T >= reach(c, r) + M load_r - G forwards_{<c}(r) + drain(r) for c = 0 and
    c = VPP - 1, with forwards <= rho load; or, instead of the drain, the rank's own step tail.
    Rank r's first backward waits for micro-batch 0's forward through every stage and its
    backward through the stages after (last chunk, r).  Stages not placed yet hold at least one
    item each (and no more than a threshold-beating layout can load), and the unplaced work
    raises the open ranks like water.
    """

    def __init__(self, space: LayoutSpace, program: Program, cost_model: CostModel, sums: ItemSums):
        pp, stages, m = space.pp, space.num_stages, program.shape.num_microbatches
        self.pp, self.stages, self.m, self.sums = pp, stages, m, sums
        self.last_chunk_start = (space.vpp - 1) * pp
        # the p2p hops micro-batch 0 crosses to reach flat stage (chunk, rank): those within the
        # chunk are in ``crossed`` already (adding rank 0's hops to r again overstated it)
        crossed = np.concatenate([[0.0], np.cumsum(cost_model.p2p_ms[np.arange(stages) % pp])])
        self.reach_hops = [crossed[c * pp : (c + 1) * pp] for c in range(space.vpp)]
        unit_load = cost_model.forward_ms + cost_model.backward_ms
        no_load = np.zeros_like(unit_load)
        forward_share = np.divide(
            cost_model.forward_ms, unit_load, where=unit_load > 0, out=no_load
        )
        rho = float(forward_share.max())
        self.chunk_terms = [  # (chunk, compute after its first forward, p2p after it)
            (chunk, weight, serial_p2p(program, cost_model.p2p_ms, chunk))
            for chunk, weight in ((0, m), (space.vpp - 1, m - program.shape.group_size * rho))
        ]
        warmups = np.array(forwards_before_first_backward(program))
        self.first_rates = np.maximum(m - warmups * rho, 1e-9)
        self.open_after = [
            np.isin(np.arange(pp), [s % pp for s in range(k, stages)]) for k in range(stages + 1)
        ]
        # the last stage holds L, and the MTP block unless it may stand alone: known work
        fixed = sums.items - 1
        if space.mtp_num_layers and not space.allow_standalone_mtp:
            fixed = space.num_layers + 1
        self.last_load = sums.load[-1] - sums.load[fixed]
        self.last_tail = sums.tail[-1] - sums.tail[fixed]
        # every other unplaced stage holds one item at least, from those before the fixed ones
        item_load = np.diff(sums.load)[:fixed]
        self.least_item = np.append(np.minimum.accumulate(item_load[::-1])[::-1], 0.0)
        self.least_item = np.append(
            self.least_item, np.zeros(sums.items + 1 - len(self.least_item))
        )
        middle = [[s % pp for s in range(k, stages - 1)] for k in range(stages + 1)]
        self.unplaced = np.array([np.bincount(ranks, minlength=pp) for ranks in middle])

    def root(self) -> InterleavedState:
        return InterleavedState(np.zeros(self.pp), np.zeros(self.pp))

    def child(
        self, node: Node[InterleavedState], children: Children, index: int, end: int
    ) -> InterleavedState:
        loads, tails = node.state.loads.copy(), node.state.tails.copy()
        loads[node.stage % self.pp] += self.sums.load[end] - self.sums.load[node.start]
        tails[node.stage % self.pp] += self.sums.tail[end] - self.sums.tail[node.start]
        return InterleavedState(loads, tails)

    def children(
        self, node: Node[InterleavedState], ends: np.ndarray, threshold: float
    ) -> Children:
        """A child whose remaining work cannot fit under ``threshold`` is bounded above it."""
        pp, stages, m, sums = self.pp, self.stages, self.m, self.sums
        loads, tails = node.state.loads, node.state.tails
        cuts, start, k = node.cuts, node.start, node.stage
        prefix, n_items = sums.load, sums.items
        child_loads = np.repeat(loads[None], len(ends), axis=0)
        child_loads[:, k % pp] += prefix[ends] - prefix[start]
        child_tails = np.repeat(tails[None], len(ends), axis=0)
        child_tails[:, k % pp] += sums.tail[ends] - sums.tail[start]
        child_loads[:, (stages - 1) % pp] += self.last_load
        child_tails[:, (stages - 1) % pp] += self.last_tail
        least = self.least_item[ends][:, None] * self.unplaced[k + 1][None, :]
        child_loads += least
        starts = np.empty((len(ends), stages), dtype=np.int64)
        starts[:, : k + 1] = [0, *cuts]
        starts[:, k + 1 :] = np.minimum(ends[:, None] + np.arange(stages - k - 1), n_items)
        over_cap = np.zeros(len(ends), dtype=bool)
        if np.isfinite(threshold):
            # a layout under the threshold loads no rank above threshold / M, so the stages
            # from j on (on at most min(PP, S - j) ranks) cannot start before this item
            cap = threshold / m * np.minimum(pp, stages - np.arange(k + 1, stages))
            earliest = np.searchsorted(prefix, prefix[n_items] - cap - 1e-9, side="left")
            over_cap = ends < earliest[0]
            starts[:, k + 2 :] = np.maximum(starts[:, k + 2 :], earliest[1:])
        drain = sums.backward[starts[:, :pp]]
        work = prefix[n_items] - prefix[ends] - self.last_load - least.sum(axis=1)
        tail_work = sums.tail[n_items] - sums.tail[ends] - self.last_tail
        open_ranks = self.open_after[k + 1]
        explore = np.zeros(len(ends))
        for chunk, weight, serial in self.chunk_terms:
            reach = sums.forward[starts[:, chunk * pp : (chunk + 1) * pp]] + self.reach_hops[chunk]
            base = reach + serial + weight * child_loads
            through_drain = water_levels(base + drain, open_ranks, weight * work)
            through_tail = water_levels(base + child_tails, open_ranks, weight * work + tail_work)
            explore = np.maximum(explore, np.maximum(through_drain, through_tail))
        # stages after (last chunk, r): known when placed, else at least the last items
        after_stage = self.last_chunk_start + np.arange(pp) + 1
        known_after = after_stage <= k + 1
        b_after = np.where(
            known_after,
            sums.backward[n_items] - sums.backward[starts[:, np.minimum(after_stage, stages - 1)]],
            sums.backward[n_items] - sums.backward[np.maximum(n_items - (stages - after_stage), 0)],
        )
        b_after[:, after_stage == stages] = 0.0
        first_backward = sums.forward[n_items] + b_after + drain + self.first_rates * child_loads
        bound = np.maximum(
            explore, water_levels(first_backward, open_ranks, work, self.first_rates)
        )
        # past the cap every layout is slower than the threshold, not merely as slow
        beyond = threshold + 2 * PRUNE_TOLERANCE_MS
        return Children(np.where(over_cap, np.maximum(bound, beyond), bound), explore)


def bound_for(
    space: LayoutSpace, program: Program, cost_model: CostModel, sums: ItemSums
) -> OneFOneBBound | InterleavedBound:
    """The schedule's bound, chosen once per search (as Megatron picks its schedule)."""
    if space.vpp == 1:
        return OneFOneBBound(space, program, cost_model, sums)
    return InterleavedBound(space, program, cost_model, sums)
