"""megatron-core's combined 1F1B (``--overlap-moe-expert-parallel-comm``): what merges, and what
the merge hides.

The schedule (``combined_1f1b.py`` in megatron-core 0.16.1): each steady step of the interleaved
schedule runs its forward and its backward as one step (``combined_forward_backward_step``),
after one extra warm-up forward so the two are independent; with ``overlap_p2p_comm`` the step
first waits for both of its inputs and posts both sends after both computations
(``search.overlap``).  PP 1 merges micro-batch i + 1's forward with i's backward
(``combined_1f1b_schedule_for_no_pipelining``).

The cost (``TransformerLayerSchedulePlan.run``): within a merged step, forward layer i runs with
backward layer n - 1 - i on two streams,

    comm:    combine_bwd | dispatch_fwd -> dispatch_bwd | combine_fwd
    compute: attn_fwd    | mlp_bwd -> mlp_bwd_dw -> mlp_fwd | attn_bwd

so each layer's dispatch and combine all-to-alls hide under the other layer's compute.  The
model here assumes:

* a MoE layer's forward (and its backward) is its compute plus two all-to-alls of ``a2a_ms``
  each (dispatch and combine, the same tokens both ways), exposed when it runs alone;
* compute splits into attention and MLP by their FLOPs, and an MLP backward into equal data and
  weight gradients (``--delay-wgrad-compute`` moves the weight gradient after the backward
  dispatch, so that it hides it);
* each layer pair starts when the previous pair has finished on both streams (a small
  overstatement: Megatron lets the comm stream run ahead into the next pair);
* embedding, output layer and MTP run unmerged, with their all-to-alls exposed, and layers
  beyond the shorter of the two chunks run alone;
* within a chunk dense layers come first (DeepSeek-style ``first_k_dense``); other patterns
  are counted as if they did.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ray_layout.model.job_flags import EpOverlap
from search.pipeline_ops import BACKWARD, FORWARD, NEEDS_VPP, Compute, Op


def rule_violations(
    ep_overlap: EpOverlap,
    *,
    pp: int,
    vpp: int,
    ep: int,
    mtp_num_layers: int,
    recompute_granularity: str | None,
) -> list[str]:
    """What megatron-core refuses about this job's EP overlap, each with the rule's reason
    (transformer_config.py and arguments.py, 0.16.1)."""
    if not ep_overlap.on:
        return (
            ["--delay-wgrad-compute needs --overlap-moe-expert-parallel-comm (megatron-core)"]
            if ep_overlap.delay_wgrad
            else []
        )
    found = []
    if pp > 1 and vpp < 2:
        found.append(NEEDS_VPP)
    if ep < 2:
        found.append(
            "--overlap-moe-expert-parallel-comm is only supported with expert model parallelism "
            f"(EP > 1; the job has EP {ep})"
        )
    if mtp_num_layers > 1:
        found.append(
            f"--overlap-moe-expert-parallel-comm supports at most 1 MTP layer "
            f"(the job has {mtp_num_layers})"
        )
    if mtp_num_layers == 1 and pp < 2:
        found.append("--overlap-moe-expert-parallel-comm with an MTP layer needs PP > 1")
    if recompute_granularity == "full":
        found.append("--overlap-moe-expert-parallel-comm does not run with full recomputation")
    return found


def no_pipelining_ops(num_microbatches: int) -> list[Op]:
    """PP 1: the first forward alone, then forward i + 1 merged with backward i, then the last
    backward alone."""
    ops: list[Op] = [Compute(FORWARD, 0, 0)]
    for i in range(num_microbatches - 1):
        ops += [Compute(FORWARD, i + 1, 0), Compute(BACKWARD, i, 0, merged=True)]
    return [*ops, Compute(BACKWARD, num_microbatches - 1, 0)]


@dataclass(frozen=True)
class LayerTimes:
    """One layer's parts on the two streams, in ms per micro-batch."""

    attention_forward: float
    mlp_forward: float
    attention_backward: float
    mlp_backward: float  # data and weight gradients together
    a2a: float  # one dispatch or combine; 0 for a dense layer

    @classmethod
    def of(cls, forward: float, backward: float, a2a: float, attention: float) -> LayerTimes:
        """From a layer's forward and backward (all-to-alls included) and attention's share of
        its compute."""
        compute_f, compute_b = max(forward - 2 * a2a, 0.0), max(backward - 2 * a2a, 0.0)
        return cls(
            attention * compute_f, (1 - attention) * compute_f,
            attention * compute_b, (1 - attention) * compute_b,
            a2a,
        )  # fmt: skip

    @property
    def alone_forward(self) -> float:
        return self.attention_forward + self.mlp_forward + 2 * self.a2a

    @property
    def alone_backward(self) -> float:
        return self.attention_backward + self.mlp_backward + 2 * self.a2a


