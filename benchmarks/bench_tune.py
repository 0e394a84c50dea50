"""The tune's end-to-end benchmark on the emulated cluster: does it pick the layout that is
really fastest, does it know how fast that layout is, and does early stopping save GPU time?

    python benchmarks/bench_tune.py                  # the full benchmark (about 9 min on 2 cores)
    python benchmarks/bench_tune.py --quick          # the tune's arms + 3 layouts (about 6 min)
    python benchmarks/bench_tune.py --json out.json  # also write every number as JSON
    python benchmarks/bench_tune.py --replay         # the A/B's spend by replay (seconds, no Ray)

Setup: the handbook recipe (configs/handbook_7b_a1b.yaml) on PP=2 x DP=2 x EP=2 = 4 GPUs per
run, global batch 32 (8 micro-batches), on an embedded local Ray cluster of 3 nodes x 4
simulated GPUs, every rank a CPU-emulated Megatron (launchers/emulated_megatron.py) sleeping
the costs of benchmarks/hardware/unseen_emulated.yaml, a hardware profile no test or config of
the project uses. The tune runs in process as ``python -m ray_layout.tune`` would (profiling
runs of 10 iterations, fit, search, a live A/B of the top 3 layouts and both baselines with
ABConfig's defaults: warm-up 3, batches of 5, looks at 3, 6, 12 and 24 batches, so at most 123
iterations an arm), into a fresh cost store.

Then every layout of the space (17: 16 layers + 1 MTP on PP=2, MTP-standalone layouts left out
as the tune leaves them out) is measured on its own: one run at a time (so no two runs share the
CPU cores), ``--train-iters`` 20, the mean step over the iterations after a warm-up of 3, read
from the cost store's ``iterations`` table.

Targets:

1. pick vs exhaustive: the pick's measured step within 1% of the best measured step;
2. prediction error of the pick: the tune's predicted step of its pick (the simulator under
   the fitted unit costs) within 2% of the pick's measured step (same run length as every
   other layout);
3. GPU-seconds: the whole tune (profiling + A/B) under half of profiling plus every A/B arm run
   to its budget (``TuneSummary.gpu_seconds_spent / gpu_seconds_full``).

``--quick`` measures only the tune's arms and three more layouts, 10 iterations each: target 1
is then against the best of those, not of every layout (the output says so).

``--replay`` measures target 3 without a cluster: many A/B tests replayed side by side on
synthetic arms shaped like the quickstart's (the pick, candidates 1% and 4% behind, the
count-based rule 17%, Megatron's default 40%; 1% AR(1) jitter), the first looks from predictions
equal to the true means, the costs of a run as this benchmark measured them on 2026-11-29.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import platform
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table
from scipy import signal

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from launchers.megatron import MegatronRunSettings  # noqa: E402
from ray_layout.ab.cost import ArmCost, gpu_seconds, replayed_iterations  # noqa: E402
from ray_layout.ab.decisions import winner  # noqa: E402
from ray_layout.ab.live import stored_steps  # noqa: E402
from ray_layout.ab.looks import Prediction, first_looks  # noqa: E402
from ray_layout.ab.replay import replay  # noqa: E402
from ray_layout.ab.stats import ABConfig, ArmTrace  # noqa: E402
from ray_layout.measure.store import CostStore  # noqa: E402
from ray_layout.model.layout import Layout  # noqa: E402
from ray_layout.model.loading import load_recipe  # noqa: E402
from ray_layout.model.spec import Recipe, with_parallel  # noqa: E402
from ray_layout.report.summary import TuneSummary  # noqa: E402
from ray_layout.runtime.layout_runs import Backend, LayoutRun, RunOptions, run_layouts  # noqa: E402
from ray_layout.runtime.policy import RunPolicy  # noqa: E402
from ray_layout.tuning.loop import run_tune  # noqa: E402
from ray_layout.tuning.settings import TuneOptions, TuneSettings, study_id  # noqa: E402
from search.planner import PlanOptions, Problem, SearchSpec, score_given  # noqa: E402, Problem
from search.space import LayoutSpace  # noqa: E402

CONFIG = "configs/handbook_7b_a1b.yaml"
HARDWARE = ROOT / "benchmarks" / "hardware" / "unseen_emulated.yaml"
PP, GLOBAL_BATCH = 2, 32
NODES, GPUS_PER_NODE = 3, 4
HBM_GIB = 131.0  # the planner's H200 safety margin (README); every layout here fits
AB_TOP, PROFILE_ITERS = 3, 10
WARMUP = 3  # iterations dropped from every exhaustive run
ITERS, QUICK_ITERS = 20, 10
QUICK_EXTRA = 3  # layouts measured besides the tune's arms with --quick
TARGET_PICK, TARGET_PREDICTION, TARGET_GPU = 0.01, 0.02, 0.5
AB = ABConfig()  # the tune's A/B: its defaults
# Emulated runs start in seconds and step in under one: a hung or stuck run ends in minutes
POLICY = RunPolicy(timeout_s=900.0, heartbeat_s=120.0)


# The replay's arms (step over the pick's) and costs: 4 GPUs a run, about 30 GPU-seconds of
# start-up a run, 3.65 s emulated steps at time_scale 0.1 (0.41 s of wall clock), about 500
# GPU-seconds of profiling, as the 2026-11-29 measurement below found them.
REPLAY_ARMS = {"candidate-1": 1.0, "candidate-2": 1.01, "candidate-3": 1.04,
               "default": 1.40, "count-based": 1.17}  # fmt: skip
REPLAY_WORLD, REPLAY_STARTUP_S, REPLAY_STEP_MS, REPLAY_PROFILE_GPU_S = 4, 7.5, 410.0, 500.0
REPLAY_CV, REPLAY_PHI = 0.01, 0.3  # step jitter and its lag-1 autocorrelation


@dataclass(frozen=True)
class ReplaySpend:
    """What replayed A/B tests spent, one entry per replay."""

    ratio: np.ndarray  # (profiling + A/B) over (profiling + every arm to its budget)
    ab_ratio: np.ndarray  # the A/B alone, start-up included
    pick_gap: np.ndarray  # the pick's true step over the best's, less 1
    iterations: dict[str, np.ndarray]  # per arm, warm-up included
    first_looks: dict[str, int]


def ar1_noise(rng: np.random.Generator, shape: tuple[int, ...], phi: float) -> np.ndarray:
    """Stationary AR(1) noise of unit variance along the last axis."""
    shocks = rng.standard_normal(shape)
    shocks[..., 0] /= math.sqrt(1 - phi**2)  # the first value alone has unit variance
    return signal.lfilter([math.sqrt(1 - phi**2)], [1.0, -phi], shocks, axis=-1)


def replay_spend(replays: int = 200, seed: int = 15, config: ABConfig = AB) -> ReplaySpend:
    """Replay ``replays`` A/B tests of REPLAY_ARMS side by side (ray_layout.ab.replay.replay)
    and count what each spent (ray_layout.ab.cost.replayed_iterations)."""
    names, ratios = list(REPLAY_ARMS), np.asarray(list(REPLAY_ARMS.values()))
    predictions = {arm: Prediction(REPLAY_STEP_MS * r, REPLAY_CV) for arm, r in REPLAY_ARMS.items()}
    early = first_looks(predictions, config)
    rng = np.random.default_rng(seed)
    noise = ar1_noise(rng, (replays, len(names), config.max_iterations), REPLAY_PHI)
    steps = REPLAY_STEP_MS * ratios[None, :, None] * (1 + REPLAY_CV * noise)
    spend, ab_only, gaps = [], [], []
    ran = {arm: [] for arm in names}
    for run in steps:
        traces = [ArmTrace(arm, arm, tuple(row.tolist()), headroom_gib=10.0, critical_stages=2)
                  for arm, row in zip(names, run, strict=True)]  # fmt: skip
        decisions = replay(traces, config, early)
        iterations = replayed_iterations(traces, decisions, config, early)
        costs = [ArmCost(REPLAY_WORLD, REPLAY_STARTUP_S, t.steps_ms[: iterations[t.arm]],
                         config.max_iterations) for t in traces]  # fmt: skip
        spent, full = gpu_seconds(costs)
        spend.append((REPLAY_PROFILE_GPU_S + spent) / (REPLAY_PROFILE_GPU_S + full))
        ab_only.append(spent / full)
        gaps.append(REPLAY_ARMS[winner(decisions).arm] - 1.0)
        for arm in names:
            ran[arm].append(iterations[arm])
    return ReplaySpend(np.asarray(spend), np.asarray(ab_only), np.asarray(gaps),
                       {arm: np.asarray(v) for arm, v in ran.items()}, early)  # fmt: skip


def print_replay(console: Console, result: ReplaySpend) -> None:
    ratio = result.ratio
    console.print(
        f"A/B spend by replay: {len(ratio)} tests of {len(REPLAY_ARMS)} arms side by side "
        f"(first looks sooner: {result.first_looks or 'none'})",
        highlight=False,
    )
    for arm, iterations in result.iterations.items():
        console.print(f"  {arm} ({REPLAY_ARMS[arm]:.2f}x): iterations run median "
                      f"{np.median(iterations):.0f}, 95th percentile "
                      f"{np.percentile(iterations, 95):.0f} of {AB.max_iterations}",
                      highlight=False)  # fmt: skip
    within = float(np.mean(result.pick_gap <= TARGET_PICK + 1e-12))
    console.print(
        f"GPU-seconds ratio (profiling + A/B over profiling + every arm to its budget): median "
        f"{np.median(ratio):.3f}, mean {np.mean(ratio):.3f}, 95th percentile "
        f"{np.percentile(ratio, 95):.3f} (target under {TARGET_GPU}); the A/B alone "
        f"{np.mean(result.ab_ratio):.3f}; pick within {TARGET_PICK:.0%} of the best in "
        f"{within:.1%} of the tests (largest gap {np.max(result.pick_gap):.1%})",
        highlight=False,
    )


@dataclass(frozen=True)
class Measured:
    """One layout measured on its own."""

    layout: str
    predicted_ms: float
    mean_ms: float | None  # None: the run failed or logged too few iterations
    std_ms: float | None
    iterations: int  # steady iterations averaged
    status: str
    wall_s: float
    gpu_seconds: float


def machine() -> dict:
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "cpu": model,
        "cores": usable,
        "load_average": load_average(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def load_average() -> float | None:
    """The 1-minute load average: other work on the machine slows every emulated rank."""
    return round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None


def tune_settings(
    recipe: Recipe, backend: Backend, workdir: Path, runs_at_once: int | None = None
) -> TuneSettings:
    return TuneSettings(
        backend=backend,
        store=workdir / "store",
        study=study_id(recipe, backend),
        log_dir=workdir / "logs",
        report_dir=workdir / "report",
        gpus_per_node=GPUS_PER_NODE,
        options=TuneOptions(
            ab=AB,
            ab_top=AB_TOP,
            profile_iters=PROFILE_ITERS,
            hbm_gib=HBM_GIB,
            policy=POLICY,
            runs_at_once=runs_at_once,
        ),
    )


def predictor(recipe: Recipe, summary: TuneSummary, settings: TuneSettings):
    """A layout's predicted mean step under the tune's fitted costs, scored as the tune's
    search scores it (same Monte Carlo samples and seed)."""
    spec = SearchSpec(
        num_microbatches=recipe.parallel.num_microbatches_or_none,
        allow_standalone_mtp=settings.options.allow_standalone_mtp,
    )
    options = PlanOptions(
        top=max(10, settings.options.ab_top),
        samples=settings.options.samples,
        seed=settings.options.seed,
        hbm_gib=settings.options.hbm_gib,
    )

    def predict(layout: Layout) -> float:
        candidate = score_given(layout, Problem.of(recipe, summary.unit_costs, spec, options))
        return float(candidate.mean_ms)

    return predict


def layouts_to_measure(every: list[Layout], summary: TuneSummary, quick: bool) -> list[Layout]:
    """Every layout; with ``quick`` the tune's arms and a few more spread over the space."""
    if not quick:
        return every
    arms = {a.layout for a in summary.arms}
    chosen = [layout for layout in every if str(layout) in arms]
    others = [layout for layout in every if str(layout) not in arms]
    picks = np.linspace(0, len(others) - 1, QUICK_EXTRA).round().astype(int) if others else []
    chosen += [others[i] for i in sorted(set(int(i) for i in picks))]
    return sorted(chosen, key=every.index)


