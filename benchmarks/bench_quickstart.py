"""The quickstart's faithfulness: does ``make run`` pick what the planner picks on the emulated
cluster's own costs, does each A/B arm step as the simulator says it should, and does early
stopping save GPU time?

    python benchmarks/bench_quickstart.py                  # about 3-4 min on 2 cores
    python benchmarks/bench_quickstart.py --json out.json  # also write every number as JSON

Setup: exactly ``make run`` (the Makefile): ``python -m ray_layout.tune
configs/handbook_7b_a1b.yaml --pp 4 --hbm-gb 131 --profile-iters 8 --study quickstart``, its
flags parsed by the command's own parser, with the default A/B (top 3 and both baselines), on
the embedded Ray cluster of 3 nodes x 4 simulated GPUs, every rank the CPU-emulated Megatron
sleeping the costs of cluster_configs/hardware/h200_emulated.yaml, into a fresh temporary store
and report folder.  The tune never reads that profile; this benchmark does, afterwards: its unit
costs (``gpus_per_node`` set to the cluster's 4, as the emulated ranks take their node from the
launcher) go through the tune's own search (``ray_layout.tuning.phases.search``: same spec,
samples, seed and ``--hbm-gb``), and each arm is scored on them (``score_given``).

Targets:

1. pick: the A/B's pick is the planner's pick on the profile's own costs, or within the A/B's
   margin (2%) of it on those costs (a tie the A/B breaks on memory headroom);
2. steps: each A/B arm's measured mean step within 2% of its simulated step on the own costs;
3. GPU-seconds: early stopping saves at least 30% (1 - ``TuneSummary.gpu_seconds_spent /
   gpu_seconds_full``).

Exits 0 after a completed measurement, whatever the verdicts; 1 with one line if the tune fails.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from benchmarks.bench_tune import load_average, machine  # noqa: E402
from launchers.emulated.hardware import BUNDLED_PROFILE, load_profile  # noqa: E402
from ray_layout.commands.flags import from_args  # noqa: E402
from ray_layout.commands.tune import TuneFlags, build_parser, tune_on_cluster  # noqa: E402
from ray_layout.errors import RayLayoutError  # noqa: E402
from ray_layout.model.layout import Layout  # noqa: E402
from ray_layout.model.spec import Recipe  # noqa: E402
from ray_layout.report.summary import ArmOutcome, TuneSummary, saved_share  # noqa: E402
from ray_layout.tuning.phases import search  # noqa: E402
from ray_layout.tuning.settings import TuneSettings  # noqa: E402
from search.planner import Problem, score_given  # noqa: E402
from search.ranking import Candidate  # noqa: E402

# make run's arguments (the Makefile's `run` target; tests/test_bench_quickstart.py holds them
# to it)
MAKE_RUN = ("configs/handbook_7b_a1b.yaml", "--pp", "4", "--hbm-gb", "131",
            "--profile-iters", "8", "--study", "quickstart")  # fmt: skip
TARGET_STEP, TARGET_SAVED = 0.02, 0.30
TOP = 3  # the planner's top layouts shown


@dataclass(frozen=True)
class ArmCheck:
    """One A/B arm: its measured mean step against its simulated step on the own costs."""

    arm: str
    layout: str
    status: str
    measured_ms: float | None  # None: the arm never reached a steady mean
    simulated_ms: float
    error: float | None  # measured / simulated - 1
    ok: bool


@dataclass(frozen=True)
class PickCheck:
    """The A/B's pick against the planner's on the own costs."""

    ab_pick: str
    own_pick: str
    verdict: str  # "equal", "within the margin" or "behind"
    simulated_gap: float  # the A/B pick's own-costs step over the own pick's, less 1
    measured_gap: float | None  # the same in the A/B's measurements, if both were arms
    margin: float
    ok: bool

    def says(self) -> str:
        """How the A/B's pick stands to the own-costs pick, in words."""
        return {
            "equal": "equals it",
            "within the margin": f"is within the A/B's {self.margin:.0%} margin of it",
            "behind": f"is behind it by more than the A/B's {self.margin:.0%} margin",
        }[self.verdict]


