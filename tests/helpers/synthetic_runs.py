"""Megatron logs of runs that never happened: known unit costs -> the text Megatron would print.

Each logged iteration is simulated with ``search.schedule`` (per-op lognormal noise), so the
timers carry what real ones do: compute per rank, waiting inside p2p calls, the step tail.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ray_layout.measure.log_format import (
    P2P_TIMER_OF_CALL,
    TIMER_LOGGER_PREFIX,
    iteration_line,
    memory_line,
    timers_all,
)
from ray_layout.model.costs import UnitCosts
from ray_layout.model.fields import ModelSpec
from ray_layout.model.layout import Layout
from ray_layout.model.spec import ParallelConfig
from search.cost_model import build_cost_model
from search.evaluate import memory, stage_times, tail_ms
from search.pipeline_ops import Compute, P2PCall, ScheduleShape
from search.schedule import compile_schedule
from search.simulator import simulate
from search.space import LayoutSpace


def synthetic_log(
    model: ModelSpec,
    parallel: ParallelConfig,
    layout: Layout,
    costs: UnitCosts,
    num_microbatches: int,
    iterations: int = 6,
    noise_cv: float = 0.0,
    seed: int = 0,
    extra_p2p_ms: float = 0.0,
) -> str:
    """The text of a Megatron run with ``--timing-log-level 2 --timing-log-option all
    --log-interval 1``: an iteration line, memory lines (first two) and a timer block each
    iteration; the first block shows Megatron's first-interval quirk (it is not reset).

    ``extra_p2p_ms``: a per-transfer latency that only the printed step time pays.  The
    iteration is simulated a second time (same noise) with it added to every link; the timers
    stay those of the bare transfers, which is what the fit reads them as (its fastest call),
    while the step carries the latency on every transfer of the critical path, as a real one
    carries launch and synchronisation costs that no timer isolates.  ``costs.tail_fixed_ms``
    likewise: the step pays it on every rank, the gradient-sync and optimizer timers do not
    show it (Megatron times neither the iteration's launches nor its logging)."""
    run = replace(parallel, pp=layout.pp, vpp=layout.vpp)
    program = compile_schedule(ScheduleShape(run.pp, run.vpp, num_microbatches))
    cost_model = build_cost_model(model, run, costs, num_microbatches)
    space, cuts = LayoutSpace.holding(layout)
    counts = space.unit_counts(cuts[None], cost_model.units, cost_model.moe_pattern)
    forward, backward = stage_times(cost_model, counts)
    tail = tail_ms(cost_model, counts, run.pp)[0]
    # Megatron's "max allocated" is PyTorch's allocator: no CUDA context, NCCL or slack
    peak_mb = (memory(cost_model, counts, run.pp)[0] - cost_model.overhead_bytes) / 2**20
    rng = np.random.default_rng(seed)
    per_stage = run.world_size // run.pp
    sigma = np.sqrt(np.log1p(noise_cv**2))
    grad_share = costs.grad_sync_ms_per_gparam / max(
        costs.grad_sync_ms_per_gparam + costs.optimizer_ms_per_gparam, 1e-12
    )
    batch = num_microbatches * run.micro_batch_size * run.dp
    lines: list[str] = []
    carried: dict[str, np.ndarray] = {}
    for iteration in range(1, iterations + 1):
        noise = np.exp(sigma * rng.standard_normal((program.num_compute, 1)) - sigma**2 / 2)
        times = simulate(program, forward.T, backward.T, cost_model.p2p_ms, tail[:, None],
                         noise=noise, keep_events=True)  # fmt: skip
        step = float(times.step[0])
        if extra_p2p_ms:
            step = float(simulate(program, forward.T, backward.T, cost_model.p2p_ms + extra_p2p_ms,
                                  tail[:, None], noise=noise).step[0])  # fmt: skip
        per_rank: dict[str, np.ndarray] = {}
        for op_id, op in enumerate(program.ops):
            if isinstance(op, Compute):
                timer = "forward-compute" if op.kind == "F" else "backward-compute"
            elif isinstance(op, P2PCall):
                timer = P2P_TIMER_OF_CALL[op.name]
            duration = times.end[op_id, 0] - times.start[op_id, 0]
            per_rank.setdefault(timer, np.zeros(run.pp))[program.rank[op_id]] += duration
        timed_tail = tail - costs.tail_fixed_ms
        per_rank["all-grads-sync"] = timed_tail * grad_share
        per_rank["optimizer"] = timed_tail * (1 - grad_share)
        per_rank["forward-backward"] = times.finish[:, 0]
        # the first logged interval is not reset: the second one carries it again
        shown = {k: v + carried.get(k, 0) for k, v in per_rank.items()}
        carried = per_rank if iteration == 1 else {}
        lines.append(iteration_line(
            iteration, iterations, iteration * batch, step, batch,
            {"lm loss": 10.0 - 0.01 * iteration}))  # fmt: skip
        if iteration <= 2:
            for stage in range(run.pp):
                mb = peak_mb[stage]
                lines.append(memory_line(stage * per_stage, iteration, 0.6 * mb, mb, 1.05 * mb,
                                         1.05 * mb))  # fmt: skip
        block = {
            timer: {g: float(values[g // per_stage]) for g in range(run.world_size)}
            for timer, values in shown.items()
        }
        lines.append(timers_all(block, TIMER_LOGGER_PREFIX))
    return "\n".join(lines) + "\n"
