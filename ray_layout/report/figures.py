"""The report's plots, drawn from a :class:`TuneSummary` where the data allows, and why the others
were not: the report says so in their place."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from ray_layout.report import plots
from ray_layout.report.document import Figure
from ray_layout.report.summary import PICK, TuneSummary, finite, is_measured, simulated
from search.simulator import Event

PLOT_NAMES = ("timelines", "memory", "predicted_vs_measured", "ab_traces")
Draw = Callable[[Sequence[Path]], None]


def _timeline_panels(summary: TuneSummary) -> list[tuple[str, Sequence[Event], Sequence[float]]]:
    names = [PICK] + [n for n in summary.timelines if n != PICK]
    panels = []
    for name in names:
        sim = summary.timelines.get(name)
        if sim is None or not sim.events:
            continue
        layout = sim.candidate.layout
        title = f"{name}: {layout}" if layout else name
        if finite(sim.candidate.mean_ms):
            title += f", predicted {sim.candidate.mean_ms:,.0f} ms"
        if finite(sim.bubble_fraction):
            title += f", bubble {sim.bubble_fraction:.1%}"
        panels.append((title, sim.events, sim.tail_ms))
    return panels


def _memory_series(
    summary: TuneSummary,
) -> list[tuple[str, Sequence[float], Sequence[float] | None]]:
    series = []
    for arm in summary.arms:
        if arm.predicted_memory_gib:
            label = f"{arm.arm}: {arm.layout}" + (" (pick)" if arm.layout == summary.pick else "")
            series.append((label, arm.predicted_memory_gib, arm.measured_memory_gib))
    if not series:  # no arms: the pick's simulated memory alone
        candidate = simulated(summary, PICK)
        if candidate is not None and candidate.memory_gib:
            series.append((f"pick: {summary.pick}", candidate.memory_gib, None))
    return series


def _plans(summary: TuneSummary) -> dict[str, tuple[str, Draw] | str]:
    """Each plot's caption and how to draw it, or why there is nothing to draw."""
    measured = [a for a in summary.arms if is_measured(a) and finite(a.predicted_ms)]
    traced = [a for a in summary.arms if a.steps_ms]
    panels = _timeline_panels(summary)
    series = _memory_series(summary)
    return {
        "timelines": (
            "Simulated step of each layout, per PP rank, on one time axis",
            lambda paths: plots.draw_timelines(panels, paths),
        )
        if panels and PICK in summary.timelines
        else "no simulated timeline of the pick was given",
        "memory": (
            "Peak memory per PP rank: predicted bars, measured diamonds, HBM dashed",
            lambda paths: plots.draw_memory(series, summary.hbm_gib, paths),
        )
        if series
        else "no predicted memory per stage was given",
        "predicted_vs_measured": (
            "Predicted against measured mean step time per arm (CI as error bars)",
            lambda paths: plots.draw_predicted_vs_measured(
                [(a.arm, a.predicted_ms, a.measured_ms, a.ci_ms) for a in measured], paths
            ),
        )
        if measured
        else "no arm was measured in an A/B",
        "ab_traces": (
            "A/B step time per iteration (warm-up included); a cross marks an arm ended early",
            lambda paths: plots.draw_step_traces(
                {a.arm: a.steps_ms for a in traced},
                {a.arm: a.status for a in traced if a.status.ended_early},
                paths,
            ),
        )
        if traced
        else "no A/B step times were recorded",
    }


def draw_figures(summary: TuneSummary, folder: Path) -> tuple[dict[str, Figure], dict[str, str]]:
    """Draw every plot the data allows: (name -> Figure, name -> why it was skipped).  A plot
    that fails to draw is skipped with its error, since a report at the end of a long tune must
    still be written."""
    folder.mkdir(parents=True, exist_ok=True)
    plans = _plans(summary)
    figures: dict[str, Figure] = {}
    skipped: dict[str, str] = {}
    for name in PLOT_NAMES:
        paths = (folder / f"{name}.png", folder / f"{name}.svg")
        plan = plans[name]
        if isinstance(plan, tuple):
            caption, draw = plan
            try:
                draw(paths)
            except Exception as exc:  # said in the report, in the plot's place
                skipped[name] = f"could not be drawn ({type(exc).__name__}: {exc})"
            else:
                figures[name] = Figure(name, caption, *paths)
                continue
        else:
            skipped[name] = plan
        for stale in paths:  # an earlier report's picture would contradict this one
            stale.unlink(missing_ok=True)
    return figures, skipped
