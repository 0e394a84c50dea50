"""The tune driver's report: what it found, rendered from one frozen :class:`TuneSummary`.

Pure rendering: :func:`write_report` writes ``report.md``, a self-contained ``report.html`` (inline
CSS, plots embedded as base64 PNG, nothing fetched from elsewhere) and the plots as PNG and SVG
under ``plots/``; :func:`print_summary` prints a few lines for the terminal.  Both documents come
from one list of blocks (headings, paragraphs, tables, code, figures), so they say the same thing.
Nothing in them depends on the time or the output folder: the same summary gives the same files.
"""

from __future__ import annotations

import base64
import contextlib
import html
import math
import shlex
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from rich.console import Console
from rich.text import Text

from ray_layout.errors import LayoutError
from ray_layout.model.layout import Layout, format_stages
from ray_layout.report import plots

ROLE_CANDIDATE = "candidate"
ROLE_DEFAULT = "Megatron default"
ROLE_COUNT = "count-based rule"
BASELINES = (ROLE_DEFAULT, ROLE_COUNT)
_ARM_ALIASES = {ROLE_DEFAULT: "default", ROLE_COUNT: "count-based"}
ENDED_EARLY = ("stopped", "failed")
PLOT_NAMES = ("timelines", "memory", "predicted_vs_measured", "ab_traces")
UNIT_NAMES = {"E": "embedding", "t": "decoder layer", "m": "MTP layer", "L": "output layer + loss"}
PARALLEL_LABELS = {
    "pp": "PP",
    "vpp": "VPP",
    "tp": "TP",
    "ep": "EP",
    "dp": "DP",
    "micro_batch_size": "micro-batch size",
    "global_batch_size": "global batch size",
    "num_microbatches": "micro-batches",
}


# ---------------------------------------------------------------------------------------------
# The input


@dataclass(frozen=True)
class ArmOutcome:
    """One layout considered for the A/B, and what became of it."""

    arm: str  # "candidate-1", "candidate-2", ..., "default", "count-based"
    layout: str  # e.g. "Et*5|t*6|t*5|mL"
    role: str  # "candidate", "Megatron default", "count-based rule", or several joined by " + "
    predicted_ms: float  # simulated mean step time under the cost model the search used
    measured_ms: float | None  # mean steady-state step time in the A/B (None: never got there)
    ci_ms: tuple[float, float] | None  # its confidence interval
    iterations: int  # steady iterations measured
    status: str  # "won", "lost", "stopped", "failed", "not run"
    reason: str  # one line: why it stopped / won / failed
    predicted_memory_gib: tuple[float, ...]  # per PP rank
    measured_memory_gib: tuple[float, ...] | None  # measured max allocated per PP rank
    gpu_seconds: float
    steps_ms: tuple[float, ...] = ()  # per-iteration step times (warm-up included)


@dataclass(frozen=True)
class TuneSummary:
    """Everything the tune driver found, as the report shows it."""

    model: str
    config: str  # path of the model config given
    study: str
    store: str  # cost store folder
    backend: str  # "emulated" or "megatron"
    hardware: str
    parallel: Mapping[str, int | None]  # pp, vpp, tp, ep, dp, micro/global batch, micro-batches
    hbm_gib: float | None
    pick: str  # the chosen layout
    flags: tuple[str, ...]  # exact Megatron flags to paste
    pick_source: str  # "A/B test" or "prediction (no A/B)"
    arms: tuple[ArmOutcome, ...]  # every layout considered for the A/B
    decisions: tuple[Mapping[str, Any], ...]  # arm, layout, look, action, reason, statistic, ...
    timelines: Mapping[str, Any]  # name -> search.planner.LayoutSimulation ("pick", ...)
    unit_costs: Any  # ray_layout.model.costs.UnitCosts
    fit_warnings: tuple[str, ...]
    search: Mapping[str, Any]  # {"method": "enumeration", "valid_layouts": 816, ...}
    gpu_seconds_spent: float  # whole tune: profiling + A/B
    gpu_seconds_full: float  # profiling + every A/B arm run to its end
    phase_seconds: Mapping[str, float]  # wall seconds per phase
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class ReportFiles:
    """What :func:`write_report` wrote."""

    markdown: Path
    html: Path
    plots: tuple[Path, ...]  # every PNG and SVG, under plots/
    skipped_plots: tuple[str, ...] = ()  # "name: why", one per plot not drawn


