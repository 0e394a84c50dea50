"""``python -m ray_layout profile``: profiling runs on Ray (emulated or Megatron-LM), into the
cost store. Ray is imported only when this command runs, so the other commands start fast."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from rich.console import Console

from launchers.emulated.hardware import BUNDLED_PROFILE, load_profile
from ray_layout.commands.common import Command, ModelSettings, emit, json_flag
from ray_layout.commands.flags import Settings
from ray_layout.commands.searching import check_search_size, tflops_flag
from ray_layout.errors import ConfigError, RunFailure
from ray_layout.measure.design import profile_design
from ray_layout.measure.log_records import FIT_NEEDS, MIN_PROFILE_ITERATIONS
from ray_layout.measure.store import CostStore
from ray_layout.model.costs import costs_from_flops
from ray_layout.model.fields import MAX_PARALLEL_SIZE
from ray_layout.model.layout import Layout, validate_buildable
from ray_layout.options.checks import (
    MAX_ITERATIONS,
    at_least,
    between,
    folder_or_new,
    plain_name,
    reachable,
)
from ray_layout.options.flag_fields import option
from ray_layout.runtime.policy import RunPolicy

if TYPE_CHECKING:
    from ray_layout.runtime.layout_runs import Backend

SCRIPT = "pretrain_gpt.py"  # what the megatron backend runs from the checkout
EMULATED_NODES = 3  # the embedded local cluster's nodes when no --ray-address is given


@dataclass(frozen=True, kw_only=True)
class BackendFlags(Settings):
    """What every rank runs: Megatron-LM from a checkout, or the emulator with a hardware
    profile; both checked here, before any cluster is started (the driver builds every rank's
    command from the checkout, so it must have one too)."""

    backend: Literal["emulated", "megatron", "megatron-core"] = option(
        "emulated",
        help="emulated: sleeps by a hardware profile; megatron: Megatron-LM from a checkout; "
        "megatron-core: megatron-core's own GPTModel on CPU ranks (CPU times)",
    )
    megatron_path: str | None = option(
        None, help="a Megatron-LM checkout on every node (megatron backend)"
    )
    hardware: str = option(
        str(BUNDLED_PROFILE),
        help="the emulated backend's hardware profile (default: the bundled H200); the "
        "megatron-core backend takes its link times and HBM from it",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        backend = self.to_backend()  # its own checks: a megatron backend needs its checkout
        if backend.hardware_profile is not None:
            if not backend.hardware_profile.exists():
                raise ConfigError(f"--hardware {self.hardware}: no such file")
            load_profile(backend.hardware_profile)  # a broken profile: one line, now
        if backend.megatron_path is not None and not (backend.megatron_path / SCRIPT).is_file():
            raise ConfigError(
                f"--megatron-path {self.megatron_path}: no {SCRIPT} there; give a Megatron-LM "
                "checkout (e.g. the NGC container's /opt/megatron-lm)"
            )

    def to_backend(self) -> Backend:
        from ray_layout.runtime.layout_runs import Backend

        return Backend(
            self.backend,
            megatron_path=Path(self.megatron_path) if self.megatron_path else None,
            hardware_profile=Path(self.hardware) if self.backend != "megatron" else None,
        )


def log_dir_flag() -> Any:
    return option(
        None,
        help="also write every rank's raw log here (results come back through Ray either way)",
        checks=[folder_or_new],
    )


@dataclass(frozen=True, kw_only=True)
class ProfileSettings(ModelSettings):
    layout: tuple[str, ...] = option((), help="default: what profile-layouts picks")
    runner: BackendFlags = field(default_factory=BackendFlags)
    store: str = option(checks=[folder_or_new])
    study: str = option("default", checks=[plain_name])
    log_dir: str | None = log_dir_flag()
    ray_address: str | None = option(
        None, help="a running cluster (default: simulate 3 nodes)", checks=[reachable]
    )
    gpus_per_node: int = option(4, checks=[between(1, MAX_PARALLEL_SIZE)])
    train_iters: int = option(
        8, checks=[at_least(MIN_PROFILE_ITERATIONS, FIT_NEEDS), between(1, MAX_ITERATIONS)]
    )
    tflops: float = tflops_flag()
    policy: RunPolicy = field(default_factory=RunPolicy)
    as_json: bool = json_flag()


def _layouts(settings: ProfileSettings, recipe) -> list[Layout]:
    """The given layouts, else the profile design's (FLOP-guessed costs rank its runs)."""
    model, parallel = recipe.model, recipe.parallel
    if not settings.layout:
        check_search_size(recipe)
        guess = costs_from_flops(model, parallel, settings.tflops)
        microbatches = parallel.num_microbatches_or_none or 8
        design = profile_design(model, parallel, microbatches, guess, settings=recipe.flags.memory)
        return list(design.layouts)
    layouts = [Layout.parse(text, parallel.pp) for text in settings.layout]
    for layout in layouts:
        validate_buildable(
            layout, model.num_layers, model.mtp_num_layers, tied_embeddings=model.tied_embeddings
        )
    return layouts


def run_profile(settings: ProfileSettings, console: Console) -> None:
    from launchers.megatron import MegatronRunSettings
    from ray_layout.runtime.layout_runs import LayoutRun, RunOptions, run_layouts
    from ray_layout.runtime.local import connected

    recipe = settings.recipe()
    backend = settings.runner.to_backend()
    layouts = _layouts(settings, recipe)
    options = RunOptions(
        gpus_per_node=settings.gpus_per_node,
        settings=MegatronRunSettings(train_iters=settings.train_iters, profiling=True),
        policy=settings.policy,
    )
    address, per_node = settings.ray_address, settings.gpus_per_node
    with connected(address, EMULATED_NODES, per_node) as (gpus_per_node, _):
        options = replace(options, gpus_per_node=gpus_per_node)
        store, to_run = CostStore(settings.store), [LayoutRun(layout) for layout in layouts]
        log_dir = Path(settings.log_dir) if settings.log_dir else None
        runs = run_layouts(
            recipe,
            to_run,
            backend=backend,
            store=store,
            study=settings.study,
            log_dir=log_dir,
            options=options,
        )
    rows = [
        {
            "layout": str(run.layout),
            "status": run.result.status,
            "failure_class": run.result.failure_class,
            "error": run.result.error,
            "attempts": run.result.attempts,
            "run_id": run.ingested.run_id if run.ingested else None,
        }
        for run in runs
    ]

    def show(rows: list[dict[str, Any]], console: Console) -> None:
        for row in rows:
            detail = row["run_id"] or f"{row['failure_class']}: {row['error']}"
            console.print(
                f"{row['layout']}: {row['status']} ({detail})", highlight=False, markup=False
            )
        fit = (
            f"python -m ray_layout fit {settings.config} --store {settings.store} "
            f"--study {settings.study}"
        )
        console.print(f"next: {fit} -o costs.json", highlight=False, markup=False)

    emit(rows, settings.as_json, show, console)
    failed = sum(row["status"] != "finished" for row in rows)
    if failed:
        raise RunFailure(f"{failed} of {len(rows)} profiling runs did not finish")


PROFILE = Command(
    "profile",
    "run profiling runs on Ray (emulated or Megatron-LM) into the store",
    ProfileSettings,
    run_profile,
)
