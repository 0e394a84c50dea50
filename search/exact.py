"""Exact search: branch and bound over stage boundaries, for spaces too large to enumerate.

The search descends Megatron's flat stage order one boundary at a time.  A lower bound on the
noise-free step of every layout below a node (``search.bounds``) prunes it once the bound is
above the ``top``-th best distinct prediction found so far, so the search returns the true top
``top`` predictions under the cost model, every layout that shares one of them (ties counted,
not pruned), and the smallest bound it pruned on: no layout it did not return is faster.  The
leaves of a node are simulated in batches by the straight-line recurrence.

It starts from balanced layouts walked downhill one boundary move at a time, so pruning starts
from a good incumbent.  Out of time, it stops and the bound still holds: the report says how far
from optimal the pick can be.  ``shard`` / ``num_shards`` split the tree by its first two
boundaries, so shards together search exactly what one process does.

Two objects share the work: ``_Best`` keeps what has been found (the best classes, the bound
pruned on, the counters) from the seeds on, and ``_Tree`` walks the nodes (``search.bounds.Node``)
with the schedule's bound and the cuts, which exist only once the seeds are simulated.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from ray_layout.model.sizing import GIB
from search.bounds import PRUNE_TOLERANCE_MS, Bound, Node, bound_for
from search.evaluate import CostModel, score, stage_times, tail_ms
from search.incumbent import downhill, seed_cuts
from search.item_sums import ItemSums, item_sums
from search.paths import CutBounds, PathCut, allowed_ends, critical_paths
from search.progress import ProgressClock
from search.relaxation import Relaxation, relax
from search.schedule import Program
from search.space import LayoutSpace
from search.ties import TieClass, critical_ranks, merge_classes, prediction_key, tie_classes

CUTS = 12  # critical paths of the best incumbents, used as bounds for every layout
RELAXATION_SHARE, RELAXATION_LIMIT_S = 0.8, 6.0  # of the time limit: the interleaved LP bound


@dataclass(frozen=True)
class ExactResult:
    classes: tuple[TieClass, ...]  # the top distinct predictions, best first, ties counted
    proven_bound_ms: float  # every layout outside those classes takes at least this
    simulated: int  # layouts simulated
    nodes: int  # search-tree nodes visited
    rejected_memory: int
    complete: bool  # the tree was searched to the end (else the budget ran out)
    relaxation: Relaxation | None = None  # interleaved: the fractional-layout bound
    bound_reason: str = ""  # what the proven bound is, when it leaves a gap
    smallest_peak_gib: float = float("inf")  # the lowest peak memory of any layout simulated

    @property
    def gap(self) -> float:
        """How much faster than the pick an unseen layout could still be (0: proven optimal)."""
        if not self.classes:
            return 0.0
        return max(0.0, 1.0 - self.proven_bound_ms / self.classes[0].step_ms)


def _critical_paths(
    space: LayoutSpace, program: Program, cost_model: CostModel, layouts: list[tuple[int, ...]]
) -> list[tuple[np.ndarray, list[PathCut]]]:
    """Per layout: when each rank ends, and the longest path to each rank's end."""
    counts = space.unit_counts(
        np.array(layouts, dtype=np.int64), cost_model.units, cost_model.moe_pattern
    )
    forward, backward = stage_times(cost_model, counts)
    tails = tail_ms(cost_model, counts, space.pp)
    return [
        critical_paths(program, forward[row], backward[row], cost_model.p2p_ms, tails[row])
        for row in range(len(layouts))
    ]


def _bound_reason(search: _Best, relaxation: Relaxation | None) -> str:
    """Which bound leaves the gap, and why it is not closed."""
    proven = max(search.pruned, relaxation.bound_ms if relaxation is not None else -np.inf)
    if proven >= min(search.classes, default=np.inf):  # the pick is proven optimal
        return ""
    if relaxation is not None and search.pruned <= relaxation.bound_ms + PRUNE_TOLERANCE_MS:
        state = (
            "its optimum" if relaxation.converged else f"{relaxation.rounds} rounds, unconverged"
        )
        return (
            f"the LP relaxation binds ({state}, {relaxation.paths} schedule paths): even "
            f"with fractional stage boundaries no layout is faster than "
            f"{relaxation.bound_ms:,.1f} ms; whether whole layers cost the rest, the branch "
            f"and bound had no budget left to settle"
        )
    return (
        f"the search budget ended the branch and bound: subtrees left unexplored have "
        f"path bounds from {search.pruned:,.1f} ms"
    )


