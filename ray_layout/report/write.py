"""Writing the report: ``report.md``, a self-contained ``report.html`` (inline CSS, plots embedded
as base64 PNG, nothing fetched from elsewhere) and the plots as PNG and SVG under ``plots/``.  The
same summary gives the same files."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ray_layout.report.document import render_html, render_markdown
from ray_layout.report.figures import draw_figures
from ray_layout.report.sections import build_document
from ray_layout.report.summary import TuneSummary


@dataclass(frozen=True)
class ReportFiles:
    """What :func:`write_report` wrote."""

    markdown: Path
    html: Path
    plots: tuple[Path, ...]  # every PNG and SVG, under plots/
    skipped_plots: tuple[str, ...] = ()  # "name: why", one per plot not drawn


def write_report(summary: TuneSummary, out_dir: str | Path) -> ReportFiles:
    """Write ``report.md``, ``report.html`` and ``plots/*.png|svg`` under ``out_dir``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    figures, skipped = draw_figures(summary, out_dir / "plots")
    blocks = build_document(summary, figures, skipped)
    markdown, page = out_dir / "report.md", out_dir / "report.html"
    markdown.write_text(render_markdown(blocks), encoding="utf-8", newline="\n")
    title = f"Pipeline layout report: {summary.model}"
    page.write_text(render_html(blocks, title), encoding="utf-8", newline="\n")
    return ReportFiles(
        markdown=markdown,
        html=page,
        plots=tuple(p for f in figures.values() for p in (f.png, f.svg)),
        skipped_plots=tuple(f"{name}: {why}" for name, why in skipped.items()),
    )
