"""Run the megatron-core backend's ranks as a launcher would, for tests: the product's own
``pretrain_gpt.py`` arguments for a recipe and layout, one process per rank over gloo."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from launchers.megatron import MegatronRunSettings, megatron_arguments
from ray_layout.model.layout import Layout
from ray_layout.model.loading import load_recipe
from ray_layout.runtime.layout_runs import layout_recipe
from tests.helpers.megatron_oracle import _free_port
from tests.helpers.paths import ROOT

TINY = ROOT / "configs/tiny_moe_mtp.yaml"


@dataclass(frozen=True)
class RankOutput:
    rank: int
    returncode: int
    stdout: str
    stderr: str


def core_arguments(
    layout: Layout, iterations: int, global_batch: int = 4, config: Path = TINY
) -> list[str]:
    """The arguments the product builds for ``config`` (the tiny MoE) with ``layout`` (PP from
    the layout)."""
    recipe = load_recipe(str(config))
    recipe = replace(recipe, parallel=replace(recipe.parallel, global_batch_size=global_batch))
    recipe = layout_recipe(recipe, layout)
    settings = MegatronRunSettings(train_iters=iterations)
    return list(megatron_arguments(recipe, layout, settings).argv)


def run_ranks(argv: list[str], world: int, logs: Path, timeout: float = 300) -> list[RankOutput]:
    """Every rank of ``argv`` at once; their outputs once all have ended (killed at timeout)."""
    port = _free_port()
    processes = []
    for rank in range(world):
        env = os.environ | {
            "RANK": str(rank),
            "WORLD_SIZE": str(world),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "PYTHONPATH": str(ROOT),
            "PYTHONWARNINGS": "ignore",
        }
        out, err = logs / f"rank{rank}.out", logs / f"rank{rank}.err"
        with open(out, "w") as stdout, open(err, "w") as stderr:
            command = [sys.executable, "-m", "launchers.megatron_core_rank", *argv]
            processes.append(subprocess.Popen(command, env=env, stdout=stdout, stderr=stderr))
    try:
        codes = [process.wait(timeout=timeout) for process in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
    return [
        RankOutput(
            rank,
            code,
            (logs / f"rank{rank}.out").read_text(),
            (logs / f"rank{rank}.err").read_text(),
        )
        for rank, code in enumerate(codes)
    ]
