"""Pictures of simulated (later: measured) pipeline steps."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from search.schedule import Event

COLORS = {"F": "#4C78A8", "B": "#F58518", "p2p": "#BAB0AC", "tail": "#54A24B"}


def draw_timeline(
    events: Sequence[Event],
    tail_ms: Sequence[float],
    path: str | Path,
    title: str,
) -> None:
    """A Gantt chart, one row per PP rank: forwards, backwards, time inside p2p calls, and the
    step tail (gradient sync + optimizer). PNG, SVG or PDF by the file's suffix."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ranks = 1 + max(e.rank for e in events)
    finish = [max(e.end for e in events if e.rank == r) for r in range(ranks)]
    fig, ax = plt.subplots(figsize=(12, 0.5 + 0.45 * ranks))
    for event in events:
        if event.end <= event.start:
            continue
        color = COLORS[event.label[0]] if event.is_compute else COLORS["p2p"]
        ax.broken_barh([(event.start, event.end - event.start)], (event.rank - 0.4, 0.8),
                       facecolors=color, edgecolor="white", linewidth=0.3)  # fmt: skip
    for rank, (end, tail) in enumerate(zip(finish, tail_ms, strict=True)):
        if tail > 0:
            ax.broken_barh([(end, tail)], (rank - 0.4, 0.8), facecolors=COLORS["tail"])
    ax.set_yticks(range(ranks), [f"PP rank {r}" for r in range(ranks)])
    ax.invert_yaxis()
    ax.set_xlabel("ms")
    ax.set_title(title)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in COLORS.values()]
    ax.legend(handles, ["forward", "backward", "p2p wait/transfer", "grad sync + optimizer"],
              loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False)  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
