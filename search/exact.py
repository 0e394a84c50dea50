"""Exact search for layout spaces too large to enumerate (DeepSeek-V3: ~1e14 layouts on PP=16).

Branch and bound over the stage boundaries, in Megatron's flat stage order.  A lower bound on the
noise-free step of every layout below a node prunes it once the bound is no better than the k-th
best step simulated so far, so the search returns the true top k under the cost model, and the
smallest bound it pruned on proves that nothing it skipped is faster.

The bound for a complete layout, per rank r: rank r cannot start before the first micro-batch's
forward has crossed the chunk-0 stages before it, then runs its M micro-batches of work back to
back, and its last backward (of chunk 0) must still cross those stages back to rank 0:
``F_<r + M * load_r + B_<r`` (with the p2p hops).  Inside the tree the loads are partial, and the
work still unplaced is spread by water-filling over the ranks that still have stages to fill.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from search.evaluate import CostModel, memory, score
from search.schedule import Program
from search.space import LayoutSpace

GIB = 2**30


@dataclass(frozen=True)
class ExactResult:
    cuts: np.ndarray  # (k, S - 1) the top layouts' cut points, best first
    steps: np.ndarray  # (k,) their noise-free step times
    proven_bound_ms: float  # every layout not returned has a step time >= this
    simulated: int  # layouts simulated
    nodes: int  # search-tree nodes visited
    rejected_memory: int


def _item_costs(model: CostModel, space: LayoutSpace) -> tuple[np.ndarray, np.ndarray]:
    """Per item (E, each decoder layer, the MTP block, L): forward and backward ms."""
    per_item = space.item_counts(model.units, model.moe_pattern)
    return per_item @ model.forward_ms, per_item @ model.backward_ms


def _water_level(values: np.ndarray, open_ranks: np.ndarray, work: float) -> float:
    """The lowest T such that raising every open rank's value up to T absorbs ``work``."""
    if work <= 0 or not open_ranks.any():
        return float(values.max())
    levels = np.sort(values[open_ranks])
    filled = 0.0
    for i, level in enumerate(levels):
        nxt = levels[i + 1] if i + 1 < len(levels) else np.inf
        capacity = (nxt - level) * (i + 1)
        if filled + capacity >= work:
            return float(max(values.max(), level + (work - filled) / (i + 1)))
        filled += capacity
    return float(values.max())


def exact_search(
    space: LayoutSpace,
    program: Program,
    model: CostModel,
    top: int = 10,
    hbm_gib: float | None = None,
    batch: int = 512,
    node_limit: int = 50_000_000,
) -> ExactResult:
    """The ``top`` layouts with the smallest noise-free simulated step, by branch and bound."""
    if space.allow_empty_stages:
        raise ValueError("exact search covers spaces of non-empty stages")
    pp, stages, m = space.pp, space.num_stages, program.num_microbatches
    forward, backward = _item_costs(model, space)
    load = forward + backward
    prefix = np.concatenate([[0.0], np.cumsum(load)])
    f_prefix = np.concatenate([[0.0], np.cumsum(forward)])
    b_prefix = np.concatenate([[0.0], np.cumsum(backward)])
    n_items = len(load)
    mtp_item = space.num_layers + 1 if space.mtp_num_layers else None
    last_chunk_start = (space.vpp - 1) * pp
    hops = np.concatenate([[0.0], np.cumsum(model.p2p_ms[:-1])])  # p2p from rank 0 to rank r

    best: list[tuple[float, tuple[int, ...]]] = []  # max-heap of the top (negated steps)
    pending: list[tuple[int, ...]] = []
    state = {"simulated": 0, "nodes": 0, "pruned": np.inf, "rejected": 0}

    def threshold() -> float:
        return -best[0][0] if len(best) >= top else np.inf

    def flush() -> None:
        if not pending:
            return
        cuts = np.array(pending, dtype=np.int64)
        pending.clear()
        counts = space.unit_counts(cuts, model.units, model.moe_pattern)
        if hbm_gib is not None:
            fits = memory(model, counts, pp).max(axis=1) <= hbm_gib * GIB
            state["rejected"] += int((~fits).sum())
            cuts, counts = cuts[fits], counts[fits]
            if not len(cuts):
                return
        steps = score(program, model, counts).noise_free_ms
        state["simulated"] += len(cuts)
        for step, row in zip(steps, cuts, strict=True):
            entry = (-float(step), tuple(int(c) for c in row))
            if len(best) < top:
                heapq.heappush(best, entry)
            elif -entry[0] < -best[0][0]:
                state["pruned"] = min(state["pruned"], -heapq.heapreplace(best, entry)[0])
            else:
                state["pruned"] = min(state["pruned"], -entry[0])

    def bound(loads: np.ndarray, chunk0_ends: list[int], start: int, k: int) -> float:
        """Lower bound for every completion of stages 0..k-1 ending at item ``start``: each rank
        needs its fill/drain time plus M times its load; the unplaced work raises the open ranks
        like water (a relaxation that may split items)."""
        open_ranks = np.zeros(pp, dtype=bool)
        open_ranks[[s % pp for s in range(k, stages)]] = True
        fill = np.empty(pp)
        for rank in range(pp):
            edge = chunk0_ends[rank - 1] if 0 < rank <= len(chunk0_ends) else start
            fill[rank] = 0.0 if rank == 0 else f_prefix[edge] + b_prefix[edge] + 2 * hops[rank]
        values = fill + m * loads
        return _water_level(values, open_ranks, m * (prefix[n_items] - prefix[start]))

    def descend(k: int, start: int, loads: np.ndarray, cuts: list[int], ends0: list[int]) -> None:
        state["nodes"] += 1
        if state["nodes"] > node_limit:
            raise RuntimeError(
                f"exact search visited more than {node_limit} nodes; raise the limit"
            )
        rank = k % pp
        if k == stages - 1:
            pending.append(tuple(cuts))
            if len(pending) >= batch:
                flush()
            return
        highest = n_items - (stages - 1 - k)  # leave one item for each later stage
        if mtp_item is not None and not space.allow_standalone_mtp:
            highest = min(highest, mtp_item)  # MTP must stay in the last stage, with L
        children = []
        for end in range(start + 1, highest + 1):
            if mtp_item is not None and start <= mtp_item < end and k < last_chunk_start:
                continue
            child = loads.copy()
            child[rank] += prefix[end] - prefix[start]
            child_ends = [*ends0, end] if k < pp else ends0
            lower = bound(child, child_ends, end, k + 1)
            if lower >= threshold():
                state["pruned"] = min(state["pruned"], lower)
                continue
            children.append((lower, end, child, child_ends))
        children.sort(key=lambda c: c[0])
        for lower, end, child, child_ends in children:
            if lower >= threshold():
                state["pruned"] = min(state["pruned"], lower)
                continue
            descend(k + 1, end, child, [*cuts, end], child_ends)
            if len(pending) >= batch:
                flush()

    descend(0, 0, np.zeros(pp), [], [])
    flush()
    ranked = sorted((-s, c) for s, c in best)
    return ExactResult(
        cuts=np.array([c for _, c in ranked], dtype=np.int64).reshape(len(ranked), stages - 1),
        steps=np.array([s for s, _ in ranked]),
        proven_bound_ms=float(min(state["pruned"], np.inf)),
        simulated=state["simulated"],
        nodes=state["nodes"],
        rejected_memory=state["rejected"],
    )