# ---------------------------------------------------------------------------------------------
# Numbers


@dataclass(frozen=True)
class Accuracy:
    """How well the predictions matched the A/B's measurements."""

    errors: Mapping[str, float]  # arm -> predicted / measured - 1, measured arms only
    mean_abs_error: float | None
    max_abs_error: float | None
    worst_arm: str | None  # the arm of the largest absolute error
    spearman: float | None  # rank correlation of predicted and measured (None: < 3, or constant)

    @property
    def measured(self) -> int:
        return len(self.errors)


@dataclass(frozen=True)
class Speedup:
    """The pick's speedup over one baseline (baseline step / pick step)."""

    baseline: str  # "Megatron default" or "count-based rule"
    value: float | None
    basis: str | None  # "measured" (both measured in the A/B), "predicted", or None
    pick_ms: float | None
    baseline_ms: float | None
    baseline_layout: str | None
    note: str = ""  # why there is no value


def _finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x)


def _measured(arm: ArmOutcome) -> bool:
    return _finite(arm.measured_ms) and arm.measured_ms > 0


def _spearman(x: Sequence[float], y: Sequence[float]) -> float | None:
    if len(x) < 3 or len(set(x)) < 2 or len(set(y)) < 2:
        return None
    from scipy.stats import spearmanr

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rho = float(spearmanr(x, y).statistic)
    return rho if math.isfinite(rho) else None


def prediction_accuracy(arms: Iterable[ArmOutcome]) -> Accuracy:
    """Relative error of every measured arm, their mean and largest absolute value, and the
    Spearman rank correlation of predicted against measured step time."""
    measured = [a for a in arms if _measured(a) and _finite(a.predicted_ms)]
    errors = {a.arm: a.predicted_ms / a.measured_ms - 1 for a in measured}
    if not errors:
        return Accuracy(MappingProxyType({}), None, None, None, None)
    worst = max(errors, key=lambda arm: abs(errors[arm]))
    return Accuracy(
        errors=MappingProxyType(errors),
        mean_abs_error=sum(abs(e) for e in errors.values()) / len(errors),
        max_abs_error=abs(errors[worst]),
        worst_arm=worst,
        spearman=_spearman([a.predicted_ms for a in measured], [a.measured_ms for a in measured]),
    )


def pick_arm(summary: TuneSummary) -> ArmOutcome | None:
    """The arm that ran the pick: the winner if it holds the pick, else a candidate, else any."""
    holding = [a for a in summary.arms if a.layout == summary.pick]
    for wanted in (lambda a: a.status == "won", lambda a: ROLE_CANDIDATE in a.role.split(" + ")):
        for arm in holding:
            if wanted(arm):
                return arm
    return holding[0] if holding else None


def baseline_arm(summary: TuneSummary, role: str) -> ArmOutcome | None:
    """The arm of a baseline, by role (or by its usual arm name)."""
    for arm in summary.arms:
        if role in arm.role.split(" + "):  # an arm may be a candidate and a baseline at once
            return arm
    return next((a for a in summary.arms if a.arm == _ARM_ALIASES.get(role)), None)


def _simulated(summary: TuneSummary, name: str) -> Any:
    """The scored candidate of a simulated timeline (``None`` where there is none)."""
    return getattr(summary.timelines.get(name), "candidate", None)


def _predicted(arm: ArmOutcome | None, summary: TuneSummary, name: str) -> float | None:
    if arm is not None and _finite(arm.predicted_ms):
        return arm.predicted_ms
    mean = getattr(_simulated(summary, name), "mean_ms", None)
    return mean if _finite(mean) else None


