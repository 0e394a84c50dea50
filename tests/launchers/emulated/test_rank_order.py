"""One emulated rank's order of work: megatron-core's computations, the simulator's data-moving
p2p calls, the pipeline's ends skipped, and the activations it holds at its peak."""

from __future__ import annotations

import pytest

from launchers.emulated.rank_order import held_at_peak, pipeline_programs, rank_program
from search.cost_model import in_flight_at_peak
from search.pipeline_ops import BACKWARD, FORWARD, Compute, P2PCall, ScheduleShape, Transfer
from search.schedule import rank_ops
from tests.helpers.megatron_oracle import MEGATRON_CPU_WARNINGS
from tests.helpers.megatron_schedule_oracle import megatron_order

pytestmark = [pytest.mark.filterwarnings(w) for w in MEGATRON_CPU_WARNINGS]


ORDER_CASES = [
    (1, 1, 3, 1),
    (2, 1, 1, 2),
    (2, 1, 4, 2),
    (4, 1, 3, 4),
    (4, 1, 8, 4),
    (2, 2, 4, 2),
    (4, 2, 8, 4),
    (4, 2, 10, 5),
    (3, 3, 6, 3),
    (4, 2, 16, 8),
]


@pytest.mark.parametrize(("pp", "vpp", "microbatches", "group"), ORDER_CASES)
def test_order_equals_megatron_core(pp, vpp, microbatches, group):
    """Computations in megatron-core's order; the calls that move data equal the simulator's,
    an implementation of its own (the emulator also keeps the interleaved calls that move
    nothing, because Megatron still runs their timers)."""
    shape = ScheduleShape(pp, vpp, microbatches, group)
    simulated = rank_ops(shape)
    for rank in range(pp):
        program = rank_program(shape, rank)
        computes = [op for op in program if not isinstance(op, P2PCall)]
        assert computes == megatron_order(shape, rank)
        moving = [op for op in program if not isinstance(op, P2PCall) or op.transfers]
        assert moving == simulated[rank]


@pytest.mark.parametrize(("pp", "vpp", "microbatches", "group"), ORDER_CASES)
def test_activations_held_at_the_peak_agree_with_the_planner(pp, vpp, microbatches, group):
    """The emulator counts in-flight micro-batches on its own order; the planner's count, on the
    simulator's order, must come out the same."""
    shape = ScheduleShape(pp, vpp, microbatches, group)
    planned = in_flight_at_peak(shape)
    for rank in range(pp):
        held = held_at_peak(rank_program(shape, rank), vpp)
        assert list(held.values()) == planned[rank].tolist()


def test_the_pipelines_ends_make_no_calls_toward_the_outside():
    """1F1B on PP 3: rank 0 never receives a forward nor sends a gradient back, the last rank
    never sends a forward on nor waits for a gradient; the middle rank does all four."""

    def transfers(rank: int) -> set[str]:
        program = rank_program(ScheduleShape(3, 1, 6, 3), rank)
        return {t for op in program if isinstance(op, P2PCall) for t in op.transfers}

    assert transfers(0) == {Transfer.SEND_NEXT, Transfer.RECV_NEXT}
    assert transfers(2) == {Transfer.RECV_PREV, Transfer.SEND_PREV}
    assert transfers(1) == {
        Transfer.SEND_NEXT,
        Transfer.RECV_NEXT,
        Transfer.RECV_PREV,
        Transfer.SEND_PREV,
    }


def test_every_ranks_program_is_computed_in_rank_order():
    shape = ScheduleShape(4, 2, 8, 4)
    assert pipeline_programs(shape) == tuple(rank_program(shape, r) for r in range(4))


def test_held_at_peak_is_the_first_moment_the_rank_holds_the_most():
    """Forwards add a micro-batch to their chunk, backwards take one away; the peak kept is the
    first one reached (chunk 0 holds 2, chunk 1 holds 1), not a later tie."""
    f = [Compute(FORWARD, mb, chunk) for mb, chunk in ((0, 0), (1, 0), (0, 1))]
    b = [Compute(BACKWARD, mb, chunk) for mb, chunk in ((0, 1), (0, 0))]
    later = [Compute(FORWARD, 2, 1), Compute(FORWARD, 3, 1)]
    program = [*f, P2PCall("send_forward_recv_forward", ()), *b, *later]
    assert held_at_peak(program, 2) == {0: 2, 1: 1}
    assert held_at_peak([], 3) == {0: 0, 1: 0, 2: 0}
