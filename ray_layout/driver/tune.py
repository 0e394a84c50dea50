"""``python -m ray_layout.tune``: one job from a model config to the layout flag to paste.

The recipe, as data flowing (docs/design.md)::

    size ─► profile runs ─► fit ─► search ─► live A/B ─► refit ─► report

Runs as a plain command (it starts an embedded local cluster of simulated GPU nodes) or as a Ray
job (``ray job submit -- python -m ray_layout.tune ...``: it joins ``RAY_ADDRESS``).  Everything
measured goes to the cost store under the study id, so running the same command again resumes:
finished profiling runs and A/B arms are read back, not run again.  Ctrl-C (or SIGTERM, as
``ray job stop`` sends) stops every run, releases its GPUs, and exits 130.
"""

from __future__ import annotations

import hashlib
import math
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from launchers.megatron import ProfileSettings
from ray_layout.ab.live import (
    Arm,
    ArmResult,
    LiveTest,
    arm_runs,
    memory_per_stage,
    stored_steps,
    test_id,
    write_decisions,
)
from ray_layout.ab.stats import ABConfig, Decision, arm_stats, gpu_seconds, steady_steps
from ray_layout.commands.cli import FLOPS_TFLOPS
from ray_layout.errors import ConfigError, RunFailure
from ray_layout.measure.fit import FitResult, fit_costs, profile_design
from ray_layout.measure.ingest import observations_from_store, record_fit
from ray_layout.measure.store import CostStore
from ray_layout.model.costs import UnitCosts, costs_from_flops
from ray_layout.model.layout import Layout
from ray_layout.model.sizing import parameter_count
from ray_layout.model.spec import Recipe
from ray_layout.report.tune_report import ArmOutcome, TuneSummary, print_summary, write_report
from ray_layout.runtime.cluster import FINISHED, STOPPED, Watch
from ray_layout.runtime.profiling import Backend, LayoutRun, ProfiledRun, RunOptions, run_layouts
from search.planner import Plan, PlanOptions, SearchSpec, plan, score_given, simulate_given
from search.space import LayoutSpace

DEFAULT_HARDWARE = "cluster_configs/hardware/h200_emulated.yaml"
ROLES = {"default": "Megatron default", "count-based": "count-based rule"}
ROLE_JOIN = " + "  # an arm that is several things at once: "candidate + Megatron default"
PHASES = ("size", "profile", "fit", "search", "A/B", "refit", "report")
SHARD_ABOVE, MAX_SHARDS = 200_000, 8  # layouts a process searches alone; Ray tasks at most


@dataclass(frozen=True)
class TuneSettings:
    """Everything the tune needs besides the recipe."""

    backend: Backend
    store: Path
    study: str
    log_dir: Path
    report_dir: Path
    gpus_per_node: int
    ab: ABConfig
    ab_top: int = 3
    profile_iters: int = 10
    hbm_gib: float | None = None
    timeout_s: float = 3600.0
    heartbeat_s: float = 900.0
    samples: int = 256
    seed: int = 0
    allow_standalone_mtp: bool = False
    runs_at_once: int | None = None  # None: as many as the cluster has room for


