"""megatron-core's interleaved schedule traced with stub communicators: without overlap it is the
emulator's own blocking order, with overlap every wait follows its post, and the schedule module
is left as it was."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from launchers.emulated.megatron_trace import traced_program
from launchers.emulated.rank_order import rank_program
from search.schedule import P2PCall, Wait
from tests.helpers.megatron_oracle import MEGATRON_CPU_WARNINGS

pytestmark = [pytest.mark.filterwarnings(w) for w in MEGATRON_CPU_WARNINGS]


@st.composite
def sizes(draw):
    pp = draw(st.integers(2, 4))
    vpp = draw(st.integers(2, 3))
    group = draw(st.integers(pp, 2 * pp))
    microbatches = draw(st.sampled_from((group, 2 * group, group + pp)))
    return pp, vpp, microbatches, group


@settings(max_examples=25, deadline=None)
@given(sizes())
def test_the_blocking_trace_is_the_emulators_hand_written_order(sizes):
    pp, vpp, microbatches, group = sizes
    for rank in range(pp):
        traced = traced_program(pp, rank, vpp, microbatches, group, overlap_p2p=False)
        assert traced == rank_program(pp, rank, vpp, microbatches, group)


@settings(max_examples=25, deadline=None)
@given(sizes())
def test_every_wait_follows_the_post_it_names_and_no_receive_is_left(sizes):
    pp, vpp, microbatches, group = sizes
    for rank in range(pp):
        posted: dict[str, int] = {}
        pending: set[tuple[str, int]] = set()
        for op in traced_program(pp, rank, vpp, microbatches, group, overlap_p2p=True):
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
    traced_program(2, 1, 2, 4, 2, overlap_p2p=True)
    assert (schedules.forward_step, schedules.backward_step, schedules.torch) == before
