"""What a step costs beyond the units' compute, fitted from the runs' step times and step-tail
timers: a per-transfer latency and a fixed tail (against the simulated step), and gradient sync
and optimizer time per billion parameters a GPU holds."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from ray_layout.measure.observations import RunObservation
from ray_layout.measure.solvers import bounded_minimum
from ray_layout.model.costs import UnitCosts
from ray_layout.model.fields import ModelSpec
from ray_layout.model.layout import Layout
from ray_layout.model.memory_settings import PLAIN, MemorySettings
from ray_layout.model.sizing import stage_sizes
from ray_layout.model.spec import ParallelConfig
from search.planner import PlanOptions, Problem, SearchSpec, score_given


def simulated_step_ms(
    model: ModelSpec,
    parallel: ParallelConfig,
    costs: UnitCosts,
    run: RunObservation,
    memory: MemorySettings = PLAIN,
) -> float:
    """The step the planner predicts for a run's layout and micro-batches, with the
    recomputation of the run's ``memory`` flags: the mean over its Monte Carlo jitter, as every
    prediction the tune makes.  Per-op jitter lengthens the mean step beyond the noise-free one
    (the critical path takes the slower of its branches), so a fixed tail fitted against the
    noise-free step would count that twice."""
    spec, options = SearchSpec(num_microbatches=run.num_microbatches), PlanOptions()
    run_parallel = replace(parallel, pp=run.layout.pp, vpp=run.layout.vpp)
    problem = Problem(
        model, run_parallel, costs, spec, options, memory=memory, p2p_overlap=run.overlapped_p2p
    )
    return score_given(run.layout, problem).mean_ms


# A per-transfer latency is kept where it at least halves the RMS relative step error the fixed
# tail alone leaves, and that error is above STEP_NOISE_FLOOR (below it nothing is to explain).
STEP_EVIDENCE = 0.5
STEP_NOISE_FLOOR = 1e-4


def step_overheads(
    model: ModelSpec,
    parallel: ParallelConfig,
    costs: UnitCosts,
    runs: Sequence[RunObservation],
    memory: MemorySettings = PLAIN,
) -> tuple[float, float, dict[str, float], list[str]]:
    """What the timers miss of the measured steps: a per-transfer latency (ms, >= 0), a fixed
    per-step tail (ms, >= 0), each run's remaining error and a warning where the runs cannot
    tell the two apart.  The steps are simulated with what the runs' ``memory`` flags
    recompute, which the costs' backward leaves out and the runs' steps paid.

    The fastest p2p call the timers saw is the bare transfer; a typical call also pays launch
    and synchronisation costs that no timer isolates (the emulator's Python and gloo overhead,
    NCCL's launch latency), once per transfer on the critical path.  A step also pays a constant
    (optimizer and grad-norm launches, logging) whatever the layout.  Both are fitted on the
    runs' step times, least squares on the relative error: the fixed tail in closed form for
    each latency.  The latency is kept only where it explains the steps clearly better than the
    fixed tail alone (STEP_EVIDENCE), so that p2p stays the transfer the timers measured unless the
    runs (other micro-batch counts or PP sizes: other transfer counts) show a latency."""
    timed = [run for run in runs if run.step_ms]
    if not timed:
        return 0.0, 0.0, {}, []
    measured = np.array([run.step_ms for run in timed])

    def simulated(latency: float, fixed: float = 0.0) -> np.ndarray:
        shifted = replace(
            costs,
            p2p_intra_node_ms=costs.p2p_intra_node_ms + latency,
            p2p_inter_node_ms=costs.p2p_inter_node_ms + latency,
            tail_fixed_ms=fixed,
        )
        return np.array([simulated_step_ms(model, parallel, shifted, run, memory) for run in timed])

    bare = simulated(0.0)
    per_fixed = simulated(0.0, 1.0) - bare  # 1, or the MTP-standalone factor

    def fitted(latency: float) -> tuple[float, np.ndarray]:
        steps = bare if latency == 0.0 else simulated(latency)
        weight = per_fixed / measured
        fixed = max(0.0, float(weight @ ((measured - steps) / measured) / (weight @ weight)))
        return fixed, (steps + fixed * per_fixed) / measured - 1.0

    def rms(latency: float) -> float:
        return float(np.sqrt(np.mean(fitted(latency)[1] ** 2)))

    upper = float(measured.max()) / max(run.num_microbatches for run in timed)
    best, least = bounded_minimum(rms, 0.0, upper, 1e-3, "the per-transfer latency")
    alone = rms(0.0)
    latency = best if alone > STEP_NOISE_FLOOR and least < STEP_EVIDENCE * alone else 0.0
    fixed, errors = fitted(latency)
    warnings = []
    transfers = simulated(1.0) - bare  # each run's step per ms of latency
    if fixed > 0 and np.ptp(transfers / per_fixed) < 0.5:
        warnings.append(
            f"the runs' steps exceed the simulated ones by {fixed:.2f} ms, taken as a fixed step "
            "tail: they cannot tell it from a per-transfer latency (every run has as many "
            "transfers on its critical path); a run with other micro-batches would separate them"
        )
    return latency, fixed, {r.name: float(e) for r, e in zip(timed, errors, strict=True)}, warnings


def _gparams_per_rank(model: ModelSpec, parallel: ParallelConfig, layout: Layout) -> np.ndarray:
    run = replace(parallel, pp=layout.pp, vpp=layout.vpp)
    return np.array([s.gpu_gigaparams for s in stage_sizes(model, run, layout.stages)])


def step_tail(
    model: ModelSpec, parallel: ParallelConfig, runs: Sequence[RunObservation]
) -> dict[str, float]:
    """Gradient sync and optimizer ms per billion parameters a GPU holds, through the origin."""
    found = {}
    for timer, key in (
        ("all-grads-sync", "grad_sync_ms_per_gparam"),
        ("optimizer", "optimizer_ms_per_gparam"),
    ):
        xs, ys = [], []
        for run in runs:
            if timer in run.timers:
                xs.append(_gparams_per_rank(model, parallel, run.layout))
                ys.append(run.timers[timer].mean(axis=0))
        if xs:
            x, y = np.concatenate(xs), np.concatenate(ys)
            found[key] = float(max(0.0, (x @ y) / max(x @ x, 1e-12)))
    return found
