"""The plain simulator: closed forms, a hand-worked case, p2p and tails paid where they fall,
batch columns and noise, and the timeline it draws."""

from __future__ import annotations

import numpy as np
import pytest

from search.pipeline_ops import ScheduleShape
from search.schedule import compile_schedule
from search.simulator import simulate, stage_durations, timeline


@pytest.mark.parametrize(("pp", "microbatches"), [(2, 1), (4, 2), (4, 8), (8, 8), (8, 32)])
def test_uniform_1f1b_closed_form(pp, microbatches):
    f, b = 1.5, 3.25
    times = simulate(
        compile_schedule(ScheduleShape(pp, 1, microbatches)),
        stage_durations([f] * pp),
        stage_durations([b] * pp),
        np.zeros(pp),
    )
    assert times.step[0] == pytest.approx((microbatches + pp - 1) * (f + b))
    assert times.bubble_fraction[0] == pytest.approx((pp - 1) / (microbatches + pp - 1))


@pytest.mark.parametrize(
    ("pp", "vpp", "microbatches"), [(4, 2, 8), (4, 4, 16), (8, 2, 16), (3, 3, 9), (16, 2, 32)]
)
def test_uniform_interleaved_closed_form(pp, vpp, microbatches):
    """Each chunk costs 1/VPP of the rank: the bubble shrinks to (PP - 1)/VPP chunk rounds."""
    f, b = 1.0, 2.0
    stages = pp * vpp
    times = simulate(
        compile_schedule(ScheduleShape(pp, vpp, microbatches)),
        stage_durations([f / vpp] * stages),
        stage_durations([b / vpp] * stages),
        np.zeros(pp),
    )
    assert times.step[0] == pytest.approx((microbatches + (pp - 1) / vpp) * (f + b))


def test_hand_worked_heterogeneous_two_stages():
    """PP=2, M=2; stage 0 f=1 b=2, stage 1 f=3 b=1, free p2p, worked out by hand:
    rank 1 runs F0 [1,4] B0 [4,5]; its send_backward_recv_forward meets rank 0's
    send_forward_recv_backward (posted at 2) at 5; F1 [5,8] B1 [8,9]; rank 0 runs B0 [5,7],
    waits for grad 1 until 9, B1 [9,11]."""
    program = compile_schedule(ScheduleShape(2, 1, 2))
    times = simulate(
        program, stage_durations([1, 3]), stage_durations([2, 1]), np.zeros(2), keep_events=True
    )
    assert times.step[0] == 11
    assert times.finish[:, 0].tolist() == [11, 9]
    bars = {(e.rank, e.label): (e.start, e.end) for e in timeline(program, times) if e.is_compute}
    assert bars[(1, "F0")] == (1, 4) and bars[(1, "F1")] == (5, 8)
    assert bars[(0, "B0")] == (5, 7) and bars[(0, "B1")] == (9, 11)


def test_p2p_time_is_paid_on_every_transfer_of_the_critical_path():
    pp, m, f, b, p2p = 4, 8, 1.0, 2.0, 0.1
    program = compile_schedule(ScheduleShape(pp, 1, m))
    free = simulate(program, stage_durations([f] * pp), stage_durations([b] * pp), np.zeros(pp))
    paid = simulate(program, stage_durations([f] * pp), stage_durations([b] * pp), np.full(pp, p2p))
    assert paid.step[0] > free.step[0] + 2 * (pp - 1) * p2p - 1e-9  # at least fill and drain


def test_tail_adds_per_rank_after_the_pipeline():
    program = compile_schedule(ScheduleShape(2, 1, 2))
    times = simulate(
        program,
        stage_durations([1, 3]),
        stage_durations([2, 1]),
        np.zeros(2),
        tail_ms=np.array([[1.0], [5.0]]),
    )
    assert times.step[0] == 14  # rank 1 ends its pipeline at 9, then 5 of tail
    assert times.idle[:, 0].tolist() == [14 - 6 - 1, 14 - 8 - 5]


def test_batch_columns_are_independent():
    program = compile_schedule(ScheduleShape(4, 1, 8))
    f = np.array([[1.0, 2.0], [1.0, 1.0], [1.0, 1.0], [1.0, 1.0]])
    batch = simulate(program, f, 2 * f, np.zeros(4)).step
    for column in range(2):
        alone = simulate(program, f[:, [column]], 2 * f[:, [column]], np.zeros(4)).step
        assert batch[column] == alone[0]


def test_noise_multiplies_each_compute_op():
    """Noise of 2 on every op of a free-p2p pipeline is every duration doubled; noise on one op
    (rows in op-id order) lengthens that op alone."""
    program = compile_schedule(ScheduleShape(2, 1, 2))
    f, b = stage_durations([1, 3]), stage_durations([2, 1])
    plain = simulate(program, f, b, np.zeros(2), keep_events=True)
    doubled = simulate(program, f, b, np.zeros(2), noise=np.full((program.num_compute, 1), 2.0))
    assert doubled.step[0] == 2 * plain.step[0]
    assert doubled.busy[:, 0].tolist() == (2 * plain.busy[:, 0]).tolist()
    noise = np.ones((program.num_compute, 1))
    noise[1] = 1.5
    one = simulate(program, f, b, np.zeros(2), noise=noise, keep_events=True)
    second = np.flatnonzero(program.is_compute)[1]
    length = plain.end[second, 0] - plain.start[second, 0]
    assert one.end[second, 0] - one.start[second, 0] == 1.5 * length
    rank = program.rank[second]
    assert one.busy[rank, 0] - plain.busy[rank, 0] == pytest.approx(0.5 * length)


def test_the_timeline_names_ops_and_matches_the_simulated_ends():
    program = compile_schedule(ScheduleShape(2, 2, 4))
    times = simulate(
        program,
        stage_durations([1, 1, 2, 2]),
        stage_durations([2, 2, 3, 3]),
        np.full(2, 0.5),
        keep_events=True,
    )
    events = timeline(program, times)
    assert len(events) == len(program.ops)
    computes = [e for e in events if e.is_compute]
    assert {e.label for e in computes if e.rank == 0} >= {"F0.0", "F0.1", "B3.1", "B3.0"}
    assert {e.label for e in events if not e.is_compute} >= {"send_forward_recv_forward"}
    assert max(e.end for e in events) == pytest.approx(times.finish.max())
    busy = [sum(e.end - e.start for e in computes if e.rank == r) for r in range(2)]
    assert busy == pytest.approx(times.busy[:, 0].tolist())


def test_a_timeline_needs_the_events_kept():
    program = compile_schedule(ScheduleShape(2, 1, 2))
    times = simulate(program, stage_durations([1, 3]), stage_durations([2, 1]), np.zeros(2))
    with pytest.raises(ValueError, match="keep_events=True"):
        timeline(program, times)


def test_stage_durations_broadcast_to_the_batch():
    assert stage_durations([1.0, 2.5], batch=3).tolist() == [[1.0] * 3, [2.5] * 3]
