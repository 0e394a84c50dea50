"""Score batches of layouts: stage costs, simulated step (noise-free and Monte Carlo), memory.

Layouts arrive as unit counts per flat stage, ``counts[n, stage, unit]``; every cost is linear in
them, so a batch of thousands of layouts turns into a few matrix products and one run of the
straight-line recurrence (``search.recurrence``).  Monte Carlo noise uses common random numbers:
the same standard normals for every layout of a run, so that comparisons between layouts are not
swamped by sampling noise and a layout scores the same whichever shard evaluates it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ray_layout.model.sizing import DECODER_UNITS
from search.cost_model import CostModel
from search.recurrence import step_ms
from search.schedule import Program
from search.ties import critical_ranks


@dataclass(frozen=True)
class Scores:
    """One row per layout of the batch."""

    noise_free_ms: np.ndarray  # (n,)
    rank_load_ms: np.ndarray  # (n, PP) compute per micro-batch, all chunks of the rank
    memory_bytes: np.ndarray  # (n, PP) peak per rank
    standalone: np.ndarray  # (n,) bool

    @property
    def bottleneck_rank(self) -> np.ndarray:
        return self.rank_load_ms.argmax(axis=1)

    @property
    def near_bottleneck(self) -> np.ndarray:
        return critical_ranks(self.rank_load_ms)

    @property
    def peak_memory_bytes(self) -> np.ndarray:
        return self.memory_bytes.max(axis=1)


def stage_times(cost_model: CostModel, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(n, S) forward and backward ms of each flat stage, block recomputation included."""
    backward = counts @ cost_model.backward_ms
    if cost_model.block_recompute_ms is not None:
        backward = backward + first_layers(cost_model, counts, cost_model.block_recompute_ms)
    return counts @ cost_model.forward_ms, backward


def first_layers(cost_model: CostModel, counts: np.ndarray, per_unit: np.ndarray) -> np.ndarray:
    """(n, S) ``per_unit`` summed over each flat stage's first ``block_layers`` decoder layers
    (each chunk's own, as ``--recompute-method block`` counts them): flat stages hold
    consecutive layers in model order, so a stage's first layer is the count before it."""
    decoder = [i for i, unit in enumerate(cost_model.units) if unit in DECODER_UNITS]
    layers = counts[..., decoder].sum(axis=-1).astype(int)
    start = np.cumsum(layers, axis=1) - layers
    prefix = np.concatenate([[0.0], np.cumsum(per_unit[cost_model.layer_units])])
    return prefix[start + np.minimum(layers, cost_model.block_layers)] - prefix[start]


def _per_rank(values: np.ndarray, pp: int) -> np.ndarray:
    """(n, S) per flat stage -> (n, PP) summed over each rank's chunks."""
    return values.reshape(values.shape[0], -1, pp).sum(axis=1)


def _standalone_rank(counts: np.ndarray, cost_model: CostModel, pp: int) -> np.ndarray:
    """(n, PP) bool: the rank holds MTP but not the loss (it then builds an embedding copy)."""
    per_rank = counts.reshape(counts.shape[0], -1, pp, counts.shape[2]).sum(axis=1)
    mtp = per_rank[..., cost_model.units.index("m")] > 0 if "m" in cost_model.units else None
    if mtp is None:
        return np.zeros(per_rank.shape[:2], dtype=bool)
    return mtp & (per_rank[..., cost_model.units.index("L")] == 0)