def measure(
    recipe: Recipe,
    layouts: list[Layout],
    *,
    backend: Backend,
    settings: TuneSettings,
    iters: int,
    predict,
    console: Console,
) -> list[Measured]:
    """Each layout alone on the cluster, one after another, into its own study."""
    store = CostStore(settings.store)
    study = f"{settings.study}-exhaustive"
    options = RunOptions(
        gpus_per_node=GPUS_PER_NODE,
        settings=MegatronRunSettings(train_iters=iters),
        policy=settings.options.policy,
        max_parallel=1,
    )
    rows = []
    for index, layout in enumerate(layouts, 1):
        started = time.monotonic()
        (run,) = run_layouts(
            recipe,
            [LayoutRun(layout, kind="bench")],
            backend=backend,
            store=store,
            study=study,
            log_dir=settings.log_dir,
            options=options,
        )
        wall = time.monotonic() - started
        steps = stored_steps(store, study, run.ingested.run_id) if run.ingested else []
        steady = np.asarray(steps[WARMUP:], dtype=float)
        steady = steady[np.isfinite(steady)]
        ok = run.result.status == "finished" and len(steady) >= 2
        row = Measured(
            layout=str(layout),
            predicted_ms=predict(layout),
            mean_ms=float(steady.mean()) if ok else None,
            std_ms=float(steady.std(ddof=1)) if ok else None,
            iterations=len(steady),
            status=run.result.status if ok or run.result.status != "finished" else "too short",
            wall_s=wall,
            gpu_seconds=run_gpu_seconds(store, study, run.result.run_id, recipe),
        )
        rows.append(row)
        said = f"{row.mean_ms:,.1f} ms" if row.mean_ms is not None else row.status
        console.print(
            f"  [{index}/{len(layouts)}] {layout}: {said} ({wall:.1f} s)",
            highlight=False,
            markup=False,
        )
    return rows