def arm_checks(arms: Sequence[ArmOutcome], simulated: Mapping[str, float]) -> list[ArmCheck]:
    """Each arm's measured step against ``simulated[layout]``, within TARGET_STEP."""
    checks = []
    for a in arms:
        sim = simulated[a.layout]
        error = None if a.measured_ms is None else a.measured_ms / sim - 1
        ok = error is not None and abs(error) <= TARGET_STEP
        checks.append(ArmCheck(a.arm, a.layout, str(a.status), a.measured_ms, sim, error, ok))
    return checks


def pick_check(
    ab_pick: str,
    own_pick: str,
    simulated: Mapping[str, float],
    measured: Mapping[str, float | None],
    margin: float,
) -> PickCheck:
    """Equal, or tied within the A/B's ``margin`` on the own costs (the simulated steps decide;
    the measured gap, where both layouts were arms, is shown beside it)."""
    gap = simulated[ab_pick] / simulated[own_pick] - 1
    ab_ms, own_ms = measured.get(ab_pick), measured.get(own_pick)
    measured_gap = None if ab_ms is None or own_ms is None else ab_ms / own_ms - 1
    if ab_pick == own_pick:
        verdict = "equal"
    elif gap <= margin:
        verdict = "within the margin"
    else:
        verdict = "behind"
    return PickCheck(ab_pick, own_pick, verdict, gap, measured_gap, margin, verdict != "behind")


@dataclass(frozen=True)
class Faithfulness:
    """The quickstart's tune held against the profile's own costs."""

    arms: tuple[ArmCheck, ...]
    own_top: tuple[Candidate, ...]  # the planner's top fitting layouts on the own costs
    pick: PickCheck
    gpu_seconds_spent: float
    gpu_seconds_full: float

    @property
    def saved(self) -> float | None:
        """The share of the whole tune's GPU-seconds that early stopping saved."""
        return saved_share(self.gpu_seconds_spent, self.gpu_seconds_full)

    def passes(self) -> dict[str, bool]:
        return {
            "pick": self.pick.ok,
            "steps": all(c.ok for c in self.arms),
            "gpu_seconds": self.saved is not None and self.saved >= TARGET_SAVED,
        }


def run_quickstart(work: Path, console: Console) -> tuple[TuneSummary, Recipe, TuneSettings]:
    """``make run`` into ``work``, as the tune command runs it; returns the summary, the recipe
    and the settings (with the cluster's GPUs per node)."""
    argv = [*MAKE_RUN, "--store", str(work / "store"), "--report-dir", str(work / "report")]
    flags = from_args(TuneFlags, build_parser().parse_args(argv))
    return tune_on_cluster(flags, console, threading.Event())


def against_own_costs(summary: TuneSummary, recipe: Recipe, settings: TuneSettings) -> Faithfulness:
    """The tune's search and each arm's score, redone on the profile's own costs."""
    own = replace(load_profile(BUNDLED_PROFILE).costs, gpus_per_node=settings.gpus_per_node)
    searched = search(recipe, own, settings)
    problem = Problem.of(recipe, own, searched.spec, searched.options)
    top = tuple(c for c in searched.found.candidates if c.fits)[:TOP]
    simulated = {str(c.layout): c.mean_ms for c in top}
    for a in summary.arms:
        layout = Layout.parse(a.layout, recipe.parallel.pp)
        simulated[a.layout] = score_given(layout, problem).mean_ms
    measured = {a.layout: a.measured_ms for a in summary.arms}
    pick = pick_check(
        summary.pick, str(top[0].layout), simulated, measured, settings.options.ab.margin
    )
    spent, full = float(summary.gpu_seconds_spent), float(summary.gpu_seconds_full)
    return Faithfulness(tuple(arm_checks(summary.arms, simulated)), top, pick, spent, full)


def pct(x: float | None) -> str:
    return "" if x is None else f"{x:+.2%}"


def ms(x: float | None) -> str:
    return "" if x is None else f"{x:,.1f}"


