"""megatron-core's own order of work per pipeline rank, from its schedule functions: the oracle
the simulator's and the emulator's schedules are checked against."""

from __future__ import annotations

from types import SimpleNamespace

from search.pipeline_ops import BACKWARD, FORWARD, Compute, ScheduleShape


def megatron_order(shape: ScheduleShape, rank: int):
    """Per-rank computations as megatron-core's functions lay them out: warm-up forwards,
    steady (forward k + warm-up, backward k), cool-down backwards, over get_schedule_table."""
    from megatron.core.pipeline_parallel import schedules

    pp, vpp, microbatches, group = shape.pp, shape.vpp, shape.num_microbatches, shape.group_size

    communicator = SimpleNamespace(
        pp_group=SimpleNamespace(size=lambda: pp, rank=lambda: rank),
        virtual_pipeline_model_parallel_size=vpp if vpp > 1 else None,
    )
    total, _, warmup, remaining = schedules.get_pp_rank_microbatches(
        microbatches, vpp, group, p2p_communicator=communicator
    )
    if vpp == 1:
        table = [(mb, 0) for mb in range(microbatches)]
    else:
        table = schedules.get_schedule_table(microbatches, vpp, group)

    def forward(k):
        return Compute(FORWARD, table[k][0], table[k][1])

    def backward(k):
        return Compute(BACKWARD, table[k][0], vpp - 1 - table[k][1])

    order = [forward(k) for k in range(warmup)]
    for k in range(remaining):
        order += [forward(k + warmup), backward(k)]
    order += [backward(k) for k in range(remaining, total)]
    return order


def megatron_ops(shape: ScheduleShape, rank: int):
    """Every op of one rank (computations, p2p calls, waits) as megatron-core's interleaved
    schedule function issues them, run with stub communicators (the emulator's own trace)."""
    from launchers.emulated.megatron_trace import traced_program

    return traced_program(shape, rank)
