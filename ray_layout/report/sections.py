"""The report's content: its sections in order, as blocks of :mod:`ray_layout.report.document`,
read from one :class:`TuneSummary`.  Nothing here depends on the time or the output folder."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from ray_layout.report.cost_sections import memory_section, unit_costs_section
from ray_layout.report.document import (
    Block,
    Bullets,
    Code,
    CodeBlock,
    Figure,
    Heading,
    Para,
    Parts,
    Strong,
    Table,
    figure_or_note,
)
from ray_layout.report.numbers import (
    show_measured,
    show_ms,
    show_pct,
    show_signed_pct,
    show_times,
    show_value,
)
from ray_layout.report.summary import (
    PICK,
    TuneSummary,
    finite,
    gpu_saving,
    is_measured,
    paste_line,
    pick_arm,
    pick_shape,
    predicted_ms,
    prediction_accuracy,
    speedups,
)

PARALLEL_LABELS = {
    "pp": "PP",
    "vpp": "VPP",
    "tp": "TP",
    "cp": "CP",
    "ep": "EP",
    "etp": "ETP",
    "dp": "DP",
    "micro_batch_size": "micro-batch size",
    "global_batch_size": "global batch size",
    "num_microbatches": "micro-batches",
}


# the megatron-core backend trains megatron-core's own model on CPU ranks
CPU_TIMES = (
    " Its times are CPU times of megatron-core's own model on CPU ranks: they prove the layouts "
    "build and the loop works on real model code, never GPU speed."
)


def _use_this(summary: TuneSummary) -> list[Block]:
    pp, vpp = pick_shape(summary)
    source = summary.pick_source
    shape = f"PP {show_value(pp)}, VPP {show_value(vpp)}"
    blocks: list[Block] = [
        Heading(2, "Use this"),
        Para(
            (
                "Pick ",
                Code(summary.pick),
                f", chosen by {source}. {shape} ",
                "(VPP follows from the layout: its stages per PP rank). Megatron flags:",
            )
        ),
        CodeBlock(paste_line(summary), "bash"),
        *_recompute(summary),
    ]
    arm = pick_arm(summary)
    predicted = predicted_ms(arm, summary, PICK)
    if arm is not None and is_measured(arm):
        text = f"Step time of the pick: measured {show_ms(arm.measured_ms)} ms ("
        if arm.ci_ms is not None:
            text += f"CI {show_ms(arm.ci_ms[0])} to {show_ms(arm.ci_ms[1])} ms, "
        text += f"{arm.iterations:,} steady iterations), predicted {show_ms(predicted)} ms."
    else:
        text = f"Step time of the pick: predicted {show_ms(predicted)} ms (not measured)."
    blocks.append(Para((text,)))
    return blocks


def _recompute(summary: TuneSummary) -> list[Block]:
    """Where the pick recomputes otherwise than the job: what the user changes besides pasting."""
    pick, job = summary.recompute, summary.job_recompute
    if pick == job:
        return []
    runs: Parts = ("runs ", Code(" ".join(pick))) if pick else ("runs without recomputation",)
    today: Parts = (
        ("; take out your job's own recompute flags, ", Code(" ".join(job)), ", first")
        if job
        else ()
    )
    carried = ", which the flags above carry" if pick else ""
    return [Para(("Recomputation: the pick ", *runs, carried, *today, "."))]


def _header(summary: TuneSummary) -> list[Block]:
    parallel = ", ".join(
        f"{PARALLEL_LABELS.get(k, k)} {show_value(v)}" for k, v in summary.parallel.items()
    )
    hbm = f"{summary.hbm_gib:g} GiB" if finite(summary.hbm_gib) else "not given"
    return [
        Heading(1, f"Pipeline layout report: {summary.model}"),
        Para(
            (
                "Model ",
                Code(summary.model),
                " from ",
                Code(summary.config),
                ", study ",
                Code(summary.study),
                ", cost store ",
                Code(summary.store),
                f"; backend {summary.backend} on {summary.hardware}.",
                *((CPU_TIMES,) if summary.backend == "megatron-core" else ()),
            )
        ),
        Para((f"Parallel: {parallel}. HBM per GPU: {hbm}.",)),
    ]


def _results(summary: TuneSummary) -> list[Block]:
    blocks: list[Block] = [Heading(2, "Results")]
    if summary.search is not None:
        facts = dataclasses.asdict(summary.search).items()
        found = ", ".join(f"{k.replace('_', ' ')} {show_value(v)}" for k, v in facts)
        blocks.append(Para((f"Search: {found}.",)))
    if not summary.arms:
        blocks.append(Para(("No layout was taken to the A/B.",)))
        return blocks
    accuracy = prediction_accuracy(summary.arms)
    recomputing = any(arm.recompute for arm in summary.arms)  # a column only where one does
    rows = []
    for arm in summary.arms:
        name: Parts = (arm.arm, " ", Strong("(pick)")) if arm is pick_arm(summary) else (arm.arm,)
        flags = Code(" ".join(arm.recompute)) if arm.recompute else "none"
        rows.append(
            (
                name,
                arm.role,
                Code(arm.layout),
                *((flags,) if recomputing else ()),
                show_ms(arm.predicted_ms),
                show_measured(arm),
                show_signed_pct(accuracy.errors.get(arm.arm)),
                str(arm.status),
                arm.reason,
            )
        )
    blocks.append(
        Table(
            (
                "Arm",
                "Role",
                "Layout",
                *(("Recompute",) if recomputing else ()),
                "Predicted ms",
                "Measured ms ± CI",
                "Error",
                "Status",
                "Reason",
            ),
            tuple(rows),
            (False, False, False, *(False,) * recomputing, True, True, True, False, False),
        )
    )
    blocks.append(Para(("Error is predicted / measured − 1; the ± is half the CI's width.",)))
    return blocks


def _speedups(summary: TuneSummary) -> list[Block]:
    rows = []
    for role, s in speedups(summary).items():
        rows.append(
            (
                str(role),
                Code(s.baseline_layout) if s.baseline_layout else "—",
                show_ms(s.pick_ms),
                show_ms(s.baseline_ms),
                show_times(s.value),
                s.basis or s.note,
            )
        )
    return [
        Heading(2, "Speedups"),
        Table(
            ("Over", "Baseline layout", "Pick ms", "Baseline ms", "Speedup", "Basis"),
            tuple(rows),
            (False, False, True, True, True, False),
        ),
        Para(
            (
                "Measured when the A/B measured both the pick and the baseline, else predicted "
                "by the simulator under the cost model the search used.",
            )
        ),
    ]


def _accuracy(
    summary: TuneSummary, figures: Mapping[str, Figure], skipped: Mapping[str, str]
) -> list[Block]:
    accuracy = prediction_accuracy(summary.arms)
    blocks: list[Block] = [Heading(2, "Prediction accuracy")]
    if not accuracy.measured:
        blocks.append(Para(("No arm was measured, so the predictions are unchecked.",)))
    else:
        rho = (
            f"{accuracy.spearman:.2f}"
            if accuracy.spearman is not None
            else "not computed (fewer than 3 measured arms, or a constant column)"
        )
        blocks.append(
            Bullets(
                (
                    (f"Measured arms: {accuracy.measured}",),
                    (f"Mean absolute error: {show_pct(accuracy.mean_abs_error)}",),
                    (
                        f"Largest absolute error: {show_pct(accuracy.max_abs_error)} "
                        f"({accuracy.worst_arm})",
                    ),
                    (f"Spearman rank correlation of predicted and measured: {rho}",),
                )
            )
        )
    blocks.append(figure_or_note("predicted_vs_measured", figures, skipped))
    return blocks


def _decisions(
    summary: TuneSummary, figures: Mapping[str, Figure], skipped: Mapping[str, str]
) -> list[Block]:
    blocks: list[Block] = [Heading(2, "A/B decisions")]
    if summary.decisions:
        rows = []
        for d in summary.decisions:
            rows.append(
                (
                    show_value(d.look),
                    d.arm,
                    str(d.action),
                    d.reason,
                    f"{d.p_value:.3g}" if finite(d.p_value) else "—",
                    show_value(d.n_steady),
                    show_ms(d.mean_ms),
                )
            )
        blocks.append(
            Table(
                ("Look", "Arm", "Action", "Reason", "p-value", "Steady iterations", "Mean ms"),
                tuple(rows),
                (True, False, False, False, True, True, True),
            )
        )
    else:
        blocks.append(Para(("No A/B decision was recorded.",)))
    blocks.append(figure_or_note("ab_traces", figures, skipped))
    return blocks


def _gpu_time(summary: TuneSummary) -> list[Block]:
    saving = gpu_saving(summary)
    text = f"Spent {summary.gpu_seconds_spent:,.0f} GPU-seconds (profiling and A/B)"
    if saving is None:
        text += "; the cost of running every arm to its end is unknown."
    else:
        text += (
            f"; running every A/B arm to its end would have taken "
            f"{summary.gpu_seconds_full:,.0f}: early stopping saved {show_pct(saving)}."
        )
    blocks: list[Block] = [Heading(2, "GPU time"), Para((text,))]
    if summary.arms:
        rows = tuple(
            (a.arm, str(a.status), f"{a.iterations:,}", f"{a.gpu_seconds:,.0f}")
            for a in summary.arms
        )
        blocks.append(
            Table(
                ("Arm", "Status", "Steady iterations", "GPU-seconds"),
                rows,
                (False, False, True, True),
            )
        )
    return blocks


def _warnings_notes(summary: TuneSummary) -> list[Block]:
    blocks: list[Block] = [Heading(2, "Fit warnings and notes")]
    items = tuple((f"Fit warning: {w}",) for w in summary.fit_warnings) + tuple(
        (n,) for n in summary.notes
    )
    blocks.append(Bullets(items) if items else Para(("None.",)))
    return blocks


def _phases(summary: TuneSummary) -> list[Block]:
    blocks: list[Block] = [Heading(2, "Phase times")]
    if not summary.phase_seconds:
        blocks.append(Para(("No phase times were recorded.",)))
        return blocks
    total = sum(summary.phase_seconds.values())
    rows = [
        (phase, f"{s:,.1f}", show_pct(s / total) if total > 0 else "—")
        for phase, s in summary.phase_seconds.items()
    ]
    rows.append((Strong("total"), f"{total:,.1f}", "100.0%" if total > 0 else "—"))
    blocks.append(Table(("Phase", "Wall seconds", "Share"), tuple(rows), (False, True, True)))
    return blocks


HOW_TO_READ = (
    "Predicted times simulate Megatron's pipeline schedule with the fitted unit costs (mean over "
    "Monte Carlo jitter); measured times are the mean of an arm's steady iterations in the live "
    "A/B, warm-up left out. "
    "The error column is predicted / measured − 1, so a positive error means the simulator was "
    "pessimistic; the Spearman correlation says whether it ranked the layouts in the right order, "
    "which is what choosing needs. "
    "Speedups are measured only when both the pick and the baseline ran to a measured mean in the "
    "A/B; otherwise they are the simulator's. "
    "Arms marked stopped were ended early by the sequential test once they were clearly slower, "
    "which is where the GPU-second saving comes from. "
    "The timelines show where each layout waits: the slowest stage's rank is busy throughout and "
    "every other rank idles in its shadow."
)


def build_document(
    summary: TuneSummary,
    figures: Mapping[str, Figure] | None = None,
    skipped: Mapping[str, str] | None = None,
) -> list[Block]:
    """The report's blocks, in order (figures: those drawn; skipped: why the others were not)."""
    figures, skipped = figures or {}, skipped or {}
    return [
        *_header(summary),
        *_use_this(summary),
        *_results(summary),
        *_speedups(summary),
        Heading(2, "Simulated timelines"),
        figure_or_note("timelines", figures, skipped),
        *_accuracy(summary, figures, skipped),
        *_decisions(summary, figures, skipped),
        *_gpu_time(summary),
        *memory_section(summary, figures, skipped),
        *unit_costs_section(summary),
        *_warnings_notes(summary),
        *_phases(summary),
        Heading(2, "How to read this"),
        Para((HOW_TO_READ,)),
    ]