def run_gpu_seconds(store: CostStore, study: str, run_id: str, recipe: Recipe) -> float:
    """Wall seconds of the run's attempt times its GPUs, as the tune counts profiling runs."""
    runs = store.read("runs", study=study)
    row = runs[runs.run_id == run_id]
    if not len(row):
        return 0.0
    wall = float(row.finished_at.iloc[-1] - row.started_at.iloc[-1])
    return wall * recipe.parallel.world_size


def targets(rows: list[Measured], summary: TuneSummary, exhaustive: bool) -> dict:
    measured = [r for r in rows if r.mean_ms is not None]
    best = min(measured, key=lambda r: r.mean_ms)
    pick = next(r for r in rows if r.layout == summary.pick)
    arm = next((a for a in summary.arms if a.layout == summary.pick), None)
    predicted = float(arm.predicted_ms if arm is not None else pick.predicted_ms)
    pick_gap = pick.mean_ms / best.mean_ms - 1 if pick.mean_ms is not None else math.inf
    error = predicted / pick.mean_ms - 1 if pick.mean_ms is not None else math.inf
    spent, full = float(summary.gpu_seconds_spent), float(summary.gpu_seconds_full)
    ratio = spent / full
    return {
        "pick_vs_best": {
            "pick": summary.pick,
            "pick_measured_ms": pick.mean_ms,
            "best": best.layout,
            "best_measured_ms": best.mean_ms,
            "gap": pick_gap,
            "target": TARGET_PICK,
            "pass": bool(pick_gap <= TARGET_PICK),
            "against": "every layout" if exhaustive else f"{len(measured)} layouts (--quick)",
        },
        "pick_prediction": {
            "predicted_ms": predicted,
            "measured_ms": pick.mean_ms,
            "error": error,
            "target": TARGET_PREDICTION,
            "pass": bool(abs(error) < TARGET_PREDICTION),
            "ab_measured_ms": None if arm is None else arm.measured_ms,
        },
        "gpu_seconds": {
            "spent": spent,
            "full": full,
            "ratio": ratio,
            "target": TARGET_GPU,
            "pass": bool(ratio < TARGET_GPU),
            **gpu_breakdown(summary),
        },
    }


