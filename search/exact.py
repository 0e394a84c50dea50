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
import time
from dataclasses import dataclass

import numpy as np

from search.evaluate import CostModel, memory, score
from search.schedule import BACKWARD, Program, compute_order
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
    complete: bool  # the tree was searched to the end (else the node budget ran out)

    @property
    def gap(self) -> float:
        """How much faster than the k-th layout found an unseen layout could still be."""
        return max(0.0, 1.0 - self.proven_bound_ms / self.steps[-1]) if len(self.steps) else 0.0


def _item_costs(model: CostModel, space: LayoutSpace):
    """Per item (E, each decoder layer, the MTP block, L): forward, backward and step-tail ms."""
    per_item = space.item_counts(model.units, model.moe_pattern)
    tail = per_item @ model.tail_params * model.tail_ms_per_gparam
    return per_item @ model.forward_ms, per_item @ model.backward_ms, tail


def _water_levels(
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


def _serial_p2p(program: Program, p2p_ms: np.ndarray) -> np.ndarray:
    """(PP,) time each rank must spend inside its p2p calls between its first and last call
    (each call lasts at least its fastest transfer), which adds to its compute."""
    totals = np.zeros(program.pp)
    for op_id, transfers in enumerate(program.transfers):
        rank = program.rank[op_id]
        if transfers:
            totals[rank] += min(p2p_ms[link] for _, link in transfers)
    for rank in range(program.pp):  # the first and last calls overlap the fill and the drain
        calls = [op for op in range(len(program.ops)) if program.rank[op] == rank and
                 program.transfers[op]]  # fmt: skip
        for op_id in {calls[0], calls[-1]} if calls else ():
            totals[rank] -= min(p2p_ms[link] for _, link in program.transfers[op_id])
    return totals


def _one_f_one_b_stage_bounds(
    program: Program,
    f_prefix: np.ndarray,
    b_prefix: np.ndarray,
    tail_prefix: np.ndarray,
    hops: np.ndarray,
    serial_p2p: np.ndarray,
    forwards_first: list[int],
) -> list[np.ndarray]:
    """[rank][a, b]: a lower bound on the step of any 1F1B layout whose stage r holds items
    a..b-1 — with one chunk per rank, everything before the stage sits on earlier ranks and
    everything after on later ones, so the stage alone fixes each term:

    * fill: micro-batch 0 reaches the rank, then M micro-batches of its work and its p2p calls,
      then its own step tail or the drain back to rank 0;
    * first backward: micro-batch 0 goes forward through everything and back to the rank, which
      then still has M backwards and M - q forwards, then the drain or its tail.
    """
    m = program.num_microbatches
    n = len(f_prefix)
    a, b = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    forward = f_prefix[b] - f_prefix[a]
    backward = b_prefix[b] - b_prefix[a]
    tail = tail_prefix[b] - tail_prefix[a]
    round_trip = 2 * hops[-1]
    bounds = []
    for rank in range(program.pp):
        drain = b_prefix[a] + hops[rank]
        after = max(0.0, 0.0)
        fill = f_prefix[a] + hops[rank] + m * (forward + backward) + serial_p2p[rank]
        first = (f_prefix[-1] + b_prefix[-1] - b_prefix[b] + round_trip - 2 * hops[rank]
                 + m * backward + (m - forwards_first[rank]) * forward + after)  # fmt: skip
        bound = np.maximum(fill, first) + np.maximum(tail, drain)
        bounds.append(np.where(b > a, bound, np.inf))
    return bounds


def _suffix_minmax(
    stage_bounds: list[np.ndarray], mtp_item: int | None, standalone: bool
) -> list[np.ndarray]:
    """[k][a]: the least possible largest stage bound over stages k.. when stage k starts at
    item a (dynamic programming over the stage boundaries)."""
    stages, n = len(stage_bounds), stage_bounds[0].shape[0]
    best = [np.full(n, np.inf) for _ in range(stages + 1)]
    best[stages][n - 1] = 0.0
    for k in range(stages - 1, -1, -1):
        table = np.maximum(stage_bounds[k], best[k + 1][None, :])
        if k == stages - 1:
            table = np.where(np.arange(n)[None, :] == n - 1, table, np.inf)
            if mtp_item is not None and not standalone:
                table[mtp_item + 1 :, :] = np.inf  # the last stage must hold the MTP block
        elif mtp_item is not None and not standalone:
            table[:, mtp_item + 1 :] = np.inf  # earlier stages end before the MTP block
        best[k] = table.min(axis=1)
    return best


def _forwards_before_first_backward(program: Program, rank: int) -> int:
    """How many forwards rank ``rank`` runs before its first backward, in Megatron's order."""
    for index, op in enumerate(compute_order(program.pp, program.vpp, program.num_microbatches,
                                             program.group_size)[rank]):  # fmt: skip
        if op.kind == BACKWARD:
            return index
    return program.num_microbatches * program.vpp


def _seed_cuts(space: LayoutSpace, prefix: np.ndarray) -> list[tuple[int, ...]]:
    """Evenly balanced layouts, simulated first so that pruning starts from a good incumbent:
    each cut near an equal share of the total load, rounded down, up and to the nearest item."""
    stages, n_items = space.num_stages, len(prefix) - 1
    targets = prefix[-1] * np.arange(1, stages) / stages
    even = np.arange(1, stages) * n_items / stages  # equal item counts, as the count rule
    seeds = {tuple(int(c) for c in np.floor(even)), tuple(int(c) for c in np.ceil(even))}
    for side in ("left", "right"):
        for shift in (-1, 0, 1):
            cuts = list(np.searchsorted(prefix, targets, side=side) + shift)
            for i in range(len(cuts)):  # one item per stage at least, room left for the rest
                low = cuts[i - 1] + 1 if i else 1
                cuts[i] = int(min(max(cuts[i], low), n_items - (stages - 1 - i)))
            seeds.add(tuple(cuts))
    return [cuts for cuts in sorted(seeds) if _allowed(space, np.array(cuts))]


def _local_search(
    space: LayoutSpace,
    program: Program,
    model: CostModel,
    start: tuple[int, ...],
    rounds: int = 200,
) -> list[tuple[int, ...]]:
    """Move one stage boundary by one item while that makes the simulated step faster; the
    layouts visited on the way (the caller simulates them again for its top)."""
    current = np.array(start)
    counts = space.unit_counts(current[None], model.units, model.moe_pattern)
    current_step = score(program, model, counts).noise_free_ms[0]
    visited = [tuple(int(c) for c in current)]
    items = len(space.item_counts(model.units, model.moe_pattern))
    for _ in range(rounds):
        moves = [current + step * np.eye(len(current), dtype=np.int64)[i]
                 for i in range(len(current)) for step in (-1, 1)]  # fmt: skip
        moves = np.array([m for m in moves if m[0] > 0 and m[-1] < items and _allowed(space, m)])
        if not len(moves):
            break
        counts = space.unit_counts(moves, model.units, model.moe_pattern)
        steps = score(program, model, counts).noise_free_ms
        best = int(np.argmin(steps))
        if steps[best] >= current_step:
            break
        current, current_step = moves[best], steps[best]
        visited.append(tuple(int(c) for c in current))
    return visited


def _allowed(space: LayoutSpace, cuts: np.ndarray) -> bool:
    if len(set(cuts.tolist())) != len(cuts) or np.any(np.diff(cuts) <= 0):
        return False
    if not space.mtp_num_layers:
        return True
    mtp_stage = int((cuts <= space.num_layers + 1).sum())
    if mtp_stage < (space.vpp - 1) * space.pp:
        return False
    return space.allow_standalone_mtp or mtp_stage == space.num_stages - 1


def exact_search(
    space: LayoutSpace,
    program: Program,
    model: CostModel,
    top: int = 10,
    hbm_gib: float | None = None,
    gap: float = 0.0,
    batch: int = 512,
    node_limit: int = 2_000_000,
    time_limit_s: float = float("inf"),
) -> ExactResult:
    """The ``top`` layouts with the smallest noise-free simulated step, by branch and bound."""
    if space.allow_empty_stages:
        raise ValueError("exact search covers spaces of non-empty stages")
    pp, stages, m = space.pp, space.num_stages, program.num_microbatches
    forward, backward, tail = _item_costs(model, space)
    load = forward + backward
    tail_prefix = np.concatenate([[0.0], np.cumsum(tail)])
    prefix = np.concatenate([[0.0], np.cumsum(load)])
    f_prefix = np.concatenate([[0.0], np.cumsum(forward)])
    b_prefix = np.concatenate([[0.0], np.cumsum(backward)])
    n_items = len(load)
    mtp_item = space.num_layers + 1 if space.mtp_num_layers else None
    last_chunk_start = (space.vpp - 1) * pp
    hops = np.concatenate([[0.0], np.cumsum(model.p2p_ms[:-1])])  # p2p from rank 0 to rank r
    # the p2p hops micro-batch 0 crosses to reach flat stage (chunk, rank): boundaries 0..s-1
    crossed = np.concatenate([[0.0], np.cumsum(model.p2p_ms[np.arange(stages) % pp])])
    reach_hops = [crossed[c * pp : (c + 1) * pp] + hops for c in range(space.vpp)]
    unit_load = model.forward_ms + model.backward_ms
    rho = float(np.max(np.divide(model.forward_ms, unit_load, where=unit_load > 0,
                                 out=np.zeros_like(unit_load))))  # fmt: skip
    chunk_terms = [(0, m)]
    if space.vpp > 1:
        chunk_terms.append((space.vpp - 1, m - program.group_size * rho))
    warmups = [_forwards_before_first_backward(program, rank) for rank in range(pp)]
    serial_p2p = _serial_p2p(program, model.p2p_ms)
    first_rates = np.maximum(m - np.array(warmups) * rho, 1e-9)
    open_after = [
        np.isin(np.arange(pp), [s % pp for s in range(k, stages)]) for k in range(stages + 1)
    ]

    best: list[tuple[float, tuple[int, ...]]] = []  # max-heap of the top (negated steps)
    pending: list[tuple[int, ...]] = []
    seen: set[tuple[int, ...]] = set()
    state = {"simulated": 0, "nodes": 0, "pruned": np.inf, "rejected": 0, "out_of_time": False}

    def threshold() -> float:
        return -best[0][0] if len(best) >= top else np.inf

    def flush() -> None:
        fresh = [c for c in dict.fromkeys(pending) if c not in seen]  # seeds recur in the tree
        pending.clear()
        if not fresh:
            return
        seen.update(fresh)
        cuts = np.array(fresh, dtype=np.int64)
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

    def bounds(
        loads: np.ndarray, tails: np.ndarray, cuts: list[int], start: int, k: int, ends: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        # The first-backward term: rank r's first backward waits for micro-batch 0's forward
        # through every stage and its backward through the stages after (last chunk, r); by
        # then the rank has run q_r forwards; afterwards it still has M load_r - q_r forwards
        # of work and the drain.
        """Lower bounds for every completion of the children that end stage k at ``ends``.

        Rank r's first forward of chunk c waits for micro-batch 0 to cross every flat stage
        before (c, r); before it the rank has run only the c x G chunk-0..c-1 forwards of the
        first group; after its last op (a chunk-0 backward) the gradient still crosses the
        chunk-0 stages before r.  So T >= reach(c, r) + M load_r - G forwards_{<c}(r) + drain(r)
        for c = 0 and c = VPP - 1, with forwards <= rho load; or, instead of the drain, the
        rank's own step tail.  Stages not placed yet hold at least one item each (and no more
        than a threshold-beating layout can load), and the unplaced work raises the open ranks
        like water.
        """
        child_loads = np.repeat(loads[None], len(ends), axis=0)
        child_loads[:, k % pp] += prefix[ends] - prefix[start]
        child_tails = np.repeat(tails[None], len(ends), axis=0)
        child_tails[:, k % pp] += tail_prefix[ends] - tail_prefix[start]
        starts = np.empty((len(ends), stages), dtype=np.int64)
        known = [0, *cuts]  # stages 0..k start here
        starts[:, : k + 1] = known
        starts[:, k + 1 :] = np.minimum(ends[:, None] + np.arange(stages - k - 1), n_items)
        over_cap = np.zeros(len(ends), dtype=bool)
        if np.isfinite(threshold()):
            # a layout under the threshold loads no rank above threshold / M, so the stages
            # from j on (on at most min(PP, S - j) ranks) cannot start before this item
            cap = threshold() / m * np.minimum(pp, stages - np.arange(k + 1, stages))
            earliest = np.searchsorted(prefix, prefix[n_items] - cap - 1e-9, side="left")
            over_cap = ends < earliest[0]  # the rest cannot fit under the threshold
            starts[:, k + 2 :] = np.maximum(starts[:, k + 2 :], earliest[1:])
        drain = b_prefix[starts[:, :pp]]
        work = prefix[n_items] - prefix[ends]
        tail_work = tail_prefix[n_items] - tail_prefix[ends]
        best_bound = np.zeros(len(ends))
        for chunk, weight in chunk_terms:
            reach = f_prefix[starts[:, chunk * pp : (chunk + 1) * pp]] + reach_hops[chunk]
            through_drain = _water_levels(
                reach + drain + serial_p2p + weight * child_loads, open_after[k + 1], weight * work
            )
            through_tail = _water_levels(
                reach + serial_p2p + weight * child_loads + child_tails,
                open_after[k + 1],
                weight * work + tail_work,
            )
            best_bound = np.maximum(best_bound, np.maximum(through_drain, through_tail))
        # stages after (last chunk, r): known when placed, else at least the last items
        after_stage = last_chunk_start + np.arange(pp) + 1
        known_after = after_stage <= k + 1
        b_after = np.where(
            known_after,
            b_prefix[n_items] - b_prefix[starts[:, np.minimum(after_stage, stages - 1)]],
            b_prefix[n_items] - b_prefix[np.maximum(n_items - (stages - after_stage), 0)],
        )
        b_after[:, after_stage == stages] = 0.0
        first_backward = f_prefix[n_items] + b_after + drain + first_rates * child_loads
        bound = np.maximum(
            best_bound, _water_levels(first_backward, open_after[k + 1], work, first_rates)
        )
        # explore by the fill/drain bound (it ranks balanced children first), prune by all
        return np.where(over_cap, np.maximum(bound, threshold()), bound), best_bound

    suffix_best = stage_bounds = None
    if space.vpp == 1:
        stage_bounds = _one_f_one_b_stage_bounds(
            program, f_prefix, b_prefix, tail_prefix, hops, serial_p2p,
            [_forwards_before_first_backward(program, r) for r in range(pp)],
        )  # fmt: skip
        suffix_best = _suffix_minmax(stage_bounds, mtp_item, space.allow_standalone_mtp)

    deadline = time.monotonic() + time_limit_s

    def descend(
        k: int, start: int, loads: np.ndarray, tails: np.ndarray, cuts: list[int], worst: float
    ) -> None:
        state["nodes"] += 1
        if state["nodes"] % 1024 == 0 and time.monotonic() > deadline:
            state["out_of_time"] = True
        if k == stages - 1:
            pending.append(tuple(cuts))
            if len(pending) >= batch:
                flush()
            return
        highest = n_items - (stages - 1 - k)  # leave one item for each later stage
        if mtp_item is not None and not space.allow_standalone_mtp:
            highest = min(highest, mtp_item)  # MTP must stay in the last stage, with L
        ends = np.arange(start + 1, highest + 1)
        if mtp_item is not None and k < last_chunk_start:
            ends = ends[ends <= mtp_item]  # MTP only in the last virtual chunk
        if not len(ends):
            return
        if stage_bounds is not None:  # 1F1B: the exact min-max of per-stage bounds below
            own = np.maximum(worst, stage_bounds[k][start, ends])
            lower = preference = np.maximum(own, suffix_best[k + 1][ends])
        else:
            lower, preference = bounds(loads, tails, cuts, start, k, ends)
        order = np.argsort(preference, kind="stable")
        for position, index in enumerate(order):
            if state["nodes"] >= node_limit or state["out_of_time"]:  # what is left is unproven
                state["pruned"] = min(state["pruned"], float(lower[order[position:]].min()))
                break
            if lower[index] >= threshold() * (1 - gap):
                # a subtree bounded under the cap holds only layouts at or above the threshold
                state["pruned"] = min(state["pruned"], float(lower[index]), threshold())
                continue
            end = int(ends[index])
            child, child_tail = loads.copy(), tails.copy()
            child[k % pp] += prefix[end] - prefix[start]
            child_tail[k % pp] += tail_prefix[end] - tail_prefix[start]
            mine = float(stage_bounds[k][start, end]) if stage_bounds is not None else 0.0
            descend(k + 1, end, child, child_tail, [*cuts, end], max(worst, mine))
            if len(pending) >= batch:
                flush()

    pending.extend(_seed_cuts(space, prefix))
    flush()
    if best:  # walk the best seed downhill one boundary move at a time
        pending.extend(_local_search(space, program, model, max(best)[1]))
        flush()
    descend(0, 0, np.zeros(pp), np.zeros(pp), [], 0.0)
    flush()
    ranked = sorted((-s, c) for s, c in best)
    return ExactResult(
        cuts=np.array([c for _, c in ranked], dtype=np.int64).reshape(len(ranked), stages - 1),
        steps=np.array([s for s, _ in ranked]),
        proven_bound_ms=float(min(state["pruned"], np.inf)),
        simulated=state["simulated"],
        nodes=state["nodes"],
        rejected_memory=state["rejected"],
        complete=state["nodes"] < node_limit and not state["out_of_time"],
    )