def shard_of(cuts: tuple[int, ...], num_shards: int) -> int:
    """The shard that owns a layout: by its first two boundaries (the split of the tree)."""
    return sum(cuts[:2]) % num_shards


class _Best:
    """What one search has found: the best classes so far, the bound it pruned on, its budget's
    counters."""

    def __init__(
        self,
        space: LayoutSpace,
        program: Program,
        *,
        cost_model: CostModel,
        top: int,
        hbm_gib: float | None,
        shard: int,
        num_shards: int,
        progress: Callable[[str], None] | None,
    ):
        self.space, self.program, self.cost_model = space, program, cost_model
        self.top, self.hbm_gib = top, hbm_gib
        self.shard, self.num_shards = shard, num_shards
        self.classes: dict[float, TieClass] = {}
        self.outside: set[float] = set()  # predictions of seeds another shard owns
        self.seed_ends: dict[tuple[int, ...], set[int]] = {}  # seeds, by their first cuts
        self.pending: list[np.ndarray] = []
        self.pending_rows = 0
        self.simulated = self.nodes = self.rejected = 0
        self.smallest_peak_gib = float("inf")
        self.pruned = np.inf
        self.out_of_time = False
        self.clock = ProgressClock(progress)
        self.limit = np.inf  # the top-th best prediction so far: prune what is slower

    def _update_limit(self) -> None:
        values = sorted(set(self.classes) | self.outside)
        self.limit = values[self.top - 1] if len(values) >= self.top else np.inf
        for value in [v for v in self.classes if v > self.limit]:
            self.pruned = min(self.pruned, value)
            del self.classes[value]

    def viable(self, lower: np.ndarray) -> np.ndarray:
        """Which bounds can still reach the top; the smallest of the others joins the pruned
        bound."""
        viable = lower <= self.limit + PRUNE_TOLERANCE_MS
        if not viable.all():
            self.pruned = min(self.pruned, float(lower[~viable].min()))
        return viable

    def simulate(self, cuts: np.ndarray, owned: bool = True) -> np.ndarray:
        """Score layouts and keep what can enter the top; returns their predictions."""
        space, cost_model = self.space, self.cost_model
        counts = space.unit_counts(cuts, cost_model.units, cost_model.moe_pattern)
        scores = score(self.program, cost_model, counts)
        self.simulated += len(cuts)
        peak = float(scores.peak_memory_bytes.min()) / GIB if len(cuts) else float("inf")
        self.smallest_peak_gib = min(self.smallest_peak_gib, peak)
        fits = np.ones(len(cuts), dtype=bool)
        if self.hbm_gib is not None:
            fits = scores.peak_memory_bytes <= self.hbm_gib * GIB
            self.rejected += int((~fits).sum()) if owned else 0
        steps = scores.noise_free_ms
        if not owned:
            self.outside.update(prediction_key(steps[fits]).tolist())
            self._update_limit()
            return steps
        keep = fits & (steps <= self.limit + PRUNE_TOLERANCE_MS)
        if (fits & ~keep).any():
            self.pruned = min(self.pruned, float(steps[fits & ~keep].min()))
        if keep.any():
            found = tie_classes(
                steps[keep],
                critical_ranks(scores.rank_load_ms[keep]),
                scores.peak_memory_bytes[keep],
                cuts[keep],
                space.layout_string,
                limit=self.top + 1,
            )
            if len(found) > self.top:  # the batch's next prediction is not kept
                self.pruned = min(self.pruned, found.pop().step_ms)
            merge_classes(self.classes, found)
            self._update_limit()
        return steps

    def incumbents(self, layouts: list[tuple[int, ...]]) -> dict[tuple[int, ...], float]:
        """Simulate layouts found before the tree (seeds, the downhill walk) once; those of
        another shard only tighten the threshold."""
        fresh = [c for c in dict.fromkeys(layouts) if c[-1] not in self.seed_ends.get(c[:-1], ())]
        mine = [c for c in fresh if shard_of(c, self.num_shards) == self.shard]
        others = [c for c in fresh if shard_of(c, self.num_shards) != self.shard]
        for cuts in fresh:
            self.seed_ends.setdefault(cuts[:-1], set()).add(cuts[-1])
        steps = {}
        for rows, owned in ((others, False), (mine, True)):
            if rows:
                found = self.simulate(np.array(rows, dtype=np.int64), owned=owned)
                steps.update(zip(rows, found.tolist(), strict=True))
        return steps

    def add_leaves(self, cuts: tuple[int, ...], ends: np.ndarray) -> None:
        """Queue the leaves ending the last stage but one at ``ends`` (seeds are simulated)."""
        seen = self.seed_ends.get(cuts)
        if seen:
            ends = ends[~np.isin(ends, list(seen))]
        rows = np.empty((len(ends), len(cuts) + 1), dtype=np.int64)
        rows[:, :-1] = cuts
        rows[:, -1] = ends
        self.pending.append(rows)
        self.pending_rows += len(rows)

    def flush(self) -> None:
        if self.pending_rows:
            self.simulate(np.concatenate(self.pending))
        self.pending, self.pending_rows = [], 0
        self.tick()

    def tick(self) -> None:
        self.clock.tick(self.describe)

    def describe(self) -> str:
        best = min(self.classes, default=None)
        found = f"best {best:,.1f} ms so far" if best is not None else "none fits yet"
        return f"exact search, {self.nodes:,} nodes, {self.simulated:,} layouts simulated, {found}"

    def result(self, relaxation: Relaxation | None) -> ExactResult:
        ranked = tuple(self.classes[v] for v in sorted(self.classes))
        proven = float(self.pruned)
        if relaxation is not None:  # it bounds every layout, whatever the tree left
            proven = max(proven, relaxation.bound_ms)
        return ExactResult(
            classes=ranked,
            proven_bound_ms=proven,
            simulated=self.simulated,
            nodes=self.nodes,
            rejected_memory=self.rejected,
            complete=not self.out_of_time,
            relaxation=relaxation,
            bound_reason=_bound_reason(self, relaxation),
            smallest_peak_gib=self.smallest_peak_gib,
        )