def memory(cost_model: CostModel, counts: np.ndarray, pp: int) -> np.ndarray:
    """(n, PP) peak bytes per rank: static state, activations in flight, logits, overhead."""
    n, stages, _ = counts.shape
    static = _per_rank(counts @ cost_model.static_bytes, pp)
    held = counts @ cost_model.activation_bytes
    if cost_model.block_saving_bytes is not None:
        held = held - first_layers(cost_model, counts, cost_model.block_saving_bytes)
    activations = held.reshape(n, stages // pp, pp)
    in_flight = cost_model.in_flight.T[None]  # (1, VPP, PP)
    overhead = cost_model.overhead_bytes + cost_model.recompute_bytes
    total = static + (activations * in_flight).sum(axis=1) + overhead
    total[:, -1] += cost_model.logits_bytes
    return total + _standalone_rank(counts, cost_model, pp) * cost_model.standalone_copy_bytes


def tail_ms(cost_model: CostModel, counts: np.ndarray, pp: int) -> np.ndarray:
    """(n, PP) gradient sync + optimizer step of each rank after the pipeline, and the fixed
    per-step overhead."""
    params = _per_rank(counts @ cost_model.tail_params, pp)
    params = params + _standalone_rank(counts, cost_model, pp) * cost_model.standalone_copy_params
    return params * cost_model.tail_ms_per_gparam + cost_model.tail_fixed_ms


def hidden_ms(program: Program, cost_model: CostModel, counts: np.ndarray) -> np.ndarray | None:
    """(PP x VPP x VPP, n) what each merged pair of combined 1F1B hides; None without merges."""
    if cost_model.merge is None or not program.shape.combined:
        return None
    return cost_model.merge.hidden_ms(counts, program.shape.pp, program.shape.vpp)


def score(program: Program, cost_model: CostModel, counts: np.ndarray) -> Scores:
    """Noise-free step, loads and memory of a batch of layouts."""
    forward, backward = stage_times(cost_model, counts)
    tail = tail_ms(cost_model, counts, program.shape.pp)
    standalone = _standalone_rank(counts, cost_model, program.shape.pp).any(axis=1)
    hidden = hidden_ms(program, cost_model, counts)
    step = step_ms(program, forward.T, backward.T, cost_model.p2p_ms, tail.T, hidden_ms=hidden)
    factor = np.where(standalone, cost_model.mtp_standalone_factor, 1.0)
    return Scores(
        noise_free_ms=step * factor,
        rank_load_ms=_per_rank(forward + backward, program.shape.pp),
        memory_bytes=memory(cost_model, counts, program.shape.pp),
        standalone=standalone,
    )


def standard_normals(program: Program, samples: int, seed: int) -> np.ndarray:
    """(compute ops, samples) draws shared by every layout of a run."""
    return np.random.default_rng(seed).standard_normal((program.num_compute, samples))


def monte_carlo(
    program: Program, cost_model: CostModel, counts: np.ndarray, normals: np.ndarray
) -> np.ndarray:
    """(n, samples) step times with per-op lognormal noise (mean 1) of each stage's CV.

    A stage's CV combines its units' as independent parts: sqrt(sum (cv_u * t_u)^2) / sum t_u.
    """
    n = counts.shape[0]
    samples = normals.shape[1]
    forward, backward = stage_times(cost_model, counts)
    spread_f = np.sqrt(counts @ (cost_model.jitter_cv * cost_model.forward_ms) ** 2)
    spread_b = np.sqrt(counts @ (cost_model.jitter_cv * cost_model.backward_ms) ** 2)
    with np.errstate(invalid="ignore", divide="ignore"):
        cv = np.nan_to_num(np.concatenate([spread_f / forward, spread_b / backward], axis=1))
    sigma = np.sqrt(np.log1p(cv**2))  # (n, 2S) lognormal parameters for mean 1
    ops = program.compute_slot[program.is_compute]  # slot of each compute op
    op_sigma = sigma[:, ops].T  # (C, n)
    noise = np.exp(op_sigma[:, :, None] * normals[:, None, :] - op_sigma[:, :, None] ** 2 / 2)
    repeat = np.repeat(np.arange(n), samples)
    tail = tail_ms(cost_model, counts, program.shape.pp)
    hidden = hidden_ms(program, cost_model, counts)
    step = step_ms(
        program,
        forward.T[:, repeat],
        backward.T[:, repeat],
        cost_model.p2p_ms,
        tail.T[:, repeat],
        noise=noise.reshape(noise.shape[0], n * samples),
        hidden_ms=None if hidden is None else hidden[:, repeat],
    )
    standalone = _standalone_rank(counts, cost_model, program.shape.pp).any(axis=1)
    factor = np.where(standalone, cost_model.mtp_standalone_factor, 1.0)
    return step.reshape(n, samples) * factor[:, None]