def speedups(summary: TuneSummary) -> dict[str, Speedup]:
    """The pick's speedup over Megatron's default and the count-based rule, keyed by baseline:
    measured when the A/B measured both the pick and the baseline, else predicted."""
    pick = pick_arm(summary)
    found = {}
    for role in BASELINES:
        base = baseline_arm(summary, role)
        layout = (
            base.layout if base is not None else getattr(_simulated(summary, role), "layout", None)
        )
        if pick is not None and base is not None and _measured(pick) and _measured(base):
            found[role] = Speedup(
                role,
                base.measured_ms / pick.measured_ms,
                "measured",
                pick.measured_ms,
                base.measured_ms,
                layout,
            )
            continue
        pick_ms = _predicted(pick, summary, "pick")
        base_ms = _predicted(base, summary, role)
        if pick_ms is None or base_ms is None or pick_ms <= 0:
            why = "no prediction of the pick" if pick_ms is None else f"no {role} layout scored"
            found[role] = Speedup(role, None, None, pick_ms, base_ms, layout, why)
        else:
            found[role] = Speedup(role, base_ms / pick_ms, "predicted", pick_ms, base_ms, layout)
    return found


def paste_line(summary: TuneSummary) -> str:
    """The flags as one shell line (quoted where the shell needs it, as ``|`` and ``*`` do)."""
    if summary.flags:
        return shlex.join(summary.flags)
    return shlex.join(("--pipeline-model-parallel-layout", summary.pick))


def _pick_layout(summary: TuneSummary) -> Layout | None:
    pp = summary.parallel.get("pp")
    if pp:
        with contextlib.suppress(LayoutError, ValueError):
            return Layout.parse(summary.pick, pp)
    return None


def pick_shape(summary: TuneSummary) -> tuple[int | None, int | None]:
    """(PP, VPP) of the pick: VPP from the layout's stages per rank where it parses, else the
    run's."""
    layout = _pick_layout(summary)
    if layout is not None:
        return layout.pp, layout.vpp
    return summary.parallel.get("pp"), summary.parallel.get("vpp")


def gpu_saving(summary: TuneSummary) -> float | None:
    """The share of GPU-seconds early stopping saved: 1 - spent / full (None: full unknown)."""
    if not _finite(summary.gpu_seconds_full) or summary.gpu_seconds_full <= 0:
        return None
    return 1 - summary.gpu_seconds_spent / summary.gpu_seconds_full


# ---------------------------------------------------------------------------------------------
# Formatting


def _ms(x: float | None) -> str:
    return "—" if not _finite(x) else f"{x:,.1f}"


def _gib(x: float | None) -> str:
    return "—" if not _finite(x) else f"{x:,.1f}"


def _signed_pct(x: float | None) -> str:
    return "—" if not _finite(x) else f"{x:+.1%}"


def _pct(x: float | None) -> str:
    return "—" if not _finite(x) else f"{x:.1%}"


def _times(x: float | None) -> str:
    return "—" if not _finite(x) else f"{x:.2f}×"


def _value(x: Any) -> str:
    if x is None:
        return "not given"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return f"{x:,}"
    if isinstance(x, float):
        return f"{x:,.3g}" if abs(x) < 1000 else f"{x:,.0f}"
    return str(x)


def _measured_cell(arm: ArmOutcome) -> str:
    if not _measured(arm):
        return "—"
    if arm.ci_ms is None:
        return _ms(arm.measured_ms)
    return f"{_ms(arm.measured_ms)} ± {abs(arm.ci_ms[1] - arm.ci_ms[0]) / 2:,.1f}"


# ---------------------------------------------------------------------------------------------
# The document: blocks rendered to Markdown and to HTML


@dataclass(frozen=True)
class Code:
    """Inline code (a layout, a path, a flag)."""

    text: str


@dataclass(frozen=True)
class Strong:
    text: str


Inline = str | Code | Strong
Parts = tuple[Inline, ...]


@dataclass(frozen=True)
class Heading:
    level: int
    text: str


@dataclass(frozen=True)
class Para:
    parts: Parts


@dataclass(frozen=True)
class CodeBlock:
    text: str
    language: str = ""


@dataclass(frozen=True)
class Table:
    header: tuple[str, ...]
    rows: tuple[tuple[Inline | Parts, ...], ...]
    numeric: tuple[bool, ...]  # right-aligned columns


@dataclass(frozen=True)
class Bullets:
    items: tuple[Parts, ...]


