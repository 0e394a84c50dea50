"""The tune's phases, each a function from what the phase before it found to what it finds:
profile (runs on the cluster), fit, search, the live A/B and the refit.  Ray and the store stay in
the phases that run or read something; choosing the arms is pure."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from launchers.emulated.hardware import load_profile
from launchers.megatron import (
    MegatronRunSettings,
    environment_notes,
    megatron_arguments,
)
from ray_layout.ab.live import (
    ABOutcome,
    Arm,
    ArmResult,
    LiveTest,
    arm_runs,
    memory_per_stage,
    stored_steps,
    test_id,
    write_decisions,
)
from ray_layout.ab.vocabulary import ArmRole
from ray_layout.errors import MeasurementError, RunFailure, exception_line
from ray_layout.measure.design import profile_design
from ray_layout.measure.fit import FitResult, fit_costs
from ray_layout.measure.ingest import observations_from_store, record_fit
from ray_layout.measure.store import CostStore
from ray_layout.model.costs import UnitCosts, costs_from_flops
from ray_layout.model.sizing import GIB
from ray_layout.model.spec import Recipe
from ray_layout.runtime.failures import FINISHED, STOPPED
from ray_layout.runtime.layout_runs import (
    MEGATRON_CORE,
    Backend,
    LayoutRun,
    ProfiledRun,
    RunOptions,
    layout_recipe,
    run_layouts,
)
from ray_layout.runtime.megatron_help_probe import ClusterFlags, cluster_flag_table
from ray_layout.runtime.sharding import ray_map_shards
from ray_layout.tuning.display import Phases
from ray_layout.tuning.recompute_choice import recompute_search
from ray_layout.tuning.settings import TuneSettings
from search.planner import Plan, PlanOptions, Problem, SearchSpec
from search.ranking import Candidate
from search.recompute_search import setting_name
from search.space import LayoutSpace

SHARD_ABOVE, MAX_SHARDS = 200_000, 8  # layouts a process searches alone; Ray tasks at most
P90_SDS = 1.2816  # a normal's 90th percentile in standard deviations above its mean


@dataclass(frozen=True)
class Searched:
    """The search's ranking and the settings it scored under (the report scores with them too);
    ``recompute`` says why it searched layout x recompute (empty: the job's own setting alone)."""

    found: Plan
    spec: SearchSpec
    options: PlanOptions
    seconds: float
    recompute: str = ""


@dataclass(frozen=True)
class LiveRuns:
    """What the phases that run ranks share: the recipe, the tune's settings (with the cluster's
    GPU memory filled in), the store the runs go to, the console and the user's cancel."""

    recipe: Recipe
    settings: TuneSettings
    store: CostStore
    phases: Phases
    cancel: threading.Event

    def run(
        self,
        runs: Sequence[LayoutRun],
        *,
        options: RunOptions,
        resumed: Callable[[int, ProfiledRun], None],
    ) -> list[ProfiledRun]:
        """``run_layouts`` with the tune's backend, study and log folder."""
        return run_layouts(
            self.recipe,
            runs,
            backend=self.settings.backend,
            store=self.store,
            study=self.settings.study,
            log_dir=self.settings.log_dir,
            options=options,
            cancel=self.cancel,
            on_resumed=resumed,
        )


def profile(live: LiveRuns, *, cluster_flags: ClusterFlags | None = None) -> list[ProfiledRun]:
    """The fewest runs that identify every unit's cost (``profile_design``), on the cluster;
    ``cluster_flags`` (the megatron backend's, read once by the tune) check the runs' argv."""
    recipe, settings, phases = live.recipe, live.settings, live.phases
    tune, parallel = settings.options, recipe.parallel
    guess = costs_from_flops(recipe.model, replace(parallel, vpp=1))
    design = profile_design(
        recipe.model,
        parallel,
        parallel.num_microbatches_or_none,
        guess,
        hbm_gib=tune.hbm_gib,
        standalone_mtp=False,
        settings=recipe.flags.memory,
    )
    options = RunOptions(
        gpus_per_node=settings.gpus_per_node,
        settings=MegatronRunSettings(train_iters=tune.profile_iters, profiling=True),
        policy=tune.policy,
        max_parallel=tune.runs_at_once,
    )
    first = design.layouts[0]
    arguments = megatron_arguments(layout_recipe(recipe, first), first, options.settings)
    for note in arguments.notes:
        phases.say(f"your Megatron flags: {note}")  # once: every run replaces the same ones
    for note in environment_notes(recipe):
        phases.say(f"your launch script: {note}")
    if cluster_flags is not None:
        cluster_flags.check([arguments.argv])
    with phases.bars() as bars:
        tasks = [bars.add(f"profile {layout}", tune.profile_iters) for layout in design.layouts]
        runs = [
            LayoutRun(layout, watch=bars.watch(task))
            for layout, task in zip(design.layouts, tasks, strict=True)
        ]

        def resumed(index: int, run: ProfiledRun) -> None:
            bars.update(tasks[index], tune.profile_iters, "(from the store)")

        done = live.run(runs, options=options, resumed=resumed)
    for run in done:
        from_store = " (from the store)" if run.resumed else ""
        phases.say(f"{run.layout}: {run.result.status}{from_store}")
    failed = [run for run in done if run.ingested is None]
    if failed:
        first = failed[0].result
        why = failed[0].not_ingested or f"{first.failure_class}: {first.error}"
        raise RunFailure(
            f"profiling run {failed[0].layout} {first.status} ({why}){_logs(settings)}"
        )
    return done


def check_cluster_flags(
    argvs: Sequence[Sequence[str]], settings: TuneSettings, store: CostStore, phases: Phases
) -> ClusterFlags:
    """Argument lists (a run's, the user's own flags) against the flag table of the Megatron the
    cluster runs, read once per study, before any run takes a GPU: a flag that Megatron does not
    know is a one-line error here.  The runs differ only in values the tuner writes, and in the
    user's split flags a run without a layout keeps, which the user's own list covers.  Returns
    the table, for the runs' own argument lists later."""
    flags = cluster_flag_table(settings.backend, store, settings.study)
    if flags.note:
        phases.say(flags.note)
    flags.check(argvs)
    return flags


def _logs(settings: TuneSettings) -> str:
    """Where the ranks' raw logs are, for a message that asks the user to look."""
    return f"; logs under {settings.log_dir}" if settings.log_dir else ""


def fit(
    recipe: Recipe, store: CostStore, *, study: str, run_ids: Sequence[str], gpus_per_node: int
) -> FitResult:
    """Fit unit costs from these stored runs (and record the fit in the store)."""
    wanted = set(run_ids)
    observations = [
        o
        for o in observations_from_store(store, study, recipe.model, recipe.parallel)
        if o.name in wanted
    ]
    result = fit_costs(
        recipe.model,
        recipe.parallel,
        observations,
        gpus_per_node=gpus_per_node,
        memory=recipe.flags.memory,  # calibrate under the job's memory flags
    )
    record_fit(store, study, result, [o.name for o in observations])
    return result


def first_fit(
    recipe: Recipe, store: CostStore, settings: TuneSettings, profiled: Sequence[ProfiledRun]
) -> FitResult:
    """The fit of the profiling runs alone.  Runs the tune made itself that cannot identify the
    units' costs leave it nothing to search with: a run failure, not bad input."""
    run_ids = [r.ingested.run_id for r in profiled if r.ingested]
    try:
        return fit(
            recipe,
            store,
            study=settings.study,
            run_ids=run_ids,
            gpus_per_node=settings.gpus_per_node,
        )
    except MeasurementError as exc:
        raise RunFailure(f"the profiling runs cannot be fitted: {exc}{_logs(settings)}") from exc


def search(
    recipe: Recipe,
    costs: UnitCosts,
    settings: TuneSettings,
    *,
    cpus: int = 1,
    progress: Callable[[str], None] | None = None,
) -> Searched:
    """Every layout, simulated (or the space searched exactly), under the job's own recompute
    setting or with every setting (``tuning.recompute_choice``); spaces over ``SHARD_ABOVE``
    layouts are split over up to ``cpus`` Ray tasks of the cluster the tune runs on (the same
    top as one process, tested in tests/runtime/test_sharding.py)."""
    model, parallel, tune = recipe.model, recipe.parallel, settings.options
    space = LayoutSpace.of(model, parallel, allow_standalone_mtp=tune.allow_standalone_mtp)
    shards = min(MAX_SHARDS, cpus) if space.count().total > SHARD_ABOVE else 1
    spec = SearchSpec(
        num_microbatches=parallel.num_microbatches_or_none,
        allow_standalone_mtp=tune.allow_standalone_mtp,
        shards=max(shards, 1),
    )
    options = PlanOptions(
        top=max(10, tune.ab_top),
        samples=tune.samples,
        seed=tune.seed,
        hbm_gib=tune.hbm_gib,
    )
    started = time.monotonic()
    map_shards = ray_map_shards if spec.shards > 1 else None
    problem = Problem.of(recipe, costs, spec, options)
    if settings.backend.name == MEGATRON_CORE:  # its CPU ranks run the experts without grouped
        # GEMM, where megatron-core refuses moe_act recompute: the search never offers it
        problem = replace(problem, memory=replace(problem.memory, grouped_gemm=False))
    found, why = recompute_search(problem, tune.recompute, progress, map_shards)
    return Searched(found, spec, options, time.monotonic() - started, why)


def _arm(name: str, c: Candidate, role: ArmRole) -> Arm:
    """An arm with the recompute flags it was simulated with and what the search predicted of
    it: its step, memory, critical stages (the tie-break's) and the spread of its step from the
    fitted jitter (its p90 over its mean)."""
    spread = (c.p90_ms - c.mean_ms) / (P90_SDS * c.mean_ms) if c.mean_ms > 0 else 0.0
    return Arm(
        name,
        c.layout,
        (role,),
        c.mean_ms,
        c.memory_gib,
        c.near_bottleneck,
        max(spread, 0.0),
        c.recompute,
    )


def choose_arms(found: Plan, top: int) -> list[Arm]:
    """The top ``top`` layouts that fit, each with the recompute setting it was ranked under,
    then the baselines under the job's own flags (the config's current layout where it has
    one, Megatron's default, the count-based rule), each pair of layout and setting once: one
    that is a candidate or an earlier baseline too keeps the first arm's name and adds its
    role, so the report still finds every baseline."""
    fitting = [c for c in found.candidates if c.fits][:top]
    arms = [_arm(f"candidate-{index}", c, ArmRole.CANDIDATE) for index, c in enumerate(fitting, 1)]
    for baseline in found.baselines:
        c, role = baseline.candidate, ArmRole.of(baseline.name)
        if c is None:
            continue
        pair = (c.layout, c.recompute)
        same = next((i for i, arm in enumerate(arms) if (arm.layout, arm.recompute) == pair), None)
        if same is None:
            arms.append(_arm(baseline.name.short, c, role))
        else:
            arms[same] = replace(arms[same], roles=(*arms[same].roles, role))
    return arms


def ab_test(live: LiveRuns, arms: Sequence[Arm], *, cluster_gpus: int) -> ABOutcome:
    """Run the arms live with early stopping, as many side by side as ``cluster_gpus`` holds.
    An arm is never retried (its steps would mix two runs), and it may wait for every arm
    before it to end before it gets its GPUs."""
    recipe, settings, store, phases = live.recipe, live.settings, live.store, live.phases
    tune = settings.options
    config, policy = tune.ab, tune.policy
    placement_s = max(policy.placement_timeout_s, policy.timeout_s * (1 + len(arms)))
    key = test_id(arms, config, repr((recipe.model, recipe.parallel, settings.backend.hardware)))
    world = recipe.parallel.world_size
    most = settings.backend.runs_at_once(tune.runs_at_once) or cluster_gpus
    at_once = max(1, min(cluster_gpus // world, most))
    phases.say(
        f"{len(arms)} arms of {world} GPUs, {min(at_once, len(arms))} at a time, "
        f"{config.max_iterations} iterations at most each (test {key})"
    )
    options = RunOptions(
        gpus_per_node=settings.gpus_per_node,
        settings=MegatronRunSettings(train_iters=config.max_iterations),
        policy=replace(policy, max_retries=0, placement_timeout_s=placement_s),
        max_parallel=at_once,
    )
    with phases.bars() as bars:
        job = recipe.flags.memory.recompute_flags()
        tasks = {arm.name: bars.add(arm_label(arm, job), config.max_iterations) for arm in arms}
        test = LiveTest(
            arms, config, tune.hbm_gib, lambda arm, steps: bars.update(tasks[arm], steps)
        )
        if test.first_looks:
            early = ", ".join(f"{arm} after {batches}" for arm, batches in test.first_looks.items())
            phases.say(f"predicted to lose by far, first look sooner (batches): {early}")
        runs = arm_runs(test, key)

        def resumed(index: int, run: ProfiledRun) -> None:
            arm = arms[index]
            steps = stored_steps(store, settings.study, run.ingested.run_id) if run.ingested else []
            failure = None if run.result.status in (FINISHED, STOPPED) else run.result.failure_class
            stopped = run.result.error if run.result.status == STOPPED else None
            test.preload(arm.name, steps, failure or None, stopped)
            bars.update(tasks[arm.name], len(steps), "(from the store)")

        try:
            done = live.run(runs, options=options, resumed=resumed)
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
    outcome = ABOutcome(key, tuple(results), tuple(test.finish()))
    run_ids = {r.arm.name: r.run.ingested.run_id for r in results if r.run and r.run.ingested}
    write_decisions(store, settings.study, key, outcome.decisions, run_ids)
    last = outcome.last_decisions
    for r in results:
        verdict = last.get(r.arm.name)
        said = f"{verdict.action}: {verdict.reason}" if verdict else "no decision"
        phases.say(f"{arm_label(r.arm, job)}: {len(r.trace.steps_ms)} iterations, {said}")
    return outcome


def arm_label(arm: Arm, job: tuple[str, ...]) -> str:
    """An arm as the console names it: its name and layout, and its recompute flags where they
    are not the job's own (``job``)."""
    label = f"{arm.name} {arm.layout}"
    return label if arm.recompute == job else f"{label} ({setting_name(arm.recompute)})"


def cluster_cpus() -> int:
    import ray

    return int(ray.cluster_resources().get("CPU", 1)) if ray.is_initialized() else 1


def cluster_gpus() -> int:
    import ray

    return int(ray.cluster_resources().get("GPU", 0))


PROBE_TIMEOUT_S = 300.0  # a probe waits for a free GPU; the cluster is idle before profiling


def cluster_hbm_gib(backend: Backend) -> tuple[float, str]:
    """The GPU memory the search must fit layouts in, taken from the cluster, never assumed:
    the emulated GPUs' from their hardware profile, a real GPU's by a probe on one worker.
    Returns (GiB, where it came from); raises :class:`RunFailure` when no GPU answers."""
    if backend.hardware_profile is not None:  # emulated GPUs, or the megatron-core CPU ranks
        return load_profile(backend.hardware_profile).hbm_gib, backend.hardware_profile.name
    import ray

    probe = ray.remote(num_gpus=1, num_cpus=0)(_gpu_memory_gib)
    try:
        return ray.get(probe.remote(), timeout=PROBE_TIMEOUT_S), "a GPU probed on a worker"
    except Exception as exc:
        raise RunFailure(
            f"cannot read the GPUs' memory on the cluster ({exception_line(exc)}); give --hbm-gb"
        ) from None


def _gpu_memory_gib() -> float:
    """Runs on a worker with one GPU: its total memory in GiB."""
    import torch

    return torch.cuda.get_device_properties(0).total_memory / GIB
