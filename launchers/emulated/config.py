"""What one emulated rank takes from its ``pretrain_gpt.py`` arguments and world size.

The arguments are read with Megatron's flag table, so an unknown flag or a bad value is the
one-line error Megatron's argparse would give; the layout is Megatron's default split when the
command line gives none, with Megatron's checks on virtual stages and micro-batch groups.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from launchers.megatron import ARGUMENTS_SOURCE
from ray_layout.errors import ConfigError
from ray_layout.model.baselines import megatron_default
from ray_layout.model.fields import ModelSpec
from ray_layout.model.job_flags import EpOverlap
from ray_layout.model.layout import Layout, validate
from ray_layout.model.megatron_args import check_arguments, megatron_flag_table, parse_flags
from ray_layout.model.megatron_recipe import load_megatron_command_line
from ray_layout.model.memory_settings import MemorySettings
from ray_layout.model.spec import ParallelConfig, with_parallel
from search.combined import rule_violations
from search.pipeline_ops import ScheduleShape

# Megatron accepts at most one of these and a layout string
_VIRTUAL_STAGE_DESTS = {
    "num_virtual_stages_per_pipeline_rank",
    "num_layers_per_virtual_pipeline_stage",
}


@dataclass(frozen=True)
class RunConfig:
    """What one rank takes from its command line and world size."""

    model: ModelSpec
    parallel: ParallelConfig  # DP from WORLD_SIZE, VPP from the layout
    layout: Layout
    num_microbatches: int
    group_size: int  # --microbatch-group-size-per-virtual-pipeline-stage, PP by default
    p2p_overlap: bool  # interleaved p2p overlapped: Megatron's default, off by its flag or VPP 1
    ep_overlap: EpOverlap  # EP all-to-all overlap: combined 1F1B's merged steps
    memory: MemorySettings  # recompute, optimizer dtypes, offload: what the rank's peak follows
    train_iters: int
    log_interval: int
    timing_log_level: int
    timing_log_option: str
    barrier_with_l1_time: bool
    log_throughput: bool
    learning_rate: float
    seed: int
    timeout_minutes: float

    @property
    def schedule_shape(self) -> ScheduleShape:
        """The pipeline schedule this job's ranks run."""
        return ScheduleShape(
            self.parallel.pp,
            self.layout.vpp,
            self.num_microbatches,
            self.group_size,
            self.p2p_overlap,
            self.ep_overlap.on,
        )

    @property
    def global_batch_size(self) -> int:
        return self.num_microbatches * self.parallel.micro_batch_size * self.parallel.dp


def run_config(argv: Sequence[str], world_size: int) -> RunConfig:
    """Parse ``argv`` as Megatron would (one-line :class:`ConfigError` or :class:`LayoutError`)."""
    # strict, as Megatron's argparse: a stray word is an error too
    check_arguments(argv, ARGUMENTS_SOURCE)
    flags = parse_flags(argv, ARGUMENTS_SOURCE)
    table = megatron_flag_table()

    def flag(name: str) -> Any:
        entry = table[name]
        return flags.get(entry["dest"], entry["default"])

    recipe = load_megatron_command_line(shlex.join(["pretrain_gpt.py", *argv]), ARGUMENTS_SOURCE)
    train_iters = flag("--train-iters")
    if train_iters is None or train_iters < 1:
        raise ConfigError(
            f"{ARGUMENTS_SOURCE}: --train-iters N (N >= 1) is needed; --train-samples is not"
        )
    if flag("--log-interval") < 1:
        raise ConfigError(f"{ARGUMENTS_SOURCE}: --log-interval must be >= 1")
    p = recipe.parallel
    model_parallel = p.tp * p.cp * p.pp
    if world_size % model_parallel:
        raise ConfigError(
            f"{ARGUMENTS_SOURCE}: WORLD_SIZE {world_size} is not divisible by TP·CP·PP = "
            f"{model_parallel}"
        )
    text = flag("--pipeline-model-parallel-layout")
    model = recipe.model
    if text is None:
        layout = megatron_default(
            model.num_layers,
            model.mtp_num_layers,
            p.pp,
            p.vpp,
            account_for_embedding=flag("--account-for-embedding-in-pipeline-split"),
            account_for_loss=flag("--account-for-loss-in-pipeline-split"),
            first_stage_layers=flag("--decoder-first-pipeline-num-layers"),
            last_stage_layers=flag("--decoder-last-pipeline-num-layers"),
        )
    elif _VIRTUAL_STAGE_DESTS & flags.keys():
        raise ConfigError(f"{ARGUMENTS_SOURCE}: a layout excludes the other virtual-pipeline flags")
    else:
        layout = Layout.parse(text, p.pp)
    validate(layout, model.num_layers, model.mtp_num_layers)
    parallel = with_parallel(recipe, dp=world_size // model_parallel, vpp=layout.vpp).parallel
    num_microbatches = parallel.num_microbatches_or_none or 1  # Megatron: GBS = MBS x DP
    group_size = flag("--microbatch-group-size-per-virtual-pipeline-stage") or parallel.pp
    if layout.vpp > 1 and not parallel.pp <= group_size <= num_microbatches:
        raise ConfigError(
            f"{ARGUMENTS_SOURCE}: interleaving needs PP ({parallel.pp}) <= micro-batch group size "
            f"({group_size}) <= micro-batches ({num_microbatches})"
        )
    if layout.vpp > 1 and 0 < num_microbatches % group_size < parallel.pp:
        raise ConfigError(
            f"{ARGUMENTS_SOURCE}: the last micro-batch group ({num_microbatches % group_size}) is "
            f"smaller than PP ({parallel.pp})"
        )
    job = recipe.flags
    violations = rule_violations(
        job.ep_overlap,
        pp=parallel.pp,
        vpp=layout.vpp,
        ep=parallel.ep,
        mtp_num_layers=model.mtp_num_layers,
        recompute_granularity=job.memory.recompute_granularity,
    )
    if violations:
        raise ConfigError(f"{ARGUMENTS_SOURCE}: {violations[0]}")
    return RunConfig(
        model=model,
        parallel=parallel,
        layout=layout,
        num_microbatches=num_microbatches,
        group_size=group_size,
        p2p_overlap=layout.vpp > 1 and job.p2p_overlap,
        ep_overlap=job.ep_overlap,
        memory=job.memory,
        train_iters=train_iters,
        log_interval=flag("--log-interval"),
        timing_log_level=flag("--timing-log-level"),
        timing_log_option=flag("--timing-log-option"),
        barrier_with_l1_time=flag("--no-barrier-with-level-1-timing"),
        log_throughput=flag("--log-throughput"),
        learning_rate=flag("--lr") or 1e-4,
        seed=flag("--seed"),
        timeout_minutes=flag("--distributed-timeout-minutes"),
    )