class Phases:
    """A bar per phase and per run on a terminal; plain lines in a job log."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.seconds: dict[str, float] = {}

    @contextmanager
    def phase(self, name: str, what: str) -> Iterator[None]:
        step = f"[{PHASES.index(name) + 1}/{len(PHASES)}]"
        self.console.print(f"{step} [bold]{name}[/bold]: {what}", highlight=False)
        started = time.monotonic()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.monotonic() - started

    def say(self, text: str) -> None:
        self.console.print(f"  {text}", highlight=False, markup=False)

    @contextmanager
    def bars(self) -> Iterator[Bars]:
        live = self.console.is_terminal
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn())  # fmt: skip
        with Progress(*columns, console=self.console, disable=not live) as progress:
            yield Bars(progress, None if live else self)


class Bars:
    """Progress of several runs: bars on a terminal, else a line every ``LOG_EVERY`` steps."""

    LOG_EVERY = 10

    def __init__(self, progress: Progress, log: Phases | None) -> None:
        self._progress, self._log = progress, log
        self._lock = threading.Lock()
        self._logged: dict[int, int] = {}

    def add(self, description: str, total: int) -> int:
        return self._progress.add_task(description, total=total)

    def update(self, task: int, completed: int, note: str = "") -> None:
        """Called from run threads as iterations come in."""
        self._progress.update(task, completed=completed)
        if self._log is None:
            return
        with self._lock:
            last = self._logged.get(task, 0)
            total = int(self._progress.tasks[task].total or 0)
            due = completed // self.LOG_EVERY > last // self.LOG_EVERY or completed >= total
            if (due and completed > last) or note:
                self._logged[task] = completed
                name = self._progress.tasks[task].description
                self._log.say(f"{name}: iteration {completed}/{total} {note}".rstrip())


def study_id(recipe: Recipe, backend: Backend) -> str:
    """A readable id that changes with anything that changes the measurements."""
    text = repr((recipe.model, recipe.parallel, backend.name, backend.hardware))
    return (
        f"{recipe.model.name}-pp{recipe.parallel.pp}-"
        + hashlib.sha256(text.encode()).hexdigest()[:8]
    )


def _run_watch(bars: Bars, task: int) -> Watch:
    seen = 0

    def see(attempt: str, lines: list[str]) -> None:
        nonlocal seen
        seen += len(lines)
        if lines:
            bars.update(task, seen)

    return see


def profile(
    recipe: Recipe,
    settings: TuneSettings,
    store: CostStore,
    phases: Phases,
    cancel: threading.Event,
) -> list[ProfiledRun]:
    """The fewest runs that identify every unit's cost (fit.profile_design), on the cluster."""
    parallel = recipe.parallel
    guess = costs_from_flops(recipe.model, replace(parallel, vpp=1), FLOPS_TFLOPS)
    design = profile_design(
        recipe.model,
        parallel,
        parallel.num_microbatches_or_none,
        guess,
        hbm_gib=settings.hbm_gib,
        standalone_mtp=False,
    )
    options = RunOptions(
        gpus_per_node=settings.gpus_per_node,
        settings=ProfileSettings(train_iters=settings.profile_iters),
        timeout_s=settings.timeout_s,
        heartbeat_s=settings.heartbeat_s,
        max_parallel=settings.runs_at_once,
    )
    with phases.bars() as bars:
        tasks = [bars.add(f"profile {layout}", settings.profile_iters) for layout in design.layouts]
        runs = [
            LayoutRun(layout, watch=_run_watch(bars, task))
            for layout, task in zip(design.layouts, tasks, strict=True)
        ]

        def resumed(index: int, run: ProfiledRun) -> None:
            bars.update(tasks[index], settings.profile_iters, "(from the store)")

        done = run_layouts(
            recipe,
            runs,
            settings.backend,
            store,
            settings.study,
            settings.log_dir,
            options,
            cancel,
            resumed,
        )
    for run in done:
        phases.say(
            f"{run.layout}: {run.result.status}" + (" (from the store)" if run.resumed else "")
        )
    failed = [run for run in done if run.ingested is None]
    if failed:
        first = failed[0].result
        raise RunFailure(
            f"profiling run {failed[0].layout} {first.status} "
            f"({first.failure_class}: {first.error}); logs under {settings.log_dir}"
        )
    return done


def fit(
    recipe: Recipe, store: CostStore, study: str, run_ids: Sequence[str], gpus_per_node: int
) -> FitResult:
    """Fit unit costs from these stored runs (and record the fit in the store)."""
    observations = [
        o
        for o in observations_from_store(store, study, recipe.model, recipe.parallel)
        if o.name in set(run_ids)
    ]
    result = fit_costs(recipe.model, recipe.parallel, observations, gpus_per_node=gpus_per_node)
    record_fit(store, study, result, [o.name for o in observations])
    return result


