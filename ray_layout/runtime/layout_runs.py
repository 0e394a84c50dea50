"""Profiling runs on a Ray cluster, real or emulated, straight into the cost store.

One path for both backends: the same ``pretrain_gpt.py`` argument list
(``launchers.megatron.megatron_arguments``) runs either Megatron-LM's script from a checkout or
``launchers.emulated_megatron`` with a hardware profile; ``ray_layout.runtime.runs`` places and
watches the ranks.  Each rank's output comes back through Ray parsed on its node; the driver
stores the run (the last rank's timers and iterations, every rank's memory lines) under an id
digesting every rank's log, with the cluster run's attempt id as its ``source``.
"""

from __future__ import annotations

import hashlib
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from launchers.emulated.environment import NODE_ENV, PROFILE_ENV
from launchers.megatron import (
    MegatronRunSettings,
    megatron_arguments,
    megatron_command,
    rank_environment,
)
from ray_layout.errors import ConfigError, MeasurementError
from ray_layout.measure.declared import check_log
from ray_layout.measure.ingest import Ingested, run_rows
from ray_layout.measure.store import CostStore
from ray_layout.model.layout import Layout
from ray_layout.model.memory_settings import MemorySettings, with_recompute
from ray_layout.model.spec import Recipe
from ray_layout.runtime.failures import CANCELLED, FINISHED, STOPPED
from ray_layout.runtime.outputs import run_log
from ray_layout.runtime.placement import RankEnv
from ray_layout.runtime.policy import RunPolicy
from ray_layout.runtime.run_spec import (
    RunResult,
    RunSpec,
    Watch,
    attempt_id,
    attempt_number,
    log_paths,
)
from ray_layout.runtime.runs import run_many

PROJECT_ROOT = Path(__file__).resolve().parents[2]
EMULATED = "emulated"
MEGATRON = "megatron"
MEGATRON_CORE = "megatron-core"  # megatron-core's own model and schedule on CPU ranks
BACKENDS = (MEGATRON, EMULATED, MEGATRON_CORE)
EMULATOR = "launchers.emulated_megatron"


@dataclass(frozen=True)
class Backend:
    """What a rank runs: Megatron-LM (``megatron_path``), the emulator (``hardware_profile``) or
    megatron-core's own GPTModel on the CPU (``hardware_profile`` for link times and HBM)."""

    name: str
    megatron_path: Path | None = None
    hardware_profile: Path | None = None
    python: str = sys.executable

    def __post_init__(self) -> None:
        if self.name == MEGATRON and self.megatron_path is None:
            raise ConfigError("the megatron backend needs --megatron-path (a Megatron-LM checkout)")
        if self.name in (EMULATED, MEGATRON_CORE) and self.hardware_profile is None:
            raise ConfigError(f"the {self.name} backend needs a hardware profile")
        if self.name not in BACKENDS:
            raise ConfigError(
                f"unknown backend {self.name!r}: use megatron, emulated or megatron-core"
            )

    @property
    def hardware(self) -> str:
        if self.name == MEGATRON_CORE:
            return "cpu"  # its times are CPU times, whatever profile gives its link times
        if self.name == EMULATED and self.hardware_profile is not None:
            return self.hardware_profile.stem
        return "gpu"

    def runs_at_once(self, given: int | None) -> int | None:
        """Runs side by side: as many as the user ``given``, else one for megatron-core, whose
        CPU times grow by a third when two runs share a node's cores; None: as many as fit."""
        return given or (1 if self.name == MEGATRON_CORE else None)


def rank_command(
    backend: Backend, recipe: Recipe, layout: Layout | None, settings: MegatronRunSettings
) -> tuple[list[str], dict[str, str]]:
    """The argv every rank runs and the environment the backend adds to it."""
    arguments = list(megatron_arguments(recipe, layout, settings).argv)
    if backend.name == MEGATRON:
        return megatron_command(backend.python, backend.megatron_path, arguments), {}
    profile = backend.hardware_profile.resolve()
    env = {PROFILE_ENV: str(profile), "PYTHONPATH": str(PROJECT_ROOT)}
    program = "launchers.megatron_core_rank" if backend.name == MEGATRON_CORE else EMULATOR
    return [backend.python, "-m", program, *arguments], env