class _Tree:
    """The branch and bound proper: each node's children bounded by the schedule's bound and the
    cuts, pruned against the best found so far, leaves simulated in batches."""

    def __init__(
        self,
        best: _Best,
        bound: Bound,
        *,
        cuts: CutBounds | None,
        items: int,
        batch: int,
        node_limit: int,
        deadline: float,
    ):
        space = best.space
        self.best, self.bound, self.cuts = best, bound, cuts
        self.batch, self.node_limit, self.deadline = batch, node_limit, deadline
        self.stages = space.num_stages
        mtp_item = space.num_layers + 1 if space.mtp_num_layers else None
        self.allowed = [  # per stage, the items it may end at (sorted)
            np.flatnonzero(
                allowed_ends(
                    self.stages,
                    items,
                    stage,
                    mtp_item,
                    space.allow_standalone_mtp,
                    space.first_mtp_stage,
                )
            )
            for stage in range(self.stages)
        ]
        # the first two boundaries split the tree between shards
        self.sharded_stage = min(1, self.stages - 2) if best.num_shards > 1 else -1

    def root(self) -> Node:
        return Node(0, 0, (), self.bound.root(), self.cuts.start if self.cuts is not None else None)

    def ends(self, node: Node) -> np.ndarray:
        """Where the node's stage may end (those of this shard where the tree splits)."""
        allowed = self.allowed[node.stage]
        ends = allowed[allowed > node.start]
        if node.stage == self.sharded_stage:
            best = self.best
            ends = ends[(sum(node.cuts) + ends) % best.num_shards == best.shard]
        return ends

    def descend(self, node: Node) -> None:
        """Search every layout below ``node`` that can still reach the top."""
        best = self.best
        best.nodes += 1
        if best.nodes % 256 == 0:
            best.out_of_time |= time.monotonic() > self.deadline or best.nodes >= self.node_limit
            best.tick()
        ends = self.ends(node)
        if not len(ends):
            return
        children = self.bound.children(node, ends, best.limit)
        lower, through = children.lower, None
        if self.cuts is not None:
            along, through = self.cuts.children(node.travelled, node.stage, node.start, ends)
            lower = np.maximum(lower, along)
        viable = best.viable(lower)
        if node.stage == self.stages - 2:  # the children are leaves: simulate them in a batch
            if viable.any():
                best.add_leaves(node.cuts, ends[viable])
                if best.pending_rows >= self.batch:
                    best.flush()
            return
        order = np.flatnonzero(viable)[np.argsort(children.explore[viable], kind="stable")]
        for position, index in enumerate(order.tolist()):
            if best.out_of_time:  # what is left is unproven
                best.pruned = min(best.pruned, float(lower[order[position:]].min()))
                break
            if lower[index] > best.limit + PRUNE_TOLERANCE_MS:  # the threshold fell meanwhile
                best.pruned = min(best.pruned, float(lower[index]))
                continue
            end = int(ends[index])
            state = self.bound.child(node, children, index, end)
            travelled = through[:, index] if through is not None else None
            self.descend(Node(node.stage + 1, end, (*node.cuts, end), state, travelled))


