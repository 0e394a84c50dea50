"""``python -m ray_layout megatron-command``: the exact ``pretrain_gpt.py`` command line and rank
environment a profiling or A/B run would use, to check (or run by hand) before any GPU is taken.

The user's own flags (a launch script's, or ``megatron_args:``) go through except those the tuner
owns; what was replaced or removed is said once, on stderr (``launchers.megatron_flags``).
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from launchers.megatron import MegatronRunSettings, environment_notes, megatron_arguments
from ray_layout.commands.common import Command, ModelSettings, emit, json_flag
from ray_layout.model.fields import MAX_PARALLEL_SIZE
from ray_layout.model.layout import Layout
from ray_layout.options.checks import between
from ray_layout.options.flag_fields import option
from ray_layout.runtime.layout_runs import rank_env_of
from ray_layout.runtime.placement import launch_env, planned_devices

MAX_ITERATIONS = 1_000_000
MAX_RANK = 1_000_000


@dataclass(frozen=True, kw_only=True)
class MegatronCommandSettings(ModelSettings):
    layout: str | None = option(
        None, help="e.g. 'Et*5|t*6|t*5|mL' (default: the config's current split, else Megatron's)"
    )
    rank: int = option(
        0, help="the global rank whose environment to show", checks=[between(0, MAX_RANK)]
    )
    megatron_path: str = option("/opt/megatron-lm", help="the Megatron-LM checkout on the nodes")
    python: str = option("python", help="the nodes' Python")
    train_iters: int = option(10, checks=[between(1, MAX_ITERATIONS)])
    keep_data: bool = option(False, help="keep the user's data flags instead of mock data")
    gpus_per_node: int = option(8, checks=[between(1, MAX_PARALLEL_SIZE)])
    master_addr: str = option("localhost", help="rank 0's node (Ray picks it on the cluster)")
    master_port: int = option(29500, checks=[between(1, 65535)])
    as_json: bool = json_flag()


def run_megatron_command(settings: MegatronCommandSettings, console: Console) -> None:
    recipe = settings.recipe()
    parallel = recipe.parallel
    layout = Layout.parse(settings.layout, parallel.pp) if settings.layout else None
    if layout is None and recipe.split.layout:  # the script's own layout string: its current
        layout = Layout.parse(recipe.split.layout, parallel.pp)
    profile = MegatronRunSettings(
        train_iters=settings.train_iters, keep_data=settings.keep_data, profiling=True
    )
    merged = megatron_arguments(recipe, layout, profile)
    script = str(Path(settings.megatron_path) / "pretrain_gpt.py")
    devices = planned_devices(parallel.world_size, settings.gpus_per_node)
    rank_env = rank_env_of(recipe, settings.gpus_per_node)  # what a profiling run launches with
    env = launch_env(rank_env, devices, settings.rank, settings.master_addr, settings.master_port)
    for note in (*merged.notes, *environment_notes(recipe)):
        print(note, file=sys.stderr)
    report = {"argv": [settings.python, script, *merged.argv], "env": env}

    def show(report: dict[str, Any], console: Console) -> None:
        assignments = [f"{name}={shlex.quote(value)}" for name, value in report["env"].items()]
        print(" ".join([*assignments, shlex.join(report["argv"])]))

    emit(report, settings.as_json, show, console)


MEGATRON_COMMAND = Command(
    "megatron-command",
    "print the pretrain_gpt.py command line and environment of one rank of a profiling run",
    MegatronCommandSettings,
    run_megatron_command,
)
