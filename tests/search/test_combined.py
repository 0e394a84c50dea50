"""Combined 1F1B (EP all-to-all overlap): megatron-core's own order of every op, the two-stream
model of a merged layer pair, what a merged step hides per layout, and bounds that still hold."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from launchers.emulated.megatron_trace import traced_no_pipelining
from ray_layout.model.job_flags import EpOverlap
from search.combined import (
    LayerTimes,
    merge_savings,
    no_pipelining_ops,
    pair_ms,
    pair_saving,
    rule_violations,
)
from search.pipeline_ops import COMBINED_1F1B, NEEDS_VPP, Compute, P2PCall, ScheduleShape
from search.schedule import compile_schedule, rank_ops
from tests.helpers.megatron_oracle import MEGATRON_CPU_WARNINGS
from tests.helpers.megatron_schedule_oracle import megatron_ops
from tests.helpers.planner_fixtures import check_exact_top_two, combined_toy_case
from tests.search.test_overlap import interleaved_sizes

pytestmark = [pytest.mark.filterwarnings(w) for w in MEGATRON_CPU_WARNINGS]


@settings(max_examples=40, deadline=None)
@given(interleaved_sizes(), st.booleans())
def test_every_rank_runs_as_megatron_cores_combined_schedule(sizes, p2p_overlap):
    """megatron-core's interleaved schedule with overlap_moe_expert_parallel_comm, its own
    combined_1f1b helper and hooks run; only the chunk's schedule plan is a stub."""
    shape = ScheduleShape(*sizes, p2p_overlap=p2p_overlap, combined=True)
    for rank in range(shape.pp):
        expected = [
            op
            for op in megatron_ops(shape, rank)
            if not (isinstance(op, P2PCall) and not op.transfers)
        ]
        assert rank_ops(shape)[rank] == expected


@pytest.mark.parametrize("microbatches", [1, 2, 5])
def test_pp_1_merges_the_next_forward_with_the_backward(microbatches):
    assert no_pipelining_ops(microbatches) == traced_no_pipelining(microbatches)
    assert rank_ops(ScheduleShape(1, 1, microbatches, combined=True)) == [
        no_pipelining_ops(microbatches)
    ]


def test_the_warm_up_runs_one_more_forward_and_steady_backwards_merge():
    plain = compile_schedule(ScheduleShape(4, 2, 8, 4, True))
    combined = compile_schedule(ScheduleShape(4, 2, 8, 4, True, combined=True))
    assert combined.shape.name == COMBINED_1F1B and plain.shape.name != COMBINED_1F1B
    for rank in range(4):

        def computes(program, rank=rank):
            ops = [program.ops[i] for i in np.flatnonzero(program.rank == rank)]
            return [op for op in ops if isinstance(op, Compute)]

        def warmup(ops):  # forwards before the first steady step's (F, B)
            return next(i for i, op in enumerate(ops) if op.kind == "B") - 1

        assert warmup(computes(combined)) == warmup(computes(plain)) + 1
        merged = [op for op in computes(combined) if op.merged]
        assert len(merged) == 16 - warmup(computes(combined))


def test_megatron_cores_rules_are_named():
    on = EpOverlap(on=True, delay_wgrad=True)
    rules = dict(pp=4, vpp=2, ep=8, mtp_num_layers=1, recompute_granularity=None)
    assert rule_violations(on, **rules) == []
    assert rule_violations(on, **{**rules, "vpp": 1}) == [NEEDS_VPP]
    assert "EP > 1" in rule_violations(on, **{**rules, "ep": 1})[0]
    assert "at most 1 MTP" in rule_violations(on, **{**rules, "mtp_num_layers": 2})[0]
    assert (
        "full recomputation" in rule_violations(on, **{**rules, "recompute_granularity": "full"})[0]
    )
    delay_only = EpOverlap(delay_wgrad=True)
    assert "needs --overlap-moe-expert-parallel-comm" in rule_violations(delay_only, **rules)[0]


layer_times = st.builds(
    LayerTimes.of,
    st.floats(0.5, 20),
    st.floats(1, 40),
    st.sampled_from((0.0, 0.2, 1.0, 3.0)),
    st.floats(0.05, 0.8),
)


