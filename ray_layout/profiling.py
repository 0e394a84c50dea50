"""Profiling runs on a Ray cluster, real or emulated, straight into the cost store.

One path for both backends: the same ``pretrain_gpt.py`` argument list
(``launchers.megatron.megatron_arguments``) runs either Megatron-LM's script from a checkout or
``launchers.emulated_megatron`` with a hardware profile; ``ray_layout.cluster`` places and
watches the ranks; the last rank's log (the one Megatron prints the timers on) is ingested.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from launchers.megatron import (
    ProfileSettings,
    megatron_arguments,
    megatron_command,
    rank_environment,
)
from ray_layout.cluster import FINISHED, RunResult, RunSpec, run_many
from ray_layout.ingest import Ingested, LoggedRun, ingest
from ray_layout.layout import Layout
from ray_layout.model import ConfigError, Recipe
from ray_layout.store import CostStore

PROJECT_ROOT = Path(__file__).resolve().parent.parent
EMULATED = "emulated"
MEGATRON = "megatron"


@dataclass(frozen=True)
class Backend:
    """What a rank runs: Megatron-LM (``megatron_path``) or the emulator (``hardware_profile``)."""

    name: str
    megatron_path: Path | None = None
    hardware_profile: Path | None = None
    python: str = sys.executable

    def __post_init__(self) -> None:
        if self.name == MEGATRON and self.megatron_path is None:
            raise ConfigError("the megatron backend needs --megatron-path (a Megatron-LM checkout)")
        if self.name == EMULATED and self.hardware_profile is None:
            raise ConfigError("the emulated backend needs a hardware profile")
        if self.name not in (MEGATRON, EMULATED):
            raise ConfigError(f"unknown backend {self.name!r}: use megatron or emulated")

    @property
    def hardware(self) -> str:
        if self.name == EMULATED and self.hardware_profile is not None:
            return self.hardware_profile.stem
        return "gpu"


def rank_command(
    backend: Backend,
    recipe: Recipe,
    layout: Layout,
    settings: ProfileSettings,
    extra_args: Sequence[str] = (),
) -> tuple[list[str], dict[str, str]]:
    """The argv every rank runs and the environment the backend adds to it."""
    arguments = megatron_arguments(recipe, layout, settings, extra_args)
    if backend.name == MEGATRON:
        return megatron_command(backend.python, backend.megatron_path, arguments), {}
    profile = backend.hardware_profile.resolve()
    env = {"RAY_LAYOUT_HARDWARE_PROFILE": str(profile), "PYTHONPATH": str(PROJECT_ROOT)}
    return [backend.python, "-m", "launchers.emulated_megatron", *arguments], env


@dataclass(frozen=True)
class ProfiledRun:
    layout: Layout
    result: RunResult
    ingested: Ingested | None  # None when the run did not finish


def profile_layouts_on_cluster(
    recipe: Recipe,
    layouts: Sequence[Layout],
    backend: Backend,
    store: CostStore,
    study: str,
    log_dir: Path,
    gpus_per_node: int,
    settings: ProfileSettings | None = None,
    timeout_s: float = 3600.0,
    heartbeat_s: float = 900.0,
    max_retries: int = 1,
) -> list[ProfiledRun]:
    """Run every layout side by side where the cluster has room, then ingest each finished run
    (its attempts are in the store's ``runs`` table either way)."""
    settings = settings or ProfileSettings()
    specs, runs = [], []
    for layout in layouts:
        run_recipe = replace(recipe, parallel=replace(recipe.parallel, pp=layout.pp,
                                                      vpp=layout.vpp))  # fmt: skip
        command, env = rank_command(backend, run_recipe, layout, settings)
        digest = hashlib.sha256(" ".join(command).encode()).hexdigest()[:12]
        specs.append(
            RunSpec(
                run_id=f"profile-{digest}",
                study=study,
                command=command,
                parallel=run_recipe.parallel,
                gpus_per_node=gpus_per_node,
                log_dir=log_dir,
                env=env,
                timeout_s=timeout_s,
                heartbeat_s=heartbeat_s,
                max_retries=max_retries,
                labels={
                    "model": recipe.model.name,
                    "layout": str(layout),
                    "backend": backend.name,
                    "hardware": backend.hardware,
                },
            )
        )
        runs.append(run_recipe)

    def rank_env(rank: int, world: int, addr: str, port: int, gpus: list[int]) -> dict[str, str]:
        """Megatron's rank environment (CUDA_DEVICE_MAX_CONNECTIONS with TP or CP > 1, ...);
        the cluster then sets the device variables itself. Ranks fill nodes in order,
        ``gpus_per_node`` at a time (``ray_layout.cluster.rank_order``)."""
        return rank_environment(rank, world, addr, port, gpus, recipe.parallel, base={}) | {
            "RAY_LAYOUT_NODE_RANK": str(rank // gpus_per_node)
        }

    results = run_many(specs, store, rank_env)
    profiled = []
    for layout, run_recipe, result in zip(layouts, runs, results, strict=True):
        ingested = None
        if result.status == FINISHED:
            last_rank_log = result.log_paths[-1]
            logged = LoggedRun(layout, last_rank_log, run_recipe.parallel)
            ingested = ingest(store, recipe.model, [logged], study)[0]
        profiled.append(ProfiledRun(layout, result, ingested))
    return profiled
