"""The report's sections on what the model costs: the pick's memory per stage (predicted against
measured) and the fitted unit costs."""

from __future__ import annotations

from collections.abc import Mapping

from ray_layout.model.layout import format_stages
from ray_layout.report.document import Block, Code, Figure, Heading, Para, Table, figure_or_note
from ray_layout.report.numbers import show_gib
from ray_layout.report.summary import PICK, TuneSummary, finite, pick_arm, pick_layout, simulated

UNIT_NAMES = {"E": "embedding", "t": "decoder layer", "m": "MTP layer", "L": "output layer + loss"}


def memory_section(
    summary: TuneSummary, figures: Mapping[str, Figure], skipped: Mapping[str, str]
) -> list[Block]:
    blocks: list[Block] = [Heading(2, "Memory of the pick")]
    arm = pick_arm(summary)
    predicted = arm.predicted_memory_gib if arm is not None else ()
    if not predicted:
        candidate = simulated(summary, PICK)
        predicted = candidate.memory_gib if candidate is not None else ()
    measured = (arm.measured_memory_gib if arm is not None else None) or ()
    layout = pick_layout(summary)
    hbm = summary.hbm_gib if finite(summary.hbm_gib) else None
    # Megatron's "max allocated" is PyTorch's allocator alone: the prediction less the CUDA
    # context, NCCL and allocator slack (memory_overhead_gib) is what it measures
    costs = summary.unit_costs
    overhead = costs.memory_overhead_gib if costs is not None else None
    if predicted:
        rows = []
        for rank, gib in enumerate(predicted):
            seen = measured[rank] if rank < len(measured) else None
            units = (
                ", ".join(format_stages((s,)) or "none" for s in layout.rank_chunks(rank))
                if layout and rank < layout.pp
                else "—"
            )
            peak = max(gib, seen) if finite(seen) else gib
            allocated = gib - overhead if overhead is not None else None
            error = allocated / seen - 1 if finite(allocated) and finite(seen) and seen else None
            rows.append(
                (
                    str(rank),
                    Code(units),
                    show_gib(gib),
                    show_gib(allocated),
                    show_gib(seen),
                    f"{error:+.1%}" if error is not None else "—",
                    show_gib(hbm),
                    show_gib(hbm - peak) if hbm is not None else "—",
                )
            )
        blocks.append(
            Table(
                (
                    "PP rank",
                    "Units",
                    "Predicted GiB",
                    "Predicted allocated GiB",
                    "Measured max allocated GiB",
                    "Error",
                    "HBM GiB",
                    "Headroom GiB",
                ),
                tuple(rows),
                (True, False, True, True, True, True, True, True),
            )
        )
        blocks.append(
            Para(
                (
                    "Predicted allocated is the prediction less the fixed per-GPU overhead "
                    "(CUDA context, NCCL, allocator slack), which Megatron's max allocated does "
                    "not count; the error compares the two. Headroom is HBM less the larger of "
                    "predicted and measured.",
                )
            )
        )
    else:
        blocks.append(Para(("No memory per stage was given for the pick.",)))
    blocks.append(figure_or_note("memory", figures, skipped))
    return blocks


def unit_costs_section(summary: TuneSummary) -> list[Block]:
    costs = summary.unit_costs
    blocks: list[Block] = [Heading(2, "Unit costs")]
    if costs is None or not costs.forward_ms:
        blocks.append(Para(("No unit costs were given.",)))
        return blocks
    rows = []
    for unit, f in costs.forward_ms.items():
        b = costs.backward_ms.get(unit)
        rows.append(
            (
                Code(unit),
                UNIT_NAMES.get(unit, ""),
                f"{f:,.2f}",
                f"{b:,.2f}" if finite(b) else "—",
                f"{f + b:,.2f}" if finite(b) else "—",
                f"{costs.jitter_cv[unit]:.3f}" if unit in costs.jitter_cv else "0",
            )
        )
    blocks.append(
        Table(
            ("Unit", "What", "Forward ms", "Backward ms", "Forward + backward ms", "Jitter CV"),
            tuple(rows),
            (False, False, True, True, True, True),
        )
    )
    extra = []
    intra, inter = costs.p2p_intra_node_ms, costs.p2p_inter_node_ms
    if finite(intra) and finite(inter):
        extra.append(f"p2p per transfer {intra:g} ms within a node, {inter:g} ms across nodes")
    sync, opt = costs.grad_sync_ms_per_gparam, costs.optimizer_ms_per_gparam
    if finite(sync) and finite(opt):
        extra.append(
            f"step tail per billion parameters on a GPU: gradient sync {sync:g} ms + "
            f"optimizer {opt:g} ms"
        )
    if costs.source:
        extra.append(f"source {costs.source}")
    scope = " per micro-batch"
    if costs.micro_batch_size and costs.seq_length:
        scope += f" of {costs.micro_batch_size} × {costs.seq_length} tokens"
    blocks.append(Para((f"Times{scope}. " + ("; ".join(extra) + "." if extra else ""),)))
    return blocks