@dataclass(frozen=True)
class Figure:
    name: str
    caption: str
    png: Path  # where it was written
    svg: Path


Block = Heading | Para | CodeBlock | Table | Bullets | Figure

_MD_SPECIAL = "\\`*_[]<>|~"


def _md_escape(text: str) -> str:
    """Backslash before every character Markdown could read as markup (``|`` included, for
    tables); an underscore inside a word stays bare, as GFM never reads it as emphasis."""
    text = " ".join(text.splitlines())
    out = []
    for i, c in enumerate(text):
        intraword = 0 < i < len(text) - 1 and text[i - 1].isalnum() and text[i + 1].isalnum()
        out.append("\\" + c if c in _MD_SPECIAL and not (c == "_" and intraword) else c)
    return "".join(out)


def _parts(cell: Inline | Parts) -> Parts:
    return cell if isinstance(cell, tuple) else (cell,)


def _md_inline(parts: Parts, in_table: bool = False) -> str:
    out = []
    for part in parts:
        if isinstance(part, Code):
            text = " ".join(part.text.splitlines())
            fence = "``" if "`" in text else "`"
            pad = " " if fence == "``" else ""
            if in_table:  # GFM splits cells before code spans: a pipe needs its backslash
                text = text.replace("|", "\\|")
            out.append(f"{fence}{pad}{text}{pad}{fence}")
        elif isinstance(part, Strong):
            out.append(f"**{_md_escape(part.text)}**")
        else:
            out.append(_md_escape(part))
    return "".join(out)


def render_markdown(blocks: Sequence[Block]) -> str:
    out: list[str] = []
    for block in blocks:
        if isinstance(block, Heading):
            out.append("#" * block.level + " " + _md_escape(block.text))
        elif isinstance(block, Para):
            out.append(_md_inline(block.parts))
        elif isinstance(block, CodeBlock):
            fence = "````" if "```" in block.text else "```"
            out.append(f"{fence}{block.language}\n{block.text}\n{fence}")
        elif isinstance(block, Table):
            lines = ["| " + " | ".join(_md_escape(h) for h in block.header) + " |"]
            lines.append("|" + "|".join("---:" if n else "---" for n in block.numeric) + "|")
            for row in block.rows:
                cells = (_md_inline(_parts(cell), in_table=True) for cell in row)
                lines.append("| " + " | ".join(cells) + " |")
            out.append("\n".join(lines))
        elif isinstance(block, Bullets):
            out.append("\n".join("- " + _md_inline(item) for item in block.items))
        elif isinstance(block, Figure):
            png, svg = f"plots/{block.png.name}", f"plots/{block.svg.name}"
            out.append(
                f"![{_md_escape(block.caption)}]({png})\n\n"
                f"{_md_escape(block.caption)} (PNG `{png}`, SVG `{svg}`)"
            )
    return "\n\n".join(out) + "\n"


def _html_inline(parts: Parts) -> str:
    out = []
    for part in parts:
        if isinstance(part, Code):
            out.append(f"<code>{html.escape(part.text)}</code>")
        elif isinstance(part, Strong):
            out.append(f"<strong>{html.escape(part.text)}</strong>")
        else:
            out.append(html.escape(part))
    return "".join(out)


CSS = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; color: #222;
       max-width: 1180px; margin: 2em auto; padding: 0 1em; line-height: 1.45; }
