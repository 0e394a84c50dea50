"""The compiled schedule: megatron-core's own order of work, its p2p calls, refused sizes."""

from __future__ import annotations

import pytest

from search.schedule import (
    P2PCall,
    compile_schedule,
    compute_order,
    rank_ops,
)
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


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="micro-batch group"):
        compile_schedule(4, 2, 8, 2)
    with pytest.raises(ValueError, match="needs micro-batches"):
        compile_schedule(4, 2, 3)


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
                program = compile_schedule(pp, 2, microbatches, group)
                assert len(program.order) == len(program.ops)
            else:
                with pytest.raises(ValueError) as refused:
                    compile_schedule(pp, 2, microbatches, group)
                assert "\n" not in str(refused.value)