def search(
    recipe: Recipe, costs: UnitCosts, settings: TuneSettings, cpus: int = 1
) -> tuple[Plan, SearchSpec, PlanOptions]:
    """Every layout, simulated; spaces over ``SHARD_ABOVE`` layouts are split over up to
    ``cpus`` Ray tasks (the same top as one process, tested in tests/test_planner.py)."""
    model, parallel = recipe.model, recipe.parallel
    space = LayoutSpace(model.num_layers, model.mtp_num_layers, parallel.pp, parallel.vpp,
                        allow_standalone_mtp=settings.allow_standalone_mtp)  # fmt: skip
    shards = min(MAX_SHARDS, cpus) if space.count().total > SHARD_ABOVE else 1
    spec = SearchSpec(
        num_microbatches=parallel.num_microbatches_or_none,
        allow_standalone_mtp=settings.allow_standalone_mtp,
        shards=max(shards, 1),
    )
    options = PlanOptions(
        top=max(10, settings.ab_top),
        samples=settings.samples,
        seed=settings.seed,
        hbm_gib=settings.hbm_gib,
    )
    return plan(recipe.model, recipe.parallel, costs, spec, options), spec, options


def choose_arms(found: Plan, top: int) -> list[Arm]:
    """The top ``top`` layouts that fit, then the two baselines, each layout once: a baseline the
    search also ranked on top keeps its candidate name and adds its role ("candidate + count-based
    rule"), so the report still finds it."""
    arms: list[Arm] = []
    fitting = [c for c in found.candidates if c.fits][:top]
    for index, c in enumerate(fitting, 1):
        layout = Layout.parse(c.layout, c.pp)
        arms.append(Arm(f"candidate-{index}", layout, "candidate", c.mean_ms, c.memory_gib))
    for name, baseline in zip(("default", "count-based"), found.baselines, strict=True):
        c = baseline.candidate
        if c is None:
            continue
        layout = Layout.parse(c.layout, c.pp)
        same = next((i for i, arm in enumerate(arms) if arm.layout == layout), None)
        if same is None:
            arms.append(Arm(name, layout, ROLES[name], c.mean_ms, c.memory_gib))
        else:
            arms[same] = replace(arms[same], role=f"{arms[same].role}{ROLE_JOIN}{ROLES[name]}")
    return arms


