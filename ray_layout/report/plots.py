"""Pictures of simulated and measured pipeline steps: timelines (Gantt charts), memory per stage,
predicted against measured step time, and A/B step-time traces.

Every function takes plain data, draws with Matplotlib's Agg backend, closes its figure, and saves
by each path's suffix (PNG, SVG or PDF); SVG and PDF carry no date and SVG ids a fixed salt, so
the same data gives the same file.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ray_layout.errors import ConfigError
from search.simulator import Event

if TYPE_CHECKING:  # matplotlib is imported when a plot is drawn, not with the report
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

COLORS = {"F": "#4C78A8", "B": "#F58518", "p2p": "#BAB0AC", "tail": "#54A24B"}
HBM_COLOR = "#D62728"
SVG_SALT = "ray_layout"


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Figure, paths: Sequence[str | Path], dpi: int = 130) -> None:
    """Save ``fig`` once per path (format by suffix), reproducibly: no date, fixed SVG ids."""
    import matplotlib

    with matplotlib.rc_context({"svg.hashsalt": SVG_SALT}):
        for path in paths:
            suffix = Path(path).suffix.lower()
            metadata = {"Date": None} if suffix == ".svg" else None
            if suffix == ".pdf":
                metadata = {"CreationDate": None}
            try:
                fig.savefig(path, dpi=dpi, metadata=metadata)
            except OSError as exc:  # a full disk, a path the pre-check could not see through
                Path(path).unlink(missing_ok=True)  # nothing half-written is left behind
                raise ConfigError(f"{path}: cannot write ({exc.strerror or exc})") from None


@contextmanager
def _figure(paths: Sequence[str | Path], **subplots: Any) -> Iterator[tuple[Figure, Any]]:
    """A new figure and its axes; laid out and saved to ``paths`` when the block ends, and
    closed whatever happens."""
    plt = _pyplot()
    fig, axes = plt.subplots(**subplots)
    try:
        yield fig, axes
        fig.tight_layout()
        _save(fig, paths)
    finally:
        plt.close(fig)


def _timeline_on(
    ax: Axes,
    events: Sequence[Event],
    tail_ms: Sequence[float],
    title: str,
    legend: bool = True,
) -> None:
    """One Gantt chart on ``ax``: a row per PP rank, bars grouped per (rank, colour)."""
    plt = _pyplot()
    ranks = 1 + max(e.rank for e in events)
    finish = [max(e.end for e in events if e.rank == r) for r in range(ranks)]
    bars: dict[tuple[int, str], list[tuple[float, float]]] = {}
    for event in events:
        if event.end <= event.start:
            continue
        color = COLORS[event.label[0]] if event.is_compute else COLORS["p2p"]
        bars.setdefault((event.rank, color), []).append((event.start, event.end - event.start))
    for (rank, color), spans in bars.items():
        ax.broken_barh(spans, (rank - 0.4, 0.8), facecolors=color, edgecolor="white", linewidth=0.3)
    for rank, (end, tail) in enumerate(zip(finish, tail_ms, strict=True)):
        if tail > 0:
            ax.broken_barh([(end, tail)], (rank - 0.4, 0.8), facecolors=COLORS["tail"])
    ax.set_yticks(range(ranks), [f"PP rank {r}" for r in range(ranks)])
    ax.invert_yaxis()
    ax.set_title(title)
    if legend:
        handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in COLORS.values()]
        ax.legend(
            handles,
            ["forward", "backward", "p2p wait/transfer", "grad sync + optimizer"],
            loc="center left",
            bbox_to_anchor=(1.0, 0.5),
            frameon=False,
        )


def draw_timeline(
    events: Sequence[Event],
    tail_ms: Sequence[float],
    path: str | Path,
    title: str,
) -> None:
    """A Gantt chart, one row per PP rank: forwards, backwards, time inside p2p calls, and the
    step tail (gradient sync + optimizer). PNG, SVG or PDF by the file's suffix."""
    ranks = 1 + max(e.rank for e in events)
    with _figure([path], figsize=(12, 0.5 + 0.45 * ranks)) as (_, ax):
        _timeline_on(ax, events, tail_ms, title)
        ax.set_xlabel("ms")


def draw_timelines(
    panels: Sequence[tuple[str, Sequence[Event], Sequence[float]]],
    paths: Sequence[str | Path],
) -> None:
    """Several timelines (title, events, tail per rank) stacked on one shared time axis, so that
    their lengths compare at a glance; saved once per path."""
    heights = [1 + max(e.rank for e in events) for _, events, _ in panels]
    with _figure(
        paths,
        nrows=len(panels),
        sharex=True,
        squeeze=False,
        figsize=(12, 0.6 + sum(0.5 + 0.45 * h for h in heights)),
        gridspec_kw={"height_ratios": heights},
    ) as (_, axes):
        for index, ((title, events, tail), ax) in enumerate(zip(panels, axes[:, 0], strict=True)):
            _timeline_on(ax, events, tail, title, legend=index == 0)
        axes[-1, 0].set_xlabel("ms")