def _cut_bounds(
    best: _Best,
    cost_model: CostModel,
    sums: ItemSums,
    steps: dict[tuple[int, ...], float],
    *,
    relaxation: Relaxation | None,
    relaxation_s: float,
) -> tuple[CutBounds, Relaxation | None]:
    """Cuts from the critical paths of the best incumbents, and for interleaved spaces the LP
    relaxation's mixed path (solved here unless a previous search passes it on), on the
    bounds' ``cost_model``."""
    space, program = best.space, best.program
    found = _critical_paths(space, program, cost_model, sorted(steps, key=steps.__getitem__)[:CUTS])
    cuts = [rank_paths[int(np.argmax(ends))] for ends, rank_paths in found]
    if space.vpp > 1 and relaxation is None:
        seeds = [cut for _, rank_paths in found for cut in rank_paths]
        relaxation = relax(
            space, program, cost_model.p2p_ms, sums, seeds, relaxation_s, clock=best.clock
        )
    if relaxation is not None and relaxation.mixed is not None:
        cuts.append(relaxation.mixed)
    mtp_item = space.num_layers + 1 if space.mtp_num_layers else None
    bounds = CutBounds(cuts, sums, mtp_item, space.allow_standalone_mtp, space.first_mtp_stage)
    return bounds, relaxation


def lower_bound_model(cost_model: CostModel) -> CostModel:
    """The cost model bounds are built on: for combined 1F1B each decoder layer's forward and
    backward less its share of the most a merged pair hides, and no merge; otherwise the model
    itself.  A MoE pair's saving is split evenly between its two layers, and what a mixed pair
    saves beyond that goes to its dense layer, so the shares of any pair cover its saving and a
    merged step never runs below them (nor does an unmerged op, which hides nothing)."""
    merge = cost_model.merge
    if merge is None:
        return cost_model
    forward, backward = cost_model.forward_ms.copy(), cost_model.backward_ms.copy()
    half = merge.moe_moe / 2
    if merge.moe_unit >= 0:
        forward[merge.moe_unit] -= half
        backward[merge.moe_unit] -= half
    if merge.dense_unit >= 0:
        forward[merge.dense_unit] -= max(merge.dense_moe - half, 0.0)
        backward[merge.dense_unit] -= max(merge.moe_dense - half, 0.0)
    return replace(cost_model, forward_ms=forward, backward_ms=backward, merge=None)


def exact_search(
    space: LayoutSpace,
    program: Program,
    *,
    cost_model: CostModel,
    top: int = 10,
    hbm_gib: float | None = None,
    batch: int = 4096,
    node_limit: int = 50_000_000,
    time_limit_s: float = float("inf"),
    shard: int = 0,
    num_shards: int = 1,
    progress: Callable[[str], None] | None = None,
    relaxation: Relaxation | None = None,
) -> ExactResult:
    """The ``top`` best distinct noise-free predictions, with every layout that makes them.

    Interleaved spaces first solve the LP relaxation (``search.relaxation``) with part of the
    time, unless a previous search of the same space passes its ``relaxation`` on.
    """
    if space.allow_empty_stages:
        raise ValueError("exact search covers spaces of non-empty stages")
    if space.num_stages < 2:
        raise ValueError("exact search needs at least two stages")
    lower = lower_bound_model(cost_model)  # combined 1F1B: all-to-alls may all hide
    sums = item_sums(lower, space)
    best = _Best(
        space,
        program,
        cost_model=cost_model,
        top=top,
        hbm_gib=hbm_gib,
        shard=shard,
        num_shards=num_shards,
        progress=progress,
    )
    deadline = time.monotonic() + time_limit_s
    bound = bound_for(space, program, lower, sums)
    steps = best.incumbents(seed_cuts(space, sums.load))
    if steps:
        steps |= best.incumbents(
            downhill(space, program, cost_model, min(steps, key=steps.__getitem__))
        )
    cuts = None
    if steps:
        relaxation_s = min(RELAXATION_SHARE * time_limit_s, RELAXATION_LIMIT_S)
        cuts, relaxation = _cut_bounds(
            best, lower, sums, steps, relaxation=relaxation, relaxation_s=relaxation_s
        )
    tree = _Tree(
        best,
        bound,
        cuts=cuts,
        items=sums.items,
        batch=batch,
        node_limit=node_limit,
        deadline=deadline,
    )
    tree.descend(tree.root())
    best.flush()
    return best.result(relaxation)