def gpu_breakdown(summary: TuneSummary) -> dict:
    """Where the GPU-seconds went: profiling (in spent and full alike), the A/B alone, and the
    A/B's step time alone in emulated ms (what GPUs would see with start-up negligible: the
    emulator scales steps by time_scale but not a rank's start-up)."""
    ab_spent = float(sum(a.gpu_seconds for a in summary.arms))
    profiling = float(summary.gpu_seconds_spent) - ab_spent
    ab_full = float(summary.gpu_seconds_full) - profiling
    budget = AB.max_iterations
    steps_spent = steps_full = 0.0
    run = 0
    for a in summary.arms:
        steps = np.asarray(a.steps_ms, dtype=float)
        steps = steps[np.isfinite(steps)]
        if steps.size:
            steps_spent += float(steps.sum())
            steps_full += float(steps.mean()) * budget
            run += steps.size
    return {
        "profiling": profiling,
        "ab_spent": ab_spent,
        "ab_full": ab_full,
        "ab_ratio": ab_spent / ab_full if ab_full else math.nan,
        "ab_iterations": run,
        "ab_iterations_full": budget * sum(1 for a in summary.arms if len(a.steps_ms)),
        "ab_step_time_ratio": steps_spent / steps_full if steps_full else math.nan,
    }