h1 { border-bottom: 2px solid #4C78A8; padding-bottom: .2em; }
h2 { margin-top: 1.6em; border-bottom: 1px solid #ddd; padding-bottom: .15em; }
code, pre { font-family: "SFMono-Regular", Menlo, Consolas, monospace; font-size: .92em; }
code { background: #f3f3f3; padding: 0 .25em; border-radius: 3px; }
pre { background: #f6f8fa; border: 1px solid #ddd; padding: .8em; overflow-x: auto; }
pre code { background: none; padding: 0; }
table { border-collapse: collapse; margin: .6em 0; font-size: .92em; }
th, td { border: 1px solid #ccc; padding: .25em .6em; vertical-align: top; text-align: left; }
th { background: #f0f3f7; }
td.num, th.num { text-align: right; white-space: nowrap; }
tbody tr:nth-child(even) { background: #fafafa; }
figure { margin: 1em 0; }
figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { color: #555; font-size: .9em; }
""".strip()


def render_html(blocks: Sequence[Block], title: str) -> str:
    """One self-contained page: inline CSS, figures as base64 PNG, no scripts, no links."""
    body: list[str] = []
    for block in blocks:
        if isinstance(block, Heading):
            body.append(f"<h{block.level}>{html.escape(block.text)}</h{block.level}>")
        elif isinstance(block, Para):
            body.append(f"<p>{_html_inline(block.parts)}</p>")
        elif isinstance(block, CodeBlock):
            body.append(f"<pre><code>{html.escape(block.text)}</code></pre>")
        elif isinstance(block, Table):
            cls = [' class="num"' if n else "" for n in block.numeric]
            head = "".join(
                f"<th{c}>{html.escape(h)}</th>" for c, h in zip(cls, block.header, strict=True)
            )
            rows = "\n".join(
                "<tr>"
                + "".join(
                    f"<td{c}>{_html_inline(_parts(cell))}</td>"
                    for c, cell in zip(cls, row, strict=True)
                )
                + "</tr>"
                for row in block.rows
            )
            body.append(
                f"<table>\n<thead><tr>{head}</tr></thead>\n<tbody>\n{rows}\n</tbody>\n</table>"
            )
        elif isinstance(block, Bullets):
            items = "\n".join(f"<li>{_html_inline(item)}</li>" for item in block.items)
            body.append(f"<ul>\n{items}\n</ul>")
        elif isinstance(block, Figure):
            data = base64.b64encode(block.png.read_bytes()).decode("ascii")
            caption = html.escape(block.caption)
            body.append(
                f'<figure><img alt="{caption}" src="data:image/png;base64,{data}">'
                f"<figcaption>{caption}</figcaption></figure>"
            )
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{html.escape(title)}</title>\n<style>\n{CSS}\n</style>\n</head>\n<body>\n"
        + "\n".join(body)
        + "\n</body>\n</html>\n"
    )


# ---------------------------------------------------------------------------------------------
# Plots


def _timeline_panels(summary: TuneSummary) -> list[tuple[str, Any, Any]]:
    names = ["pick"] + [n for n in summary.timelines if n != "pick"]
    panels = []
    for name in names:
        sim = summary.timelines.get(name)
        if sim is None or not getattr(sim, "events", None):
            continue
        candidate = getattr(sim, "candidate", None)
        layout = getattr(candidate, "layout", "")
        title = f"{name}: {layout}" if layout else name
        mean = getattr(candidate, "mean_ms", None)
        if _finite(mean):
            title += f", predicted {mean:,.0f} ms"
        bubble = getattr(sim, "bubble_fraction", None)
        if _finite(bubble):
            title += f", bubble {bubble:.1%}"
        panels.append((title, sim.events, sim.tail_ms))
    return panels


def _memory_series(summary: TuneSummary) -> list[tuple[str, Any, Any]]:
    series = []
    for arm in summary.arms:
        if arm.predicted_memory_gib:
            label = f"{arm.arm}: {arm.layout}" + (" (pick)" if arm.layout == summary.pick else "")
            series.append((label, arm.predicted_memory_gib, arm.measured_memory_gib))
    if not series:  # no arms: the pick's simulated memory alone
        memory = getattr(_simulated(summary, "pick"), "memory_gib", None)
        if memory:
            series.append((f"pick: {summary.pick}", memory, None))
    return series


def _draw_plots(summary: TuneSummary, folder: Path) -> tuple[dict[str, Figure], dict[str, str]]:
    """Draw every plot the data allows: (name -> Figure, name -> why it was skipped)."""
    folder.mkdir(parents=True, exist_ok=True)
    measured = [a for a in summary.arms if _measured(a) and _finite(a.predicted_ms)]
    traced = [a for a in summary.arms if a.steps_ms]
    panels = _timeline_panels(summary)
    series = _memory_series(summary)
    plans: dict[str, tuple[str, Any] | str] = {
        "timelines": (
            "Simulated step of each layout, per PP rank, on one time axis",
            lambda paths: plots.draw_timelines(panels, paths),
        )
        if panels and "pick" in summary.timelines
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
                {a.arm: a.status for a in traced if a.status in ENDED_EARLY},
                paths,
            ),
        )
        if traced
        else "no A/B step times were recorded",
    }
    figures: dict[str, Figure] = {}
    skipped: dict[str, str] = {}
    for name in PLOT_NAMES:
        paths = (folder / f"{name}.png", folder / f"{name}.svg")
        plan = plans[name]
        if isinstance(plan, tuple):
            caption, draw = plan
            try:
                draw(paths)
            except Exception as exc:  # a report at the end of a long tune must still be written
                skipped[name] = f"could not be drawn ({type(exc).__name__}: {exc})"
            else:
                figures[name] = Figure(name, caption, *paths)
                continue
        else:
            skipped[name] = plan
        for stale in paths:  # an earlier report's picture would contradict this one
            stale.unlink(missing_ok=True)
    return figures, skipped


# ---------------------------------------------------------------------------------------------
# The content


def _figure_or_note(name: str, figures: Mapping[str, Figure], skipped: Mapping[str, str]) -> Block:
    if name in figures:
        return figures[name]
    return Para((f"Plot {name.replace('_', ' ')} skipped: {skipped.get(name, 'no data')}.",))


def _use_this(summary: TuneSummary) -> list[Block]:
    pp, vpp = pick_shape(summary)
    source = summary.pick_source
    shape = f"PP {_value(pp)}, VPP {_value(vpp)}"
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
    ]
    arm = pick_arm(summary)
    predicted = _predicted(arm, summary, "pick")
    if arm is not None and _measured(arm):
        text = f"Step time of the pick: measured {_ms(arm.measured_ms)} ms ("
        if arm.ci_ms is not None:
            text += f"CI {_ms(arm.ci_ms[0])} to {_ms(arm.ci_ms[1])} ms, "
        text += f"{arm.iterations:,} steady iterations), predicted {_ms(predicted)} ms."
    else:
        text = f"Step time of the pick: predicted {_ms(predicted)} ms (not measured)."
    blocks.append(Para((text,)))
    return blocks


def _header(summary: TuneSummary) -> list[Block]:
    parallel = ", ".join(
        f"{PARALLEL_LABELS.get(k, k)} {_value(v)}" for k, v in summary.parallel.items()
    )
    hbm = f"{summary.hbm_gib:g} GiB" if _finite(summary.hbm_gib) else "not given"
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
            )
        ),
        Para((f"Parallel: {parallel}. HBM per GPU: {hbm}.",)),
    ]


def _results(summary: TuneSummary) -> list[Block]:
    blocks: list[Block] = [Heading(2, "Results")]
    if summary.search:
        found = ", ".join(f"{k.replace('_', ' ')} {_value(v)}" for k, v in summary.search.items())
        blocks.append(Para((f"Search: {found}.",)))
    if not summary.arms:
        blocks.append(Para(("No layout was taken to the A/B.",)))
        return blocks
    accuracy = prediction_accuracy(summary.arms)
    rows = []
    for arm in summary.arms:
        name: Parts = (arm.arm, " ", Strong("(pick)")) if arm is pick_arm(summary) else (arm.arm,)
        rows.append(
            (
                name,
                arm.role,
                Code(arm.layout),
                _ms(arm.predicted_ms),
                _measured_cell(arm),
                _signed_pct(accuracy.errors.get(arm.arm)),
                arm.status,
                arm.reason,
            )
        )
    blocks.append(
        Table(
            (
                "Arm",
                "Role",
                "Layout",
                "Predicted ms",
                "Measured ms ± CI",
                "Error",
                "Status",
                "Reason",
            ),
            tuple(rows),
            (False, False, False, True, True, True, False, False),
        )
    )
    blocks.append(Para(("Error is predicted / measured − 1; the ± is half the CI's width.",)))
    return blocks


def _speedups(summary: TuneSummary) -> list[Block]:
    rows = []
    for role, s in speedups(summary).items():
        rows.append(
            (
                role,
                Code(s.baseline_layout) if s.baseline_layout else "—",
                _ms(s.pick_ms),
                _ms(s.baseline_ms),
                _times(s.value),
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


def _accuracy(summary: TuneSummary, figures, skipped) -> list[Block]:
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
                    (f"Mean absolute error: {_pct(accuracy.mean_abs_error)}",),
                    (
                        f"Largest absolute error: {_pct(accuracy.max_abs_error)} "
                        f"({accuracy.worst_arm})",
                    ),
                    (f"Spearman rank correlation of predicted and measured: {rho}",),
                )
            )
        )
    blocks.append(_figure_or_note("predicted_vs_measured", figures, skipped))
    return blocks


def _decisions(summary: TuneSummary, figures, skipped) -> list[Block]:
    blocks: list[Block] = [Heading(2, "A/B decisions")]
    if summary.decisions:
        rows = []
        for d in summary.decisions:
            p = d.get("p_value")
            rows.append(
                (
                    _value(d.get("look")),
                    str(d.get("arm", "—")),
                    str(d.get("action", "—")),
                    str(d.get("reason", "")),
                    f"{p:.3g}" if _finite(p) else "—",
                    _value(d.get("n_steady")),
                    _ms(d.get("mean_ms")),
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
    blocks.append(_figure_or_note("ab_traces", figures, skipped))
    return blocks


def _gpu_time(summary: TuneSummary) -> list[Block]:
    saving = gpu_saving(summary)
    text = f"Spent {summary.gpu_seconds_spent:,.0f} GPU-seconds (profiling and A/B)"
    if saving is None:
        text += "; the cost of running every arm to its end is unknown."
    else:
        text += (
            f"; running every A/B arm to its end would have taken "
            f"{summary.gpu_seconds_full:,.0f}: early stopping saved {_pct(saving)}."
        )
    blocks: list[Block] = [Heading(2, "GPU time"), Para((text,))]
    if summary.arms:
        rows = tuple(
            (a.arm, a.status, f"{a.iterations:,}", f"{a.gpu_seconds:,.0f}") for a in summary.arms
        )
        blocks.append(
            Table(
                ("Arm", "Status", "Steady iterations", "GPU-seconds"),
                rows,
                (False, False, True, True),
            )
        )
    return blocks


def _memory(summary: TuneSummary, figures, skipped) -> list[Block]:
    blocks: list[Block] = [Heading(2, "Memory of the pick")]
    arm = pick_arm(summary)
    predicted = arm.predicted_memory_gib if arm is not None else ()
    if not predicted:
        predicted = tuple(getattr(_simulated(summary, "pick"), "memory_gib", None) or ())
    measured = (arm.measured_memory_gib if arm is not None else None) or ()
    layout = _pick_layout(summary)
    hbm = summary.hbm_gib if _finite(summary.hbm_gib) else None
    if predicted:
        rows = []
        for rank, gib in enumerate(predicted):
            seen = measured[rank] if rank < len(measured) else None
            units = (
                ", ".join(format_stages((s,)) or "none" for s in layout.rank_chunks(rank))
                if layout and rank < layout.pp
                else "—"
            )
            peak = max(gib, seen) if _finite(seen) else gib
            rows.append(
                (
                    str(rank),
                    Code(units),
                    _gib(gib),
                    _gib(seen),
                    _gib(hbm),
                    _gib(hbm - peak) if hbm is not None else "—",
                )
            )
        blocks.append(
            Table(
                ("PP rank", "Units", "Predicted GiB", "Measured GiB", "HBM GiB", "Headroom GiB"),
                tuple(rows),
                (True, False, True, True, True, True),
            )
        )
        blocks.append(Para(("Headroom is HBM less the larger of predicted and measured.",)))
    else:
        blocks.append(Para(("No memory per stage was given for the pick.",)))
    blocks.append(_figure_or_note("memory", figures, skipped))
    return blocks


def _unit_costs(summary: TuneSummary) -> list[Block]:
    costs = summary.unit_costs
    blocks: list[Block] = [Heading(2, "Unit costs")]
    forward = getattr(costs, "forward_ms", None) or {}
    if not forward:
        blocks.append(Para(("No unit costs were given.",)))
        return blocks
    backward = getattr(costs, "backward_ms", None) or {}
    jitter = getattr(costs, "jitter_cv", None) or {}
    rows = []
    for unit, f in forward.items():
        b = backward.get(unit)
        rows.append(
            (
                Code(unit),
                UNIT_NAMES.get(unit, ""),
                f"{f:,.2f}",
                f"{b:,.2f}" if _finite(b) else "—",
                f"{f + b:,.2f}" if _finite(b) else "—",
                f"{jitter[unit]:.3f}" if unit in jitter else "0",
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
    intra, inter = (getattr(costs, a, None) for a in ("p2p_intra_node_ms", "p2p_inter_node_ms"))
    if _finite(intra) and _finite(inter):
        extra.append(f"p2p per transfer {intra:g} ms within a node, {inter:g} ms across nodes")
    sync, opt = (
        getattr(costs, a, None) for a in ("grad_sync_ms_per_gparam", "optimizer_ms_per_gparam")
    )
    if _finite(sync) and _finite(opt):
        extra.append(
            f"step tail per billion parameters on a GPU: gradient sync {sync:g} ms + "
            f"optimizer {opt:g} ms"
        )
    source = getattr(costs, "source", None)
    if source:
        extra.append(f"source {source}")
    scope = " per micro-batch"
    mbs, seq = getattr(costs, "micro_batch_size", None), getattr(costs, "seq_length", None)
    if mbs and seq:
        scope += f" of {mbs} × {seq} tokens"
    blocks.append(Para((f"Times{scope}. " + ("; ".join(extra) + "." if extra else ""),)))
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
        (phase, f"{s:,.1f}", _pct(s / total) if total > 0 else "—")
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
        _figure_or_note("timelines", figures, skipped),
        *_accuracy(summary, figures, skipped),
        *_decisions(summary, figures, skipped),
        *_gpu_time(summary),
        *_memory(summary, figures, skipped),
        *_unit_costs(summary),
        *_warnings_notes(summary),
        *_phases(summary),
        Heading(2, "How to read this"),
        Para((HOW_TO_READ,)),
    ]


def write_report(summary: TuneSummary, out_dir: str | Path) -> ReportFiles:
    """Write ``report.md``, ``report.html`` and ``plots/*.png|svg`` under ``out_dir``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    figures, skipped = _draw_plots(summary, out_dir / "plots")
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


# ---------------------------------------------------------------------------------------------
# The terminal


def print_summary(summary: TuneSummary, console: Console, files: ReportFiles | None = None) -> None:
    """A few lines: the pick, the flags to paste, its step time, speedups, the A/B saving and
    where the report is."""

    def say(*parts: str | tuple[str, str], soft_wrap: bool = False) -> None:
        console.print(Text.assemble(*parts), highlight=False, soft_wrap=soft_wrap)

    say(("Pick ", "bold"), (summary.pick, "bold cyan"), f", from {summary.pick_source}")
    say("Paste: ", (paste_line(summary), "bold"), soft_wrap=True)
    arm = pick_arm(summary)
    predicted = _predicted(arm, summary, "pick")
    if arm is not None and _measured(arm):
        step = f"Step: measured {_ms(arm.measured_ms)} ms, predicted {_ms(predicted)} ms"
    else:
        step = f"Step: predicted {_ms(predicted)} ms (not measured)"
    say(step)
    found = speedups(summary)
    say(
        "Speedup: "
        + ", ".join(
            f"{_times(s.value)} over {role}" + (f" ({s.basis})" if s.basis else f" ({s.note})")
            for role, s in found.items()
        )
    )
    saving = gpu_saving(summary)
    gpu = f"GPU-seconds: {summary.gpu_seconds_spent:,.0f} spent"
    if saving is not None:
        gpu += f" of {summary.gpu_seconds_full:,.0f} without early stopping ({_pct(saving)} saved)"
    say(gpu)
    if summary.fit_warnings:
        say((f"{len(summary.fit_warnings)} fit warning(s): see the report", "yellow"))
    if files is not None:
        say("Report: ", str(files.markdown), " and ", str(files.html), soft_wrap=True)
