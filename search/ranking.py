"""From predictions to the ranked list every report shows: Monte Carlo where it can change the
top, one candidate per distinct prediction, and the merge of shard tops.

Ranking: mean Monte Carlo step time, ties (within ``tie_tolerance`` of the ideal step, on a fixed
grid so that ties are the same for every shard) broken by fewer ranks near the bottleneck, then
more memory headroom, then the layout string.  Monte Carlo is only run where it can change the
top: step time is a max of sums of op times, a convex function, so with mean-one noise the mean
is never below the noise-free step (Jensen); a layout whose noise-free step is already worse than
the k-th best mean cannot enter the top k.  Exactly equal noise-free predictions are one
candidate (``search.ties``): its representative is sampled, the others are counted.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from ray_layout.model.layout import Layout
from ray_layout.model.sizing import GIB
from search.cost_model import CostModel
from search.evaluate import monte_carlo, score, standard_normals
from search.schedule import Program
from search.space import LayoutSpace
from search.ties import TieClass, prediction_key, tie_break_key


@dataclass(frozen=True)
class PlanOptions:
    top: int = 10
    samples: int = 256  # Monte Carlo samples per layout (unused without jitter)
    seed: int = 0
    hbm_gib: float | None = None
    tie_tolerance: float = 0.0025
    block_size: int = 4096
    monte_carlo_batch: int = 32


@dataclass(frozen=True)
class Candidate:
    """A scored layout, as every report shows it."""

    layout: Layout
    mean_ms: float
    p90_ms: float
    noise_free_ms: float
    bottleneck_rank: int
    near_bottleneck: int
    memory_gib: tuple[float, ...]
    fits: bool | None  # None where no HBM limit was given: memory not checked
    mtp_standalone: bool
    recompute: tuple[str, ...] = ()  # the recompute flags it was simulated with (none: empty)

    @property
    def peak_memory_gib(self) -> float:
        return max(self.memory_gib)


@dataclass(frozen=True)
class ShardResult:
    """What one shard returns: its ranked candidates (one per distinct prediction it sampled),
    how many layouts share each prediction, and how much it looked at."""

    candidates: tuple[Candidate, ...]
    scored: int  # layouts simulated without noise
    sampled: int  # layouts simulated with Monte Carlo noise
    rejected_memory: int  # layouts over the HBM limit
    keys: tuple[tuple, ...] = field(default=(), repr=False)
    ties: tuple[int, ...] = ()  # layouts predicted exactly as each candidate (itself included)
    bound_ms: float | None = None  # exact search: no layout outside the candidates is faster
    nodes: int = 0
    complete: bool = True
    bound_reason: str = ""  # exact search: what leaves a gap between the bound and the pick
    smallest_peak_gib: float = float("inf")  # the lowest peak memory of any layout scored


def rank_key(candidate: Candidate, grid_ms: float, hbm_gib: float | None) -> tuple:
    headroom = (hbm_gib or 0.0) - candidate.peak_memory_gib
    return (
        int(candidate.mean_ms // grid_ms),
        candidate.near_bottleneck,
        -round(headroom, 6),
        candidate.mean_ms,
        str(candidate.layout),
    )


def candidates_of(
    space: LayoutSpace,
    program: Program,
    cost_model: CostModel,
    cuts: np.ndarray,
    steps: np.ndarray | None,
    hbm_gib: float | None,
) -> list[Candidate]:
    """Candidates of a batch of layouts, scored once (``steps``: their Monte Carlo samples)."""
    counts = space.unit_counts(cuts, cost_model.units, cost_model.moe_pattern)
    scores = score(program, cost_model, counts)
    near, bottleneck = scores.near_bottleneck, scores.bottleneck_rank  # once for the batch
    memory = scores.memory_bytes / GIB
    found = []
    for row, layout_cuts in enumerate(cuts):
        layout = Layout(space.stages_from_cuts(tuple(int(c) for c in layout_cuts)), space.pp)
        noise_free = float(scores.noise_free_ms[row])
        sampled = steps[row] if steps is not None else None
        found.append(
            Candidate(
                layout=layout,
                mean_ms=float(sampled.mean()) if sampled is not None else noise_free,
                p90_ms=float(np.quantile(sampled, 0.9)) if sampled is not None else noise_free,
                noise_free_ms=noise_free,
                bottleneck_rank=int(bottleneck[row]),
                near_bottleneck=int(near[row]),
                memory_gib=tuple(float(x) for x in memory[row]),
                fits=None if hbm_gib is None else float(memory[row].max()) <= hbm_gib,
                mtp_standalone=bool(scores.standalone[row]),
            )
        )
    return found


def best_of(
    space: LayoutSpace,
    program: Program,
    cost_model: CostModel,
    options: PlanOptions,
    classes: Iterable[TieClass],
    grid_ms: float,
) -> ShardResult:
    """Every class that can enter the top, ranked: representatives sampled in ascending noise-free
    order until the next cannot beat the ``options.top``-th mean (Jensen's bound)."""
    normals = (
        standard_normals(program, options.samples, options.seed) if cost_model.has_jitter else None
    )
    pending = iter(classes)
    ranked: list[tuple[tuple, Candidate, int]] = []
    sampled = 0
    while True:
        batch = []
        for tie in pending:
            if len(ranked) >= options.top:
                worst_mean = max(c.mean_ms for _, c, _ in ranked[: options.top])
                if tie.step_ms > worst_mean + grid_ms:
                    break
            batch.append(tie)
            if len(batch) == options.monte_carlo_batch:
                break
        if not batch:
            break
        cuts = np.array([tie.cuts for tie in batch], dtype=np.int64).reshape(len(batch), -1)
        steps = None
        if normals is not None:
            counts = space.unit_counts(cuts, cost_model.units, cost_model.moe_pattern)
            steps = monte_carlo(program, cost_model, counts, normals)
            sampled += len(batch)
        for tie, candidate in zip(
            batch,
            candidates_of(space, program, cost_model, cuts, steps, options.hbm_gib),
            strict=True,
        ):
            ranked.append((rank_key(candidate, grid_ms, options.hbm_gib), candidate, tie.count))
        ranked.sort(key=lambda entry: entry[0])
    return ShardResult(
        candidates=tuple(c for _, c, _ in ranked),
        scored=0,
        sampled=sampled,
        rejected_memory=0,
        keys=tuple(k for k, _, _ in ranked),
        ties=tuple(n for _, _, n in ranked),
    )


def merge(results: list[ShardResult], top: int) -> ShardResult:
    """Shard results into the overall top: one candidate per prediction (the tie-break picks the
    representative, counts add up), ranked by the key every shard ranked with."""
    by_prediction: dict[float, tuple[tuple, Candidate, int, tuple]] = {}
    for result in results:
        for key, candidate, count in zip(result.keys, result.candidates, result.ties, strict=True):
            prediction = float(prediction_key(candidate.noise_free_ms))
            order = tie_break_key(
                candidate.near_bottleneck, candidate.peak_memory_gib, str(candidate.layout)
            )
            known = by_prediction.get(prediction)
            if known is None:
                by_prediction[prediction] = (key, candidate, count, order)
            else:
                best = (
                    (key, candidate, order) if order < known[3] else (known[0], known[1], known[3])
                )
                by_prediction[prediction] = (best[0], best[1], known[2] + count, best[2])
    bounds = [r.bound_ms for r in results if r.bound_ms is not None]
    entries = list(by_prediction.values())
    if bounds:  # exact search: the single process ranks only the best `top` predictions
        entries.sort(key=lambda entry: entry[1].noise_free_ms)
        bounds += [c.noise_free_ms for _, c, _, _ in entries[top:]]  # not listed
        entries = entries[:top]
    ranked = sorted(entries, key=lambda entry: entry[0])
    bounds += [c.noise_free_ms for _, c, _, _ in ranked[top:]] if bounds else []
    ranked = ranked[:top]
    return ShardResult(
        candidates=tuple(c for _, c, _, _ in ranked),
        scored=sum(r.scored for r in results),
        sampled=sum(r.sampled for r in results),
        rejected_memory=sum(r.rejected_memory for r in results),
        keys=tuple(k for k, _, _, _ in ranked),
        ties=tuple(n for _, _, n, _ in ranked),
        bound_ms=min(bounds) if bounds else None,
        nodes=sum(r.nodes for r in results),
        complete=all(r.complete for r in results),
        bound_reason=min(results, key=_binding).bound_reason if bounds else "",
        smallest_peak_gib=min((r.smallest_peak_gib for r in results), default=float("inf")),
    )


def _binding(result: ShardResult) -> float:
    """The shard whose bound is the plan's: the lowest."""
    return result.bound_ms if result.bound_ms is not None else np.inf
