"""The interleaved schedule's pieces: megatron-core's own table and warm-up, and one rank's view."""

from __future__ import annotations

import pytest

from search.interleaved import InterleavedRank, schedule_table
from search.pipeline_ops import ScheduleShape
from tests.helpers.megatron_oracle import MEGATRON_CPU_WARNINGS

pytestmark = [pytest.mark.filterwarnings(w) for w in MEGATRON_CPU_WARNINGS]


def test_schedule_table_is_megatron_cores_documented_example():
    """PP 2, N 3, M 5, VP 2 (``forward_backward_pipelining_with_interleaving``'s comment)."""
    assert [mb for mb, _ in schedule_table(5, 2, 3)] == [0, 1, 2, 0, 1, 2, 3, 4, 3, 4]
    assert [chunk for _, chunk in schedule_table(5, 2, 3)] == [0, 0, 0, 1, 1, 1, 0, 0, 1, 1]


@pytest.mark.parametrize(("pp", "vpp", "microbatches", "group"), [(4, 2, 8, 4), (3, 3, 7, 7)])
def test_warmup_is_get_pp_rank_microbatches(pp, vpp, microbatches, group):
    from types import SimpleNamespace

    from megatron.core.pipeline_parallel import schedules

    for rank in range(pp):
        communicator = SimpleNamespace(
            pp_group=SimpleNamespace(size=lambda: pp, rank=lambda r=rank: r),
            virtual_pipeline_model_parallel_size=vpp,
        )
        _, all_warmup, warmup, _ = schedules.get_pp_rank_microbatches(
            microbatches, vpp, group, p2p_communicator=communicator
        )
        at = InterleavedRank(ScheduleShape(pp, vpp, microbatches, group), rank)
        assert at.warmup == (warmup, all_warmup)


def test_the_first_rank_receives_nothing_until_the_ring_has_filled():
    at = InterleavedRank(ScheduleShape(4, 2, 8, 4), rank=0)
    assert [at.receives(k, True) for k in range(6)] == [False, False, False, True, True, True]
    assert at.forward(4)[0].chunk == 1 and at.backward(0)[0].chunk == 1
    assert at.backward(4)[1] is None  # chunk 0's gradient on rank 0 goes nowhere