def rank_env_of(recipe: Recipe, gpus_per_node: int) -> RankEnv:
    """Each rank's environment: Megatron's (CUDA_DEVICE_MAX_CONNECTIONS with TP or CP > 1, ...)
    over what the user's launch script exports, as ``megatron-command`` shows it; the cluster
    then sets the device variables itself.  Ranks fill nodes in order, ``gpus_per_node`` at a
    time (``ray_layout.runtime.placement.rank_order``)."""
    exported = dict(recipe.environment)

    def rank_env(rank: int, world: int, addr: str, port: int, gpus: list[int]) -> dict[str, str]:
        environment = rank_environment(rank, world, addr, port, gpus, recipe.parallel, exported)
        return environment | {NODE_ENV: str(rank // gpus_per_node)}

    return rank_env


def run_id(kind: str, command: Sequence[str], exported: Sequence[tuple[str, str]]) -> str:
    """A run's id: its kind and a digest of its command and the user's exports (a resumed tune
    finds it in the store; without exports the digest is the command's alone, as it always was)."""
    words = [*command, *(f"{name}={value}" for name, value in exported)]
    return f"{kind}-{hashlib.sha256(' '.join(words).encode()).hexdigest()[:12]}"


@dataclass(frozen=True)
class LayoutRun:
    """One layout to run: ``kind`` names the run ("profile", "ab") in its id and in the store's
    ``source`` column (``source`` overrides); ``watch`` follows it live (a ``Watch``);
    ``recompute`` is the recomputation it runs (None: the job's own flags)."""

    layout: Layout
    kind: str = "profile"
    source: str | None = None
    watch: Watch | None = None
    recompute: MemorySettings | None = None


@dataclass(frozen=True)
class ProfiledRun:
    layout: Layout
    result: RunResult
    ingested: Ingested | None  # None when the run left nothing to store
    resumed: bool = False  # the store already held this run's outcome; nothing ran now
    not_ingested: str | None = None  # why a finished or stopped run's output was not stored


@dataclass(frozen=True)
class RunOptions:
    """How every run of one batch is built, placed and watched: ``policy`` goes whole into each
    run's :class:`RunSpec`."""

    gpus_per_node: int
    settings: MegatronRunSettings = field(default_factory=MegatronRunSettings)
    policy: RunPolicy = field(default_factory=RunPolicy)
    max_parallel: int | None = None  # runs at once; None: as many as wait for room together
    resume: bool = True  # reuse a run the store already holds an outcome of (not cancelled)


INGESTED_STATUSES = frozenset({FINISHED, STOPPED})  # runs whose logs hold steady iterations


def run_layouts(
    recipe: Recipe,
    runs: Sequence[LayoutRun],
    *,
    backend: Backend,
    store: CostStore,
    study: str,
    log_dir: Path | None,
    options: RunOptions,
    cancel: threading.Event | None = None,
    on_resumed: Callable[[int, ProfiledRun], None] = lambda index, run: None,
) -> list[ProfiledRun]:
    """Run every layout side by side where the cluster has room, then ingest each run that
    finished or was stopped early (every attempt is in the store's ``runs`` table either way).

    A run's id is a digest of its command, so the same run asked for again (a resumed tune) is
    found in the store and not run twice: ``on_resumed`` hears of each such run (by its index
    in ``runs``) before any new run starts."""
    specs, run_recipes, todo, profiled = [], [], [], {}

    def ingested(index: int, result: RunResult, resumed: bool = False) -> ProfiledRun:
        return _ingested(
            store,
            result,
            study=study,
            recipe=recipe,
            layout=runs[index].layout,
            run_recipe=run_recipes[index],
            resumed=resumed,
        )

    for index, run in enumerate(runs):
        layout = run.layout
        run_recipe = recompute_recipe(layout_recipe(recipe, layout), run.recompute)
        command, env = rank_command(backend, run_recipe, layout, options.settings)
        spec = RunSpec(
            run_id=run_id(run.kind, command, recipe.environment),
            study=study,
            command=command,
            parallel=run_recipe.parallel,
            gpus_per_node=options.gpus_per_node,
            log_dir=log_dir,
            env=env,
            policy=options.policy,
            labels={
                "model": recipe.model.name,
                "layout": str(layout),
                "backend": backend.name,
                "hardware": backend.hardware,
                "source": run.source or run.kind,
            },
        )
        run_recipes.append(run_recipe)
        done = stored_outcome(store, spec) if options.resume else None
        if done is not None:
            profiled[index] = ingested(index, done, resumed=True)
            continue
        specs.append(spec)
        todo.append(index)

    rank_env = rank_env_of(recipe, options.gpus_per_node)
    for index, resumed in sorted(profiled.items()):
        on_resumed(index, resumed)
    watches = [runs[index].watch for index in todo]
    results = run_many(
        specs,
        store=store,
        rank_env=rank_env,
        max_parallel=backend.runs_at_once(options.max_parallel),
        watches=watches,
        cancel=cancel,
    )
    for index, result in zip(todo, results, strict=True):
        profiled[index] = ingested(index, result)
    return [profiled[index] for index in range(len(runs))]


def layout_recipe(recipe: Recipe, layout: Layout) -> Recipe:
    """The recipe as a run of ``layout`` has it: the layout's PP and VPP."""
    return replace(recipe, parallel=replace(recipe.parallel, pp=layout.pp, vpp=layout.vpp))


def recompute_recipe(recipe: Recipe, settings: MemorySettings | None) -> Recipe:
    """The recipe running ``settings``' recomputation: its Megatron flags rewritten where the
    recomputation differs from the job's own, so the ranks' command lines carry it (and the
    run's id changes with them); the job's own, or None, leaves the flags as the user wrote them."""
    if settings is None or settings.recompute_flags() == recipe.flags.memory.recompute_flags():
        return recipe
    return replace(recipe, megatron_args=with_recompute(recipe.megatron_args, settings))


def stored_outcome(store: CostStore, spec: RunSpec) -> RunResult | None:
    """The last attempt of this run the store holds, unless there is none, it was cancelled, or
    it ended with output to store that the store does not hold (run it again)."""
    rows = store.read("runs", study=spec.study)
    if rows.empty:
        return None
    mine = rows[
        rows.run_id.isin(
            [attempt_id(spec.run_id, n) for n in range(1, 2 + spec.policy.max_retries)]
        )
    ]
    if mine.empty:
        return None
    last = mine.sort_values("finished_at").iloc[-1]
    attempt = last.run_id
    if last.status == CANCELLED or (
        last.status in INGESTED_STATUSES and not (rows.source == attempt).any()
    ):
        return None
    return RunResult(
        run_id=attempt,
        status=last.status,
        failure_class=None if last.failure_class is None else str(last.failure_class),
        returncodes=[None] * spec.parallel.world_size,
        log_paths=log_paths(spec, attempt),
        attempts=attempt_number(spec.run_id, attempt),
        error=None if last.error is None else str(last.error),
    )


def _ingested(
    store: CostStore,
    result: RunResult,
    *,
    study: str,
    recipe: Recipe,
    layout: Layout,
    run_recipe: Recipe,
    resumed: bool = False,
) -> ProfiledRun:
    """Store what the ranks sent back (storing is idempotent); a resumed run is found by its
    attempt id.  Output that cannot be stored leaves this run alone not ingested, with why."""
    if result.status not in INGESTED_STATUSES:
        return ProfiledRun(layout, result, None, resumed)
    if resumed:  # stored_outcome found the stored output under the attempt id
        rows = store.read("runs", study=study, source=result.run_id)
        return ProfiledRun(layout, result, Ingested(str(rows.run_id.iloc[-1]), False, 0, 0), True)
    try:
        text, parsed = run_log(result.outputs)
        checked = check_log(
            parsed, layout, run_recipe.parallel, None, result.run_id, model=recipe.model
        )
        row, tables = run_rows(recipe.model, checked, text, result.run_id, study)
        stored = store.write_run(row, tables, study)
    except (ConfigError, MeasurementError) as exc:
        return ProfiledRun(layout, result, None, resumed, f"{result.run_id}: {exc}")
    ingested = Ingested(
        row["run_id"],
        stored,
        len(tables["timers"]),
        parsed.skipped_lines,
        parsed.skipped_examples,
        checked.notes,
    )
    return ProfiledRun(layout, result, ingested, resumed)
