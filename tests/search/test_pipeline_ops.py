"""The schedule's vocabulary: the plain 1F1B order with Megatron's p2p calls, and the shapes
megatron-core refuses, each with its reason."""

from __future__ import annotations

import pytest

from search.pipeline_ops import NEEDS_VPP, P2PCall, ScheduleShape, one_f_one_b_ops


def test_one_f_one_b_doc_example():
    """Rank 0, PP=4, M=8: F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7 (megatron.md)."""
    ops = one_f_one_b_ops(ScheduleShape(4, 1, 8), 0)
    labels = [f"{op.kind}{op.microbatch}" for op in ops if not isinstance(op, P2PCall)]
    assert " ".join(labels) == "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7"


def test_p2p_calls_follow_megatron_for_1f1b():
    ops = one_f_one_b_ops(ScheduleShape(3, 1, 4), 1)  # middle rank: warm-up 1, steady 3, cool 1
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
        ScheduleShape(4, 2, 8, 2)
    with pytest.raises(ValueError, match="needs micro-batches"):
        ScheduleShape(4, 2, 3)
    with pytest.raises(ValueError, match="the interleaved schedule needs PP > 1"):
        ScheduleShape(1, 2, 4)


def test_combined_1f1b_on_a_pipeline_needs_virtual_stages():
    with pytest.raises(ValueError) as refused:
        ScheduleShape(4, 1, 8, combined=True)
    assert str(refused.value) == NEEDS_VPP and "virtual_pipeline_model_parallel_size" in NEEDS_VPP
    assert ScheduleShape(1, 1, 8, combined=True).name == "combined-1f1b"  # PP 1: no pipeline


def test_a_shape_is_normalized_and_named_as_the_report_names_it():
    assert ScheduleShape(4, 2, 8).group_size == 4
    assert ScheduleShape(4, 1, 8, p2p_overlap=True) == ScheduleShape(4, 1, 8)  # 1F1B blocks
    assert ScheduleShape(4, 1, 8).name == "1f1b"
    assert ScheduleShape(4, 2, 8).name == "interleaved"
    assert ScheduleShape(4, 2, 8, p2p_overlap=True).name == "interleaved-overlap-p2p"
    assert ScheduleShape(4, 2, 8, p2p_overlap=True, combined=True).name == "combined-1f1b"
