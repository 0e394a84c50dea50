"""The schedule simulator: Megatron's own order, closed forms, hand-worked cases, jitter."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from search.schedule import (
    BACKWARD,
    FORWARD,
    Compute,
    P2PCall,
    compile_schedule,
    compute_order,
    rank_ops,
)
from search.simulator import simulate, stage_durations, timeline
from tests.megatron_oracle import MEGATRON_CPU_WARNINGS

pytestmark = [pytest.mark.filterwarnings(w) for w in MEGATRON_CPU_WARNINGS]


def megatron_order(pp: int, rank: int, vpp: int, microbatches: int, group: int):
    """Per-rank computations as megatron-core's functions lay them out: warm-up forwards,
    steady (forward k + warm-up, backward k), cool-down backwards, over get_schedule_table."""
    from megatron.core.pipeline_parallel import schedules

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


CASES = [(pp, 1, m, pp) for pp in (2, 3, 4, 8) for m in (1, 2, 3, 4, 7, 8, 16)] + [
    (pp, vpp, m, group)
    for pp, vpp in ((2, 2), (3, 2), (4, 2), (4, 3), (4, 4), (8, 2), (16, 2))
    for m, group in ((pp, pp), (2 * pp, pp), (3 * pp, pp), (4 * pp, 2 * pp), (2 * pp, 2 * pp),
                     (pp + 1, pp + 1))
]  # fmt: skip


@pytest.mark.parametrize(("pp", "vpp", "microbatches", "group"), CASES)
def test_order_equals_megatron_core(pp, vpp, microbatches, group):
    program = compile_schedule(pp, vpp, microbatches, group)  # raises if the calls deadlock
    orders = compute_order(pp, vpp, microbatches, group)
    for rank in range(pp):
        assert orders[rank] == megatron_order(pp, rank, vpp, microbatches, group)
    assert len(program.order) == len(program.ops)


def test_one_f_one_b_doc_example():
    """Rank 0, PP=4, M=8: F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7 (megatron.md)."""
    labels = [f"{op.kind}{op.microbatch}" for op in compute_order(4, 1, 8)[0]]
    assert " ".join(labels) == "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7"


def test_p2p_calls_follow_megatron_for_1f1b():
    ops = rank_ops(3, 1, 4)[1]  # a middle rank: warm-up 1, steady 3, cool-down 1
    names = [op.name if isinstance(op, P2PCall) else f"{op.kind}{op.microbatch}" for op in ops]
    assert names == [
        "recv_forward", "F0", "send_forward", "recv_forward",
        "F1", "send_forward_recv_backward", "B0", "send_backward_recv_forward",
        "F2", "send_forward_recv_backward", "B1", "send_backward_recv_forward",
        "F3", "send_forward_recv_backward", "B2", "send_backward",
        "recv_backward", "B3", "send_backward",
    ]  # fmt: skip


@pytest.mark.parametrize(("pp", "microbatches"), [(2, 1), (4, 2), (4, 8), (8, 8), (8, 32)])
def test_uniform_1f1b_closed_form(pp, microbatches):
    f, b = 1.5, 3.25
    times = simulate(compile_schedule(pp, 1, microbatches), stage_durations([f] * pp),
                     stage_durations([b] * pp), np.zeros(pp))  # fmt: skip
    assert times.step[0] == pytest.approx((microbatches + pp - 1) * (f + b))
    assert times.bubble_fraction[0] == pytest.approx((pp - 1) / (microbatches + pp - 1))


@pytest.mark.parametrize(("pp", "vpp", "microbatches"), [(4, 2, 8), (4, 4, 16), (8, 2, 16),
                                                         (3, 3, 9), (16, 2, 32)])  # fmt: skip
def test_uniform_interleaved_closed_form(pp, vpp, microbatches):
    """Each chunk costs 1/VPP of the rank: the bubble shrinks to (PP - 1)/VPP chunk rounds."""
    f, b = 1.0, 2.0
    stages = pp * vpp
    times = simulate(compile_schedule(pp, vpp, microbatches), stage_durations([f / vpp] * stages),
                     stage_durations([b / vpp] * stages), np.zeros(pp))  # fmt: skip
    assert times.step[0] == pytest.approx((microbatches + (pp - 1) / vpp) * (f + b))


def test_hand_worked_heterogeneous_two_stages():
    """PP=2, M=2; stage 0 f=1 b=2, stage 1 f=3 b=1, free p2p, worked out by hand:
    rank 1 runs F0 [1,4] B0 [4,5]; its send_backward_recv_forward meets rank 0's
    send_forward_recv_backward (posted at 2) at 5; F1 [5,8] B1 [8,9]; rank 0 runs B0 [5,7],
    waits for grad 1 until 9, B1 [9,11]."""
    program = compile_schedule(2, 1, 2)
    times = simulate(program, stage_durations([1, 3]), stage_durations([2, 1]), np.zeros(2),
                     keep_events=True)  # fmt: skip
    assert times.step[0] == 11
    assert times.finish[:, 0].tolist() == [11, 9]
    bars = {(e.rank, e.label): (e.start, e.end) for e in timeline(program, times) if e.is_compute}
    assert bars[(1, "F0")] == (1, 4) and bars[(1, "F1")] == (5, 8)
    assert bars[(0, "B0")] == (5, 7) and bars[(0, "B1")] == (9, 11)


def test_p2p_time_is_paid_on_every_transfer_of_the_critical_path():
    pp, m, f, b, p2p = 4, 8, 1.0, 2.0, 0.1
    program = compile_schedule(pp, 1, m)
    free = simulate(program, stage_durations([f] * pp), stage_durations([b] * pp), np.zeros(pp))
    paid = simulate(program, stage_durations([f] * pp), stage_durations([b] * pp),
                    np.full(pp, p2p))  # fmt: skip
    assert paid.step[0] > free.step[0] + 2 * (pp - 1) * p2p - 1e-9  # at least fill and drain


def test_tail_adds_per_rank_after_the_pipeline():
    program = compile_schedule(2, 1, 2)
    times = simulate(program, stage_durations([1, 3]), stage_durations([2, 1]), np.zeros(2),
                     tail_ms=np.array([[1.0], [5.0]]))  # fmt: skip
    assert times.step[0] == 14  # rank 1 ends its pipeline at 9, then 5 of tail
    assert times.idle[:, 0].tolist() == [14 - 6 - 1, 14 - 8 - 5]


def test_batch_columns_are_independent():
    program = compile_schedule(4, 1, 8)
    f = np.array([[1.0, 2.0], [1.0, 1.0], [1.0, 1.0], [1.0, 1.0]])
    batch = simulate(program, f, 2 * f, np.zeros(4)).step
    for column in range(2):
        alone = simulate(program, f[:, [column]], 2 * f[:, [column]], np.zeros(4)).step
        assert batch[column] == alone[0]


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="group size"):
        compile_schedule(4, 2, 8, 2)
    with pytest.raises(ValueError, match="needs micro-batches"):
        compile_schedule(4, 2, 3)