def ab_test(
    recipe: Recipe,
    arms: Sequence[Arm],
    settings: TuneSettings,
    store: CostStore,
    phases: Phases,
    cancel: threading.Event,
) -> tuple[list[ArmResult], list, str]:
    """Run the arms live with early stopping; returns their results, the decisions, the test id."""
    config = settings.ab
    key = test_id(arms, config, repr((recipe.model, recipe.parallel, settings.backend.hardware)))
    world = recipe.parallel.world_size
    total_gpus = _cluster_gpus()
    at_once = max(1, min(total_gpus // world, settings.runs_at_once or total_gpus))
    phases.say(
        f"{len(arms)} arms of {world} GPUs, {min(at_once, len(arms))} at a time, "
        f"{config.max_iterations} iterations at most each (test {key})"
    )
    options = RunOptions(
        gpus_per_node=settings.gpus_per_node,
        settings=ProfileSettings(train_iters=config.max_iterations),
        timeout_s=settings.timeout_s,
        heartbeat_s=settings.heartbeat_s,
        max_retries=0,
        placement_timeout_s=settings.timeout_s * (1 + len(arms)),
        max_parallel=at_once,
    )
    with phases.bars() as bars:
        tasks = {arm.name: bars.add(f"{arm.name} {arm.layout}", config.max_iterations)
                 for arm in arms}  # fmt: skip
        test = LiveTest(arms, config, settings.hbm_gib,
                        lambda arm, steps: bars.update(tasks[arm], steps))  # fmt: skip
        runs = arm_runs(test, key)

        def resumed(index: int, run: ProfiledRun) -> None:
            arm = arms[index]
            steps = stored_steps(store, settings.study, run.ingested.run_id) if run.ingested else []
            failure = None if run.result.status in (FINISHED, STOPPED) else run.result.failure_class
            stopped = run.result.error if run.result.status == STOPPED else None
            test.preload(arm.name, steps, failure or None, stopped)
            bars.update(tasks[arm.name], len(steps), "(from the store)")

        try:
            done = run_layouts(
                recipe,
                runs,
                settings.backend,
                store,
                settings.study,
                settings.log_dir,
                options,
                cancel,
                resumed,
            )
        except BaseException:  # interrupted: keep what was decided (run ids come on resume)
            write_decisions(store, settings.study, key, test.decisions(), {})
            raise
    results = []
    for arm, run in zip(arms, done, strict=True):
        memory = None
        if run.ingested:
            memory = memory_per_stage(store, settings.study, run.ingested.run_id, arm.layout.pp)
        test.end(arm.name, run, memory or None)
        results.append(
            ArmResult(arm, test.trace(arm.name), run, memory or None, test.cost(arm.name, world))
        )
    decisions = test.finish()
    run_ids = {r.arm.name: r.run.ingested.run_id for r in results if r.run and r.run.ingested}
    write_decisions(store, settings.study, key, decisions, run_ids)
    fate = fates(decisions)
    for r in results:
        verdict = fate.get(r.arm.name)
        said = f"{verdict.action}: {verdict.reason}" if verdict else "no decision"
        phases.say(f"{r.arm.name} {r.arm.layout}: {len(r.trace.steps_ms)} iterations, {said}")
    return results, decisions, key


def fates(decisions: Sequence[Decision]) -> dict[str, Decision]:
    """Each arm's last decision: decisions come in the order they were made."""
    return {d.arm: d for d in decisions}


def _cluster_cpus() -> int:
    import ray

    return int(ray.cluster_resources().get("CPU", 1)) if ray.is_initialized() else 1


def _cluster_gpus() -> int:
    import ray

    return int(ray.cluster_resources().get("GPU", 0))


def refit(
    recipe: Recipe,
    store: CostStore,
    study: str,
    profiled: Sequence[ProfiledRun],
    results: Sequence[ArmResult],
    gpus_per_node: int,
) -> FitResult | None:
    """Closing the loop: the profiling runs and every A/B run that got far enough, fitted
    together; the next plan of this study starts from it."""
    run_ids = [r.ingested.run_id for r in profiled if r.ingested]
    extra = [r.run.ingested.run_id for r in results if r.run and r.run.ingested]
    if not extra:
        return None
    try:
        return fit(recipe, store, study, run_ids + extra, gpus_per_node)
    except ConfigError:
        return None  # an A/B run too short to fit adds nothing; the first fit stands


def outcomes(
    results: Sequence[ArmResult], decisions: Sequence, config: ABConfig
) -> tuple[ArmOutcome, ...]:
    """What the report shows of each arm."""
    final = fates(decisions)
    rows = []
    for r in results:
        values = steady_steps(r.trace, config)
        stats = arm_stats(values, config) if len(values) else None
        decision = final.get(r.arm.name)
        if r.run is None:
            status, reason = "not run", "the test ended before its turn"
        elif r.trace.failure:
            status, reason = "failed", decision.reason if decision else r.trace.failure
        elif decision is None:
            status, reason = "finished", "no decision"
        else:
            status = {"win": "won", "lose": "lost", "stop": "stopped"}.get(
                decision.action, decision.action
            )
            reason = decision.reason
        measured = stats.mean_ms if stats and math.isfinite(stats.mean_ms) else None
        ci = None
        if stats and math.isfinite(stats.ci_low_ms):
            ci = (stats.ci_low_ms, stats.ci_high_ms)
        rows.append(
            ArmOutcome(
                arm=r.arm.name,
                layout=str(r.arm.layout),
                role=r.arm.role,
                predicted_ms=r.arm.predicted_ms,
                measured_ms=measured,
                ci_ms=ci,
                iterations=len(values),
                status=status,
                reason=reason,
                predicted_memory_gib=tuple(r.arm.predicted_memory_gib),
                measured_memory_gib=r.memory_gib,
                gpu_seconds=gpu_seconds([r.cost])[0],
                steps_ms=tuple(r.trace.steps_ms),
            )
        )
    return tuple(rows)


def paste_flags(layout: Layout) -> tuple[str, ...]:
    """What to add to the training command: the layout carries the VPP (Megatron derives the
    virtual stages from it)."""
    return (
        "--pipeline-model-parallel-size",
        str(layout.pp),
        "--pipeline-model-parallel-layout",
        str(layout),
    )


def run_tune(
    recipe: Recipe,
    settings: TuneSettings,
    config_path: str,
    console: Console,
    cancel: threading.Event,
) -> TuneSummary:
    """Size, profile, fit, search, A/B, refit and report (the module docstring)."""
    phases = Phases(console)
    store = CostStore(settings.store)
    model, parallel = recipe.model, recipe.parallel
    with phases.phase("size", f"{model.name} on PP={parallel.pp} VPP={parallel.vpp}"):
        count = parameter_count(model)
        phases.say(
            f"{count.total / 1e9:.2f}B parameters ({count.active / 1e9:.2f}B active, "
            f"MTP {count.mtp / 1e9:.2f}B); {parallel.world_size} GPUs per run "
            f"(TP {parallel.tp} x EP {parallel.ep} x DP {parallel.dp} x PP {parallel.pp}), "
            f"{parallel.num_microbatches_or_none} micro-batches; study {settings.study}"
        )
    with phases.phase("profile", f"profiling runs on the {settings.backend.name} backend"):
        profiled = profile(recipe, settings, store, phases, cancel)
    with phases.phase("fit", "per-unit costs from every rank's timers"):
        first = fit(
            recipe,
            store,
            settings.study,
            [r.ingested.run_id for r in profiled],
            settings.gpus_per_node,
        )
        costs = first.costs
        for unit in costs.forward_ms:
            phases.say(
                f"{unit}: forward {costs.forward_ms[unit]:.2f} ms, "
                f"backward {costs.backward_ms[unit]:.2f} ms"
            )
        phases.say(
            f"p2p per transfer {costs.p2p_intra_node_ms:.2f} ms in a node, "
            f"{costs.p2p_inter_node_ms:.2f} ms across (latency {first.p2p_latency_ms:.2f} ms "
            "fitted to the measured steps)"
        )
        for name, error in first.step_errors.items():
            phases.say(f"{name}: simulated step {error:+.1%} off the measured")
        for warning in first.warnings:
            phases.say(f"warning: {warning}")
    with phases.phase("search", "simulate every layout Megatron accepts"):
        started = time.monotonic()
        found, spec, options = search(recipe, costs, settings, _cluster_cpus())
        search_s = time.monotonic() - started
        where = f" on {spec.shards} Ray tasks" if spec.shards > 1 else ""
        phases.say(
            f"{found.scored:,} layouts simulated ({found.method}){where} in {search_s:.1f} s; "
            f"best {found.candidates[0].layout} at {found.candidates[0].mean_ms:,.1f} ms"
        )
    arms = choose_arms(found, settings.ab_top)
    results: list[ArmResult] = []
    decisions: list = []
    if settings.ab_top > 0:
        with phases.phase("A/B", "the top layouts and both baselines, live, early-stopped"):
            results, decisions, _ = ab_test(recipe, arms, settings, store, phases, cancel)
    winner = next(
        (r for r in results for d in decisions if d.action == "win" and d.arm == r.arm.name), None
    )
    pick = winner.arm.layout if winner else arms[0].layout
    notes = []
    with phases.phase("refit", "A/B runs added to the cost model"):
        refined = refit(recipe, store, settings.study, profiled, results, settings.gpus_per_node)
        if refined is not None:
            notes.append(_refit_note(recipe, refined.costs, results, spec, options, settings.ab))
            phases.say(notes[-1])
    if results and winner is None:
        notes.append("no arm won the A/B test (every arm failed?): the pick is the prediction")
    with phases.phase("report", f"to {settings.report_dir}"):
        timelines = {"pick": simulate_given(pick, model, parallel, costs, spec, options)}
        default = next((a for a in arms if a.name == "default"), None)
        if default is None:
            baseline = found.baselines[0].candidate
            default_layout = Layout.parse(baseline.layout, baseline.pp) if baseline else None
        else:
            default_layout = default.layout
        if default_layout is not None:
            timelines["Megatron default"] = simulate_given(
                default_layout, model, parallel, costs, spec, options
            )
        rows = outcomes(results, decisions, settings.ab) if results else _predicted_only(arms)
        profile_spent = sum(_profile_gpu_seconds(store, settings.study, profiled))
        spent, full = gpu_seconds([r.cost for r in results]) if results else (0.0, 0.0)
        summary = TuneSummary(
            model=model.name,
            config=config_path,
            study=settings.study,
            store=str(settings.store),
            backend=settings.backend.name,
            hardware=settings.backend.hardware,
            parallel={
                "pp": parallel.pp,
                "vpp": pick.vpp,
                "tp": parallel.tp,
                "ep": parallel.ep,
                "dp": parallel.dp,
                "micro_batch_size": parallel.micro_batch_size,
                "global_batch_size": parallel.global_batch_size or None,
                "num_microbatches": parallel.num_microbatches_or_none,
            },
            hbm_gib=settings.hbm_gib,
            pick=str(pick),
            flags=paste_flags(pick),
            pick_source="A/B test" if winner else "prediction (no A/B)",
            arms=rows,
            decisions=tuple(asdict(d) for d in decisions),
            timelines=timelines,
            unit_costs=costs,
            fit_warnings=tuple(first.warnings),
            search={
                "method": found.method,
                "valid_layouts": found.valid_layouts,
                "scored": found.scored,
                "seconds": round(search_s, 3),
            },
            gpu_seconds_spent=profile_spent + spent,
            gpu_seconds_full=profile_spent + full,
            phase_seconds=dict(phases.seconds),
            notes=tuple(notes),
        )
        files = write_report(summary, settings.report_dir)
    print_summary(summary, console, files)
    return summary


def _predicted_only(arms: Sequence[Arm]) -> tuple[ArmOutcome, ...]:
    return tuple(
        ArmOutcome(
            arm=a.name,
            layout=str(a.layout),
            role=a.role,
            predicted_ms=a.predicted_ms,
            measured_ms=None,
            ci_ms=None,
            iterations=0,
            status="not run",
            reason="--ab-top 0: no A/B test",
            predicted_memory_gib=a.predicted_memory_gib,
            measured_memory_gib=None,
            gpu_seconds=0.0,
        )
        for a in arms
    )


def _refit_note(
    recipe: Recipe,
    costs: UnitCosts,
    results: Sequence[ArmResult],
    spec: SearchSpec,
    options: PlanOptions,
    config: ABConfig,
) -> str:
    """How far the refined model's predictions are from what the A/B measured."""
    errors = []
    for r in results:
        values = steady_steps(r.trace, config)
        if len(values) and r.trace.failure is None:
            predicted = score_given(
                r.arm.layout, recipe.model, recipe.parallel, costs, spec, options
            ).mean_ms
            errors.append(abs(predicted / float(values.mean()) - 1))
    if not errors:
        return "refit: no arm measured"
    worst, mean = 100 * max(errors), 100 * sum(errors) / len(errors)
    return (
        f"refit with the A/B runs: the refined cost model is within {worst:.1f}% of every "
        f"measured arm (mean {mean:.1f}%); the next plan of this study uses it"
    )


def _profile_gpu_seconds(
    store: CostStore, study: str, profiled: Sequence[ProfiledRun]
) -> list[float]:
    """GPU-seconds of the profiling runs, from their attempt rows."""
    runs = store.read("runs", study=study)
    seconds = []
    for run in profiled:
        row = runs[runs.run_id == run.result.run_id]
        if len(row):
            wall = float(row.finished_at.iloc[-1] - row.started_at.iloc[-1])
            seconds.append(wall * len(run.result.log_paths))
    return seconds
