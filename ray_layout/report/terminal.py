"""The tune's last words on the terminal: the pick, the flags to paste (and its recomputation
where it is not the job's), its step time, the speedups, the GPU time early stopping saved, and
where the report is."""

from __future__ import annotations

from rich.console import Console
from rich.text import Text

from ray_layout.report.numbers import show_ms, show_pct, show_times
from ray_layout.report.summary import (
    PICK,
    TuneSummary,
    gpu_saving,
    is_measured,
    paste_line,
    pick_arm,
    predicted_ms,
    speedups,
)
from ray_layout.report.write import ReportFiles


def print_summary(summary: TuneSummary, console: Console, files: ReportFiles | None = None) -> None:
    """A few lines, the flags on one unbroken line so that they paste whole."""

    def say(*parts: str | tuple[str, str], soft_wrap: bool = False) -> None:
        console.print(Text.assemble(*parts), highlight=False, soft_wrap=soft_wrap)

    say(("Pick ", "bold"), (summary.pick, "bold cyan"), f", from {summary.pick_source}")
    say("Paste: ", (paste_line(summary), "bold"), soft_wrap=True)
    if summary.recompute != summary.job_recompute:
        job = " ".join(summary.job_recompute) or "none"
        say("Recompute: ", (" ".join(summary.recompute) or "none", "bold"), f" (your job: {job})")
    arm = pick_arm(summary)
    predicted = predicted_ms(arm, summary, PICK)
    if arm is not None and is_measured(arm):
        step = f"Step: measured {show_ms(arm.measured_ms)} ms, predicted {show_ms(predicted)} ms"
    else:
        step = f"Step: predicted {show_ms(predicted)} ms (not measured)"
    say(step)
    found = speedups(summary)
    say(
        "Speedup: "
        + ", ".join(
            f"{show_times(s.value)} over {role}" + (f" ({s.basis})" if s.basis else f" ({s.note})")
            for role, s in found.items()
        )
    )
    saving = gpu_saving(summary)
    gpu = f"GPU-seconds: {summary.gpu_seconds_spent:,.0f} spent"
    if saving is not None:
        gpu += (
            f" of {summary.gpu_seconds_full:,.0f} without early stopping ({show_pct(saving)} saved)"
        )
    say(gpu)
    if summary.fit_warnings:
        say((f"{len(summary.fit_warnings)} fit warning(s): see the report", "yellow"))
    if files is not None:
        say("Report: ", str(files.markdown), " and ", str(files.html), soft_wrap=True)