def draw_memory(
    series: Sequence[tuple[str, Sequence[float], Sequence[float] | None]],
    hbm_gib: float | None,
    paths: Sequence[str | Path],
    title: str = "Peak memory per PP rank",
) -> None:
    """Grouped bars of predicted GiB per PP rank, one group member per (label, predicted,
    measured) series; measured values as black diamonds on their bars; HBM as a dashed line."""
    cmap = _pyplot().get_cmap("tab10")
    ranks = max(len(predicted) for _, predicted, _ in series)
    width = 0.8 / len(series)
    size = (max(6.0, 1.2 + 0.35 * ranks * len(series)), 4.2)
    with _figure(paths, figsize=size) as (_, ax):
        measured_drawn = False
        for index, (label, predicted, measured) in enumerate(series):
            xs = [r - 0.4 + width * (index + 0.5) for r in range(len(predicted))]
            ax.bar(xs, predicted, width, label=label, color=cmap(index % 10))
            if measured:
                ax.plot(
                    xs[: len(measured)],
                    measured,
                    "D",
                    color="black",
                    markersize=4,
                    label=None if measured_drawn else "measured",
                )
                measured_drawn = True
        if hbm_gib is not None:
            ax.axhline(
                hbm_gib,
                color=HBM_COLOR,
                linestyle="--",
                linewidth=1.2,
                label=f"HBM {hbm_gib:g} GiB",
            )
        ax.set_xticks(range(ranks), [f"PP rank {r}" for r in range(ranks)])
        ax.set_ylabel("GiB (bars: predicted)")
        ax.set_title(title)
        ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False, fontsize="small")


def draw_predicted_vs_measured(
    points: Sequence[tuple[str, float, float, tuple[float, float] | None]],
    paths: Sequence[str | Path],
    title: str = "Predicted against measured step time",
) -> None:
    """One labelled point per (label, predicted ms, measured ms, CI) with the CI as an error bar,
    and the line y = x where a prediction would be exact."""
    values = [v for _, p, m, ci in points for v in (p, m, *(ci or ()))]
    low, high = min(values), max(values)
    pad = 0.08 * (high - low) or 0.05 * abs(high) or 1.0
    low, high = low - pad, high + pad
    with _figure(paths, figsize=(6.4, 5.2)) as (_, ax):
        ax.plot([low, high], [low, high], color="grey", linestyle="--", linewidth=1, label="y = x")
        for label, predicted, measured, ci in points:
            yerr = None
            if ci is not None:
                yerr = [[max(measured - ci[0], 0.0)], [max(ci[1] - measured, 0.0)]]
            ax.errorbar([predicted], [measured], yerr=yerr, fmt="o", color="#4C78A8", capsize=3)
            ax.annotate(
                label,
                (predicted, measured),
                textcoords="offset points",
                xytext=(6, 4),
                fontsize="small",
            )
        ax.set_xlim(low, high)
        ax.set_ylim(low, high)
        ax.set_aspect("equal")
        ax.set_xlabel("predicted step (ms)")
        ax.set_ylabel("measured step (ms)")
        ax.set_title(title)
        ax.legend(loc="upper left", frameon=False)


def draw_step_traces(
    traces: Mapping[str, Sequence[float]],
    ended_early: Mapping[str, str],
    paths: Sequence[str | Path],
    title: str = "A/B step times",
) -> None:
    """Step time per iteration (warm-up included), one line per arm; an arm in ``ended_early``
    (arm -> how it ended: "stopped", "failed") ends with a cross and says so in the legend.  The
    y axis is cut above 1.5x the slowest median so that warm-up spikes do not flatten the steady
    state (the cut is written on the plot)."""
    import statistics

    cmap = _pyplot().get_cmap("tab10")
    medians = [statistics.median(s) for s in traces.values()]
    top = max(max(s) for s in traces.values())
    low = min(min(s) for s in traces.values())
    cut = 1.5 * max(medians)
    with _figure(paths, figsize=(10, 4.5)) as (_, ax):
        for index, (label, steps) in enumerate(traces.items()):
            color = cmap(index % 10)
            early = ended_early.get(label)
            ax.plot(
                range(1, len(steps) + 1),
                steps,
                color=color,
                linewidth=1.2,
                label=f"{label} ({early} at {len(steps)})" if early else label,
            )
            if early:
                ax.plot([len(steps)], [steps[-1]], "X", color=color, markersize=9)
        if top > cut:
            ax.set_ylim(low * 0.95, cut)
            ax.text(
                0.99,
                0.98,
                f"axis cut at {cut:,.0f} ms (warm-up above)",
                ha="right",
                va="top",
                transform=ax.transAxes,
                fontsize="small",
                color="grey",
            )
        ax.set_xlabel("iteration")
        ax.set_ylabel("step (ms)")
        ax.set_title(title)
        ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False, fontsize="small")