def print_results(
    console: Console, rows: list[Measured], summary: TuneSummary, result: dict, info: dict
) -> None:
    arms = {a.layout: a for a in summary.arms}
    by_measured = sorted((r for r in rows if r.mean_ms is not None), key=lambda r: r.mean_ms)
    rank = {r.layout: i for i, r in enumerate(by_measured, 1)}
    by_predicted = sorted(rows, key=lambda r: r.predicted_ms)
    predicted_rank = {r.layout: i for i, r in enumerate(by_predicted, 1)}
    table = Table(
        title=f"Every layout measured alone ({info['iterations']} iterations, "
        f"mean after {WARMUP} warm-up)"
    )
    for name in ("layout", "predicted ms", "rank", "measured ms", "sd ms", "error", "rank", "tune"):
        table.add_column(name, justify="left" if name in ("layout", "tune") else "right")
    for r in rows:
        arm = arms.get(r.layout)
        role = "" if arm is None else f"{arm.arm} ({arm.status})"
        if r.layout == summary.pick:
            role = f"PICK, {role}"
        measured = f"{r.mean_ms:,.1f}" if r.mean_ms is not None else r.status
        table.add_row(
            r.layout,
            f"{r.predicted_ms:,.1f}",
            str(predicted_rank[r.layout]),
            measured,
            f"{r.std_ms:.1f}" if r.std_ms is not None else "",
            f"{r.predicted_ms / r.mean_ms - 1:+.1%}" if r.mean_ms is not None else "",
            str(rank.get(r.layout, "")),
            role,
        )
    console.print(table)
    verdict = {True: "[green]PASS[/green]", False: "[red]MISS[/red]"}
    one, two, three = (result[k] for k in ("pick_vs_best", "pick_prediction", "gpu_seconds"))
    console.print(
        f"1. pick vs {one['against']}: {one['pick']} measured {one['pick_measured_ms']:,.1f} ms, "
        f"best {one['best']} {one['best_measured_ms']:,.1f} ms: {one['gap']:+.2%} "
        f"(target within {TARGET_PICK:.0%}) {verdict[one['pass']]}",
        highlight=False,
    )
    console.print(
        f"2. prediction of the pick: {two['predicted_ms']:,.1f} ms predicted, "
        f"{two['measured_ms']:,.1f} ms measured: {two['error']:+.2%} "
        f"(target under {TARGET_PREDICTION:.0%}) {verdict[two['pass']]}",
        highlight=False,
    )
    console.print(
        f"3. GPU-seconds: tune {three['spent']:,.1f} against {three['full']:,.1f} with every "
        f"A/B arm to its budget: {three['ratio']:.2f} (target under {TARGET_GPU}) "
        f"{verdict[three['pass']]}",
        highlight=False,
    )
    console.print(
        f"   of which profiling {three['profiling']:,.1f} (in both); the A/B alone "
        f"{three['ab_spent']:,.1f} of {three['ab_full']:,.1f} ({three['ab_ratio']:.2f}); "
        f"{three['ab_iterations']} of {three['ab_iterations_full']} arm iterations run, step "
        f"time alone (no start-up) {three['ab_step_time_ratio']:.2f} of the full budget's",
        highlight=False,
    )
    if two["ab_measured_ms"] is not None:
        console.print(
            f"   the pick's mean in the tune's own A/B (arms sharing the cores): "
            f"{two['ab_measured_ms']:,.1f} ms",
            highlight=False,
        )
    errors = [abs(r.predicted_ms / r.mean_ms - 1) for r in rows if r.mean_ms is not None]
    spent, wall = info["exhaustive_gpu_seconds"], info["exhaustive_wall_s"]
    console.print(
        f"   every measured layout: prediction error mean {np.mean(errors):.1%}, worst "
        f"{np.max(errors):.1%}; measuring them took {spent:,.0f} GPU-seconds ({wall:.0f} s), "
        f"the tune {three['spent']:,.0f} ({info['tune_wall_s']:.0f} s)",
        highlight=False,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"measure the tune's arms and a few more layouts, {QUICK_ITERS} iterations each",
    )
    parser.add_argument("--json", type=Path, help="write every number to this file")
    parser.add_argument(
        "--iters",
        type=int,
        help=f"iterations per measured layout (default {ITERS}, {QUICK_ITERS} with --quick)",
    )
    parser.add_argument(
        "--show-tune",
        action="store_true",
        help="print the tune's own output (default: its summary lines only)",
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep the work folder (store, logs, report)"
    )
    parser.add_argument(
        "--runs-at-once", type=int, help="the tune's runs side by side (default: as many as fit)"
    )
    parser.add_argument(
        "--replay", action="store_true", help="only the A/B's spend, by replay on synthetic arms"
    )
    args = parser.parse_args(argv)
    if args.replay:
        print_replay(Console(width=150), replay_spend())
        return 0
    if args.json:
        args.json = args.json.resolve()  # before the chdir below
    iters = args.iters or (QUICK_ITERS if args.quick else ITERS)
    if iters < WARMUP + 2:
        parser.error(f"--iters must be >= {WARMUP + 2}")

    os.chdir(ROOT)  # the tune and the launchers take paths relative to the project
    console = Console(width=max(shutil.get_terminal_size().columns, 150))
    info = {
        "machine": machine(),
        "iterations": iters,
        "quick": args.quick,
        "hardware_profile": str(HARDWARE.relative_to(ROOT)),
        "config": CONFIG,
        "pp": PP,
        "global_batch_size": GLOBAL_BATCH,
        "cluster": f"{NODES} nodes x {GPUS_PER_NODE} simulated GPUs",
    }
    m = info["machine"]
    console.print(
        f"machine: {m['cores']} usable cores ({m['cpu']}), load average {m['load_average']} "
        f"(1 min) at the start, Python {m['python']}; "
        f"cluster: {info['cluster']}",
        highlight=False,
    )

    recipe = with_parallel(load_recipe(CONFIG), pp=PP, global_batch_size=GLOBAL_BATCH)
    backend = Backend("emulated", hardware_profile=HARDWARE)
    workdir = Path(tempfile.mkdtemp(prefix="bench_tune-"))
    settings = tune_settings(recipe, backend, workdir, args.runs_at_once)
    every = list(LayoutSpace(recipe.model.num_layers, recipe.model.mtp_num_layers, PP))

    import ray

    from ray_layout.runtime.local import start_local_cluster

    started = time.monotonic()
    cluster = start_local_cluster(nodes=NODES, gpus_per_node=GPUS_PER_NODE)
    info["cluster_start_s"] = time.monotonic() - started
    tune_out = io.StringIO()
    tune_console = console if args.show_tune else Console(file=tune_out, width=150)
    try:
        console.print(
            f"[bold]tune[/bold]: {recipe.model.name} PP={PP} DP={recipe.parallel.dp} "
            f"EP={recipe.parallel.ep}, {len(every)} layouts; work folder {workdir}",
            highlight=False,
        )
        started = time.monotonic()
        summary = run_tune(recipe, settings, CONFIG, tune_console, threading.Event())
        info["tune_wall_s"] = time.monotonic() - started
        (workdir / "tune.log").write_text(tune_out.getvalue())
        console.print(
            f"  pick {summary.pick} ({summary.pick_source}) in {info['tune_wall_s']:.0f} s; "
            + ", ".join(f"{k} {v:.0f} s" for k, v in summary.phase_seconds.items()),
            highlight=False,
        )
        for arm in summary.arms:
            console.print(
                f"  {arm.arm} {arm.layout}: {arm.status}, {arm.iterations} steady "
                f"iterations, {arm.reason}",
                highlight=False,
                markup=False,
            )
        predict = predictor(recipe, summary, settings)
        chosen = layouts_to_measure(every, summary, args.quick)
        console.print(
            f"[bold]measure[/bold]: {len(chosen)} of {len(every)} layouts, one at a "
            f"time, {iters} iterations each",
            highlight=False,
        )
        started = time.monotonic()
        rows = measure(
            recipe,
            chosen,
            backend=backend,
            settings=settings,
            iters=iters,
            predict=predict,
            console=console,
        )
        info["exhaustive_wall_s"] = time.monotonic() - started
    finally:
        ray.shutdown()
        cluster.shutdown()
    info["exhaustive_gpu_seconds"] = sum(r.gpu_seconds for r in rows)
    info["load_average_end"] = load_average()
    result = targets(rows, summary, exhaustive=not args.quick)
    print_results(console, rows, summary, result, info)
    console.print(
        "note: each layout above ran alone; the tune's profiling runs and A/B arms ran up to "
        f"{NODES * GPUS_PER_NODE // recipe.parallel.world_size} arms at once on the same "
        f"{m['cores']} cores; load average {info['load_average_end']} at the end. Emulated "
        "ranks keep their steps against deadlines, so load lengthens the wall clock (start-up "
        "most), not the steps.",
        highlight=False,
    )
    if args.json:
        payload = {
            **info,
            "targets": result,
            "layouts": [r.__dict__ for r in rows],
            "tune": {
                "pick": summary.pick,
                "pick_source": summary.pick_source,
                "arms": [
                    {
                        "arm": a.arm,
                        "layout": a.layout,
                        "role": a.role,
                        "predicted_ms": a.predicted_ms,
                        "measured_ms": a.measured_ms,
                        "iterations": a.iterations,
                        "status": a.status,
                        "reason": a.reason,
                        "gpu_seconds": a.gpu_seconds,
                    }
                    for a in summary.arms
                ],
                "unit_costs": {
                    "forward_ms": dict(summary.unit_costs.forward_ms),
                    "backward_ms": dict(summary.unit_costs.backward_ms),
                    "p2p_intra_node_ms": summary.unit_costs.p2p_intra_node_ms,
                    "p2p_inter_node_ms": summary.unit_costs.p2p_inter_node_ms,
                },
                "phase_seconds": dict(summary.phase_seconds),
                "notes": list(summary.notes),
                "fit_warnings": list(summary.fit_warnings),
            },
        }
        args.json.write_text(json.dumps(payload, indent=2, default=str) + "\n")
        console.print(f"wrote {args.json}", highlight=False)
    if args.keep:
        console.print(f"kept {workdir}", highlight=False)
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
