"""A small tune for the tuning tests: the handbook recipe on PP=2 x DP=2 (EP=2), 4 GPUs and 8
micro-batches, quick on the emulated cluster, and the settings that tune it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from ray_layout.ab.stats import ABConfig
from ray_layout.model.loading import load_recipe
from ray_layout.model.spec import with_parallel
from ray_layout.runtime.layout_runs import Backend
from ray_layout.runtime.policy import RunPolicy
from ray_layout.tuning.settings import TuneOptions, TuneSettings
from tests.helpers.cluster import GPUS_PER_NODE

CONFIG = "configs/handbook_7b_a1b.yaml"
HARDWARE = Path("cluster_configs/hardware/h200_emulated.yaml")
HANDBOOK = load_recipe(CONFIG)
SMALL = with_parallel(HANDBOOK, pp=2, global_batch_size=32)  # CONFIG with SMALL_OPTIONS' sizes
# the same job run as real MoE jobs run it: grouped GEMM, which recomputing the experts'
# activation needs (the layout x recompute tests search with it)
GROUPED = replace(SMALL, megatron_args=("--moe-grouped-gemm",))
SMALL_OPTIONS = TuneOptions(
    ab=ABConfig(warmup_iterations=2, batch_size=3, looks=(2, 4)),
    ab_top=2,
    profile_iters=6,
    hbm_gib=131.0,
    policy=RunPolicy(timeout_s=240.0, heartbeat_s=120.0),
)


def small_settings(tmp_path: Path, study: str, **options: object) -> TuneSettings:
    """The small tune's settings; ``options`` replace its options' (``ab_top=1``)."""
    return TuneSettings(
        backend=Backend("emulated", hardware_profile=HARDWARE),
        store=tmp_path / "store",
        study=study,
        log_dir=tmp_path / "logs",
        report_dir=tmp_path / "report",
        gpus_per_node=GPUS_PER_NODE,
        options=replace(SMALL_OPTIONS, **options),
    )