def pair_ms(forward: LayerTimes, backward: LayerTimes, delay_wgrad: bool) -> float:
    """Forward layer and backward layer merged on two streams, in the schedule plan's order."""
    data, weight = backward.mlp_backward / 2, backward.mlp_backward / 2
    if not delay_wgrad:  # the weight gradient runs inside mlp_bwd, before dispatch_bwd starts
        data, weight = data + weight, 0.0
    combine_b = backward.a2a
    attention_f = forward.attention_forward
    mlp_b = max(attention_f, combine_b) + data
    dispatch_f = max(combine_b, attention_f) + forward.a2a
    weight_b = mlp_b + weight
    dispatch_b = max(dispatch_f, mlp_b) + backward.a2a
    mlp_f = max(weight_b, dispatch_f) + forward.mlp_forward
    combine_f = max(dispatch_b, mlp_f) + forward.a2a
    attention_b = max(mlp_f, dispatch_b) + backward.attention_backward
    return max(combine_f, attention_b)


def pair_saving(forward: LayerTimes, backward: LayerTimes, delay_wgrad: bool) -> float:
    """What merging the two layers saves over running them one after the other."""
    alone = forward.alone_forward + backward.alone_backward
    return alone - pair_ms(forward, backward, delay_wgrad)


@dataclass(frozen=True)
class MergeSavings:
    """Per merged layer pair, by kind (forward layer, backward layer), what the merge saves; and
    which of the cost model's units are dense and MoE decoder layers (-1: none)."""

    moe_moe: float
    dense_moe: float
    moe_dense: float
    dense_unit: int
    moe_unit: int
    a2a_ms: float  # one dispatch or combine of a MoE layer

    def hidden_ms(self, counts: np.ndarray, pp: int, vpp: int) -> np.ndarray:
        """(PP x VPP x VPP, n): for each rank and (forward chunk, backward chunk), the time a
        merged step saves; ``counts`` (n, stages, units) as ``search.evaluate`` scores them.
        Forward layer i meets backward layer n_b - 1 - i: forward runs dense layers first,
        backward MoE layers first."""
        n = counts.shape[0]

        def layers(index: int) -> np.ndarray:
            return counts[..., index] if index >= 0 else np.zeros(counts.shape[:2])

        dense, moe = layers(self.dense_unit), layers(self.moe_unit)
        rank, f_chunk, b_chunk = np.meshgrid(
            np.arange(pp), np.arange(vpp), np.arange(vpp), indexing="ij"
        )
        f_stage = (f_chunk * pp + rank).ravel()
        b_stage = (b_chunk * pp + rank).ravel()
        d_f, m_f = dense[:, f_stage], moe[:, f_stage]
        d_b, m_b = dense[:, b_stage], moe[:, b_stage]
        n_f, n_b = d_f + m_f, d_b + m_b
        moe_moe = np.maximum(np.minimum(n_f, m_b) - d_f, 0)
        dense_moe = np.minimum(d_f, m_b)
        moe_dense = np.maximum(np.minimum(n_f, n_b) - np.maximum(d_f, m_b), 0)
        saved = moe_moe * self.moe_moe + dense_moe * self.dense_moe + moe_dense * self.moe_dense
        return saved.T.reshape(pp * vpp * vpp, n)


def merge_savings(
    units: Sequence[str],
    forward_ms: np.ndarray,
    backward_ms: np.ndarray,
    attention_share: dict[str, float],
    a2a_ms: float,
    moe_units: Sequence[str],
    delay_wgrad: bool,
) -> MergeSavings:
    """The pair savings of a cost model's decoder layers (``attention_share`` and
    ``moe_units`` name them; MoE layers carry the all-to-alls)."""
    times = {}
    for unit, share in attention_share.items():
        i = units.index(unit)
        a2a = a2a_ms if unit in moe_units else 0.0
        times[unit in moe_units] = LayerTimes.of(forward_ms[i], backward_ms[i], a2a, share)
    moe, dense = times.get(True), times.get(False)
    return MergeSavings(
        moe_moe=pair_saving(moe, moe, delay_wgrad) if moe else 0.0,
        dense_moe=pair_saving(dense, moe, delay_wgrad) if moe and dense else 0.0,
        moe_dense=pair_saving(moe, dense, delay_wgrad) if moe and dense else 0.0,
        dense_unit=next((units.index(u) for u in attention_share if u not in moe_units), -1),
        moe_unit=next((units.index(u) for u in attention_share if u in moe_units), -1),
        a2a_ms=a2a_ms,
    )