def print_result(console: Console, result: Faithfulness, summary: TuneSummary) -> None:
    verdict = {True: "[green]PASS[/green]", False: "[red]MISS[/red]"}
    passes = result.passes()
    table = Table(title="A/B arms: measured mean step against the simulator on the own costs")
    for name in ("arm", "layout", "measured ms", "own-costs simulated ms", "error", "status", ""):
        table.add_column(name, justify="left" if name in ("arm", "layout", "status") else "right")
    for c in result.arms:
        status = f"PICK, {c.status}" if c.layout == summary.pick else c.status
        table.add_row(c.arm, c.layout, ms(c.measured_ms), ms(c.simulated_ms), pct(c.error),
                      status, verdict[c.ok])  # fmt: skip
    console.print(table)
    top = "; ".join(f"{i}. {c.layout} {c.mean_ms:,.1f} ms" for i, c in enumerate(result.own_top, 1))
    console.print(f"planner on the own costs, top {TOP}: {top}", highlight=False, markup=False)
    pick = result.pick
    also = "" if pick.measured_gap is None else f", measured {pct(pick.measured_gap)} in the A/B"
    console.print(
        f"1. pick: the A/B picks {pick.ab_pick} ({summary.pick_source}), which {pick.says()} "
        f"({pick.own_pick}): own-costs simulated {pct(pick.simulated_gap)}{also} "
        f"{verdict[passes['pick']]}",
        highlight=False,
    )
    for a in summary.arms:  # the A/B's own words on the two, a tie-break among them
        if a.layout in (pick.ab_pick, pick.own_pick) and pick.verdict != "equal":
            console.print(f"   {a.arm} {a.layout}: {a.reason}", highlight=False, markup=False)
    saved = "an unknown share" if result.saved is None else f"{result.saved:.1%}"
    errors = [abs(c.error) for c in result.arms if c.error is not None]
    worst = f", largest error {max(errors):.2%}" if errors else ""
    console.print(
        f"2. steps: {sum(c.ok for c in result.arms)} of {len(result.arms)} arms within "
        f"{TARGET_STEP:.0%}{worst} {verdict[passes['steps']]}",
        highlight=False,
    )
    console.print(
        f"3. GPU-seconds: {result.gpu_seconds_spent:,.0f} spent of {result.gpu_seconds_full:,.0f} "
        f"with every arm to its budget: {saved} saved (target at least "
        f"{TARGET_SAVED:.0%}) {verdict[passes['gpu_seconds']]}",
        highlight=False,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write every number to this file")
    parser.add_argument("--show-tune", action="store_true", help="print the tune's own output")
    args = parser.parse_args(argv)
    json_path = args.json.resolve() if args.json else None  # before the chdir below
    os.chdir(ROOT)  # the tune takes paths relative to the project, as make run does
    console = Console(width=max(shutil.get_terminal_size().columns, 150), soft_wrap=True)
    info = machine()
    console.print(f"machine: {info['cores']} usable cores ({info['cpu']}), load average "
                  f"{info['load_average']} (1 min) at the start", highlight=False)  # fmt: skip
    console.print(f"make run: python -m ray_layout.tune {' '.join(MAKE_RUN)}", highlight=False)
    work = Path(tempfile.mkdtemp(prefix="bench_quickstart-"))
    tune_console = console if args.show_tune else Console(file=io.StringIO(), width=150)
    started = time.monotonic()
    try:
        summary, recipe, settings = run_quickstart(work, tune_console)
    except RayLayoutError as exc:
        print(f"error: the quickstart's tune failed: {exc}".replace("\n", " "), file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(work, ignore_errors=True)
    wall_s = time.monotonic() - started
    load_end = load_average()
    result = against_own_costs(summary, recipe, settings)
    print_result(console, result, summary)
    console.print(f"wall time {wall_s:.0f} s (cluster start to report); load average "
                  f"{info['load_average']} before, {load_end} after", highlight=False)  # fmt: skip
    if json_path:
        payload = {
            "machine": info,
            "load_average_end": load_end,
            "wall_s": wall_s,
            "command": ["python", "-m", "ray_layout.tune", *MAKE_RUN],
            "arms": [asdict(c) for c in result.arms],
            "own_costs_top": [{"layout": str(c.layout), "mean_ms": c.mean_ms}
                              for c in result.own_top],
            "pick": asdict(result.pick),
            "gpu_seconds": {"spent": result.gpu_seconds_spent, "full": result.gpu_seconds_full,
                            "saved": result.saved},
            "targets": result.passes(),
        }  # fmt: skip
        json_path.write_text(json.dumps(payload, indent=2) + "\n")
        console.print(f"wrote {json_path}", highlight=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
