"""The compiled schedule: megatron-core's own order of work, and sizes it refuses or compiles."""

from __future__ import annotations

import pytest

from search.pipeline_ops import ScheduleShape
from search.schedule import compile_schedule, compute_order
from tests.helpers.megatron_oracle import MEGATRON_CPU_WARNINGS
from tests.helpers.megatron_schedule_oracle import megatron_order

pytestmark = [pytest.mark.filterwarnings(w) for w in MEGATRON_CPU_WARNINGS]


CASES = [(pp, 1, m, pp) for pp in (2, 3, 4, 8) for m in (1, 2, 3, 4, 7, 8, 16)] + [
    (pp, vpp, m, group)
    for pp, vpp in ((2, 2), (3, 2), (4, 2), (4, 3), (4, 4), (8, 2), (16, 2))
    for m, group in ((pp, pp), (2 * pp, pp), (3 * pp, pp), (4 * pp, 2 * pp), (2 * pp, 2 * pp),
                     (pp + 1, pp + 1))
]  # fmt: skip


@pytest.mark.parametrize(("pp", "vpp", "microbatches", "group"), CASES)
def test_order_equals_megatron_core(pp, vpp, microbatches, group):
    shape = ScheduleShape(pp, vpp, microbatches, group)
    program = compile_schedule(shape)  # raises if the calls deadlock
    orders = compute_order(shape)
    for rank in range(pp):
        assert orders[rank] == megatron_order(shape, rank)
    assert len(program.order) == len(program.ops)


def test_a_shape_equal_to_another_shares_its_compiled_program():
    """The group defaults to PP, and p2p overlap is dropped where 1F1B always blocks."""
    assert compile_schedule(ScheduleShape(4, 2, 8)) is compile_schedule(ScheduleShape(4, 2, 8, 4))
    blocking = compile_schedule(ScheduleShape(4, 1, 8))
    assert compile_schedule(ScheduleShape(4, 1, 8, p2p_overlap=True)) is blocking


def _megatron_accepts(pp: int, microbatches: int, group: int) -> bool:
    """core_v0.16.1's forward_backward_pipelining_with_interleaving: the group lies in [PP, M]
    and the last group is empty or holds at least PP micro-batches."""
    remainder = microbatches % group
    return pp <= group <= microbatches and not 0 < remainder < pp


@pytest.mark.parametrize("pp", [2, 3, 4])
def test_interleaving_is_refused_exactly_where_megatron_refuses_it_and_compiles_elsewhere(pp):
    for microbatches in range(1, 3 * pp + 3):
        for group in range(1, microbatches + 3):
            if _megatron_accepts(pp, microbatches, group):
                program = compile_schedule(ScheduleShape(pp, 2, microbatches, group))
                assert len(program.order) == len(program.ops)
            else:
                with pytest.raises(ValueError) as refused:
                    ScheduleShape(pp, 2, microbatches, group)
                assert "\n" not in str(refused.value)