@settings(max_examples=200, deadline=None)
@given(layer_times, layer_times, st.booleans())
def test_a_merged_pair_lies_between_its_compute_and_running_alone(forward, backward, delay):
    """The compute stream is serial; the all-to-alls can only hide, never add; delaying the
    weight gradient never slows the pair."""
    compute = (
        forward.attention_forward
        + forward.mlp_forward
        + backward.attention_backward
        + backward.mlp_backward
    )
    merged = pair_ms(forward, backward, delay)
    assert compute - 1e-9 <= merged <= forward.alone_forward + backward.alone_backward + 1e-9
    assert pair_ms(forward, backward, True) <= pair_ms(forward, backward, False) + 1e-9
    hideable = 2 * (forward.a2a + backward.a2a)
    assert -1e-9 <= pair_saving(forward, backward, delay) <= hideable + 1e-9


def test_all_to_alls_hide_entirely_under_enough_compute_and_not_without_a2a():
    moe = LayerTimes.of(forward=10.0, backward=20.0, a2a=1.0, attention=0.4)
    assert pair_saving(moe, moe, delay_wgrad=True) == pytest.approx(4.0)
    dense = LayerTimes.of(forward=8.0, backward=16.0, a2a=0.0, attention=0.4)
    assert pair_saving(dense, dense, delay_wgrad=False) == 0.0
    assert pair_saving(dense, moe, delay_wgrad=True) == pytest.approx(2.0)  # moe's backward a2a
    # an all-to-all longer than the compute beside it shows through
    slow = LayerTimes.of(forward=10.0, backward=20.0, a2a=5.0, attention=0.4)
    assert 0 < pair_saving(slow, slow, delay_wgrad=True) < 20.0


@settings(max_examples=100, deadline=None)
@given(
    st.integers(0, 3), st.integers(0, 4), st.integers(0, 3), st.integers(0, 4),
    st.floats(0, 3), st.floats(0, 3), st.floats(0, 3),
)  # fmt: skip
def test_hidden_time_counts_the_pairs_layer_by_layer(d_f, m_f, d_b, m_b, mm, dm, md):
    """Forward layer i meets backward layer n_b - 1 - i; dense layers come first in a chunk."""
    units = ("E", "t_dense", "t_moe", "m", "L")
    savings = merge_savings(
        units, np.ones(5), np.ones(5), {"t_dense": 0.4, "t_moe": 0.3}, 0.0, ["t_moe"], False
    )
    savings = type(savings)(mm, dm, md, savings.dense_unit, savings.moe_unit, 0.0)
    counts = np.zeros((1, 2, 5))
    counts[0, 0, 1:3] = d_f, m_f  # PP 1, VPP 2 keeps two stages on one rank
    counts[0, 1, 1:3] = d_b, m_b
    forward = [False] * d_f + [True] * m_f
    backward = ([False] * d_b + [True] * m_b)[::-1]
    value = {(True, True): mm, (False, True): dm, (True, False): md, (False, False): 0.0}
    expected = sum(value[pair] for pair in zip(forward, backward, strict=False))
    hidden = savings.hidden_ms(counts, pp=1, vpp=2)
    assert hidden[1, 0] == pytest.approx(expected)  # (rank 0, forward chunk 0, backward 1)


@settings(max_examples=25, deadline=None)
@given(
    layers=st.integers(3, 9),
    pp=st.integers(2, 3),
    microbatches=st.integers(1, 3),
    unit=st.tuples(*(st.integers(0, 4) for _ in range(4))),
    a2a=st.sampled_from((0.0, 0.5, 2.0)),
    p2p_overlap=st.booleans(),
    mtp=st.integers(0, 1),
)
def test_exact_search_finds_the_combined_optimum_with_a_bound_that_holds(
    layers, pp, microbatches, unit, a2a, p2p_overlap, mtp
):
    """Bounds built on compute alone hold under merged steps, so the exact search's best
    equals the plain simulator's enumeration."""
    case = combined_toy_case(layers, mtp, pp, 2, microbatches * pp, unit, a2a, p2p_overlap)
    if case is not None:
        assert check_exact_top_two(case).complete
