"""megatron-core's interleaved schedule traced with stub communicators: without overlap it is the
emulator's own blocking order, with overlap every wait follows its post, and the schedule module
is left as it was."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from launchers.emulated.megatron_trace import traced_program
from launchers.emulated.rank_order import rank_program
from search.pipeline_ops import P2PCall, ScheduleShape, Wait
from tests.helpers.megatron_oracle import MEGATRON_CPU_WARNINGS

pytestmark = [pytest.mark.filterwarnings(w) for w in MEGATRON_CPU_WARNINGS]


@st.composite
def shapes(draw):
    pp = draw(st.integers(2, 4))
    vpp = draw(st.integers(2, 3))
    group = draw(st.integers(pp, 2 * pp))
    microbatches = draw(st.sampled_from((group, 2 * group, group + pp)))
    return ScheduleShape(pp, vpp, microbatches, group)


@settings(max_examples=25, deadline=None)
@given(shapes())
def test_the_blocking_trace_is_the_emulators_hand_written_order(shape):
    for rank in range(shape.pp):
        assert traced_program(shape, rank) == rank_program(shape, rank)


@settings(max_examples=25, deadline=None)
@given(shapes())
def test_every_wait_follows_the_post_it_names_and_no_receive_is_left(shape):
    for rank in range(shape.pp):
        posted: dict[str, int] = {}
        pending: set[tuple[str, int]] = set()
        for op in traced_program(replace(shape, p2p_overlap=True), rank):
            if isinstance(op, P2PCall) and not op.blocking:
                for transfer in op.transfers:
                    pending.add((transfer, posted.get(transfer, 0)))
                    posted[transfer] = posted.get(transfer, 0) + 1
            elif isinstance(op, Wait):
                pending.remove((op.transfer, op.post))
        assert not {t for t, _ in pending} & {"recv_prev", "recv_next"}


def test_the_schedule_module_is_restored():
    from megatron.core.pipeline_parallel import schedules

    before = (schedules.forward_step, schedules.backward_step, schedules.torch)
    traced_program(ScheduleShape(2, 2, 4, 2, p2p_overlap=True), 1)
    assert (schedules.forward_step, schedules.backward_step, schedules.torch) == before
