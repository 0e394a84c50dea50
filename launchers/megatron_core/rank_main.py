"""One megatron-core rank as a launcher starts it: inputs, the CPU adaptations, the world, the
model, training, and an exit status a launcher can classify (2 bad input, 1 failure, 0 done)."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from datetime import timedelta
from functools import partial
from typing import Any, NoReturn

from launchers.emulated.config import RunConfig, run_config
from launchers.emulated.environment import NODE_ENV, PROFILE_ENV, env_int
from launchers.emulated.hardware import BUNDLED_PROFILE, HardwareProfile, load_profile
from launchers.megatron import ARGUMENTS_SOURCE
from launchers.megatron_core.compute_lock import START_PATIENCE_S, ComputeLock, default_lock_path
from launchers.megatron_core.gpt_build import (
    CoreSettings,
    check_buildable,
    check_runs_on_cpu,
    embedding_group,
)
from ray_layout.errors import EXIT_BAD_INPUT, EXIT_FAILURE, ConfigError, InputError
from ray_layout.model.job_flags import job_flags
from ray_layout.model.megatron_args import megatron_flag_table, parse_flags

# The CPU backend trains in fp32 with a plain (non-distributed) optimizer and no clipping:
# megatron-core 0.16.1's grad clipping and distributed optimizer check for torch.cuda tensors.
NOT_ON_CPU = ("--bf16", "--fp16", "--use-distributed-optimizer", "--clip-grad")


def main(argv: Sequence[str] | None = None) -> int:
    """Run one rank; bad input returns 2 with one line on stderr."""
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        world_size, rank = env_int("WORLD_SIZE"), env_int("RANK")
        if rank >= world_size:
            raise ConfigError(f"RANK {rank} is not below WORLD_SIZE {world_size}")
        check_runs_on_cpu(job_flags(argv, ARGUMENTS_SOURCE))
        run = run_config(argv, world_size)
        settings = core_settings(argv)
        check_buildable(run.layout, tied_embeddings=run.model.tied_embeddings)
        profile = load_profile(os.environ.get(PROFILE_ENV, BUNDLED_PROFILE))
        node = env_int(NODE_ENV, rank // profile.costs.gpus_per_node)
        lock = ComputeLock(default_lock_path())
        lock.acquire(START_PATIENCE_S)  # importing torch and megatron-core: a start's heaviest
        from launchers.megatron_core.cpu_adaptations import apply_adaptations

        apply_adaptations()
    except InputError as error:
        print(error, file=sys.stderr, flush=True)
        return EXIT_BAD_INPUT
    ignored = [flag for flag in NOT_ON_CPU if flag in argv]
    if ignored and rank == 0:
        print(
            f"megatron-core on CPU: fp32, plain optimizer, no clipping ({' '.join(ignored)} not "
            "applied)",
            file=sys.stderr,
            flush=True,
        )
    try:
        train(run, settings, profile, lock, rank, world_size, node)
    except Exception:  # a peer left (gloo: connection closed) or a bug: report it as Python does
        sys.excepthook(*sys.exc_info())
        _leave(EXIT_FAILURE)
    _leave(0)


def core_settings(argv: Sequence[str]) -> CoreSettings:
    """The flags the model build needs beyond :class:`RunConfig`."""
    flags = parse_flags(argv, ARGUMENTS_SOURCE)
    table = megatron_flag_table()

    def flag(name: str) -> Any:
        entry = table[name]
        return flags.get(entry["dest"], entry["default"])

    return CoreSettings(
        dispatcher=flag("--moe-token-dispatcher-type"),
        init_method_std=flag("--init-method-std"),
    )


def connect(run: RunConfig, rank: int, world_size: int) -> None:
    """gloo world and megatron-core's parallel state (TP, CP, PP, VPP, EP), Megatron's order."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state

    torch.set_num_threads(1)  # the rank's compute is this thread's CPU time
    p = run.parallel
    dist.init_process_group(
        "gloo",
        rank=rank,
        world_size=world_size,
        timeout=timedelta(minutes=run.timeout_minutes),
    )
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=p.tp,
        pipeline_model_parallel_size=p.pp,
        virtual_pipeline_model_parallel_size=run.layout.vpp if run.layout.vpp > 1 else None,
        context_parallel_size=p.cp,
        expert_model_parallel_size=p.ep,
        expert_tensor_parallel_size=p.etp,
        get_embedding_ranks=partial(
            embedding_group,
            layout=run.layout,
            tied_embeddings=run.model.tied_embeddings,
        ),
    )
    torch.manual_seed(run.seed + 100 * parallel_state.get_pipeline_model_parallel_rank())


def build(run: RunConfig, settings: CoreSettings) -> tuple[Any, list[Any], Any]:
    """The config, the DDP-wrapped model chunks and megatron-core's optimizer."""
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    from launchers.megatron_core.gpt_build import build_chunks, transformer_config

    config = transformer_config(run, settings)
    ddp_config = DistributedDataParallelConfig(use_distributed_optimizer=False)
    chunks = [
        DistributedDataParallel(config, ddp_config, chunk, disable_bucketing=index > 0)
        for index, chunk in enumerate(build_chunks(run, config))
    ]
    optimizer = get_megatron_optimizer(
        OptimizerConfig(optimizer="adam", lr=run.learning_rate, clip_grad=0.0), chunks
    )
    return config, chunks, optimizer


def train(
    run: RunConfig,
    settings: CoreSettings,
    profile: HardwareProfile,
    lock: ComputeLock,
    rank: int,
    world_size: int,
    node: int,
) -> None:
    """Connect, hook the logical clock in, build, train; every rank leaves together.  The
    compute lock is given up while the world connects and taken back by the clock."""
    import torch.distributed as dist

    from launchers.megatron_core.clock_hooks import StampedP2P, hold_collectives, time_timers_by
    from launchers.megatron_core.core_training import CoreTrainer
    from launchers.megatron_core.logical_clock import LogicalClock
    from launchers.megatron_core.op_trace import TRACE_ENV, OpTrace

    lock.release()
    connect(run, rank, world_size)
    nodes: list[Any] = [None] * world_size
    dist.all_gather_object(nodes, node)
    costs = profile.costs

    def transfer_seconds(peer: int) -> float:
        same = nodes[peer] == node
        return (costs.p2p_intra_node_ms if same else costs.p2p_inter_node_ms) / 1e3

    clock = LogicalClock(lock=lock)
    hold_collectives(clock)
    config, chunks, optimizer = build(run, settings)
    print(built_line(rank, chunks), file=sys.stderr, flush=True)
    time_timers_by(clock)
    StampedP2P(clock, transfer_seconds).install()
    trace_folder = os.environ.get(TRACE_ENV)
    trace = OpTrace(chunks) if trace_folder else None
    if trace is not None:
        trace.install()
    trainer = CoreTrainer(run, chunks, optimizer, clock, trace)
    trainer.configure(config)
    dist.barrier()
    trainer.train()
    dist.barrier()
    if lock.bypasses:
        print(
            f"megatron-core: rank {rank} computed {lock.bypasses} time(s) without the compute "
            f"lock {lock.path}, having waited past its patience (its CPU times may be inflated)",
            file=sys.stderr,
            flush=True,
        )
    if trace is not None and trace_folder:
        trace.write(trace_folder, rank)


BUILT_PREFIX = "megatron-core: built"


def built_line(rank: int, chunks: Sequence[Any]) -> str:
    """One stderr line naming the layers megatron-core built on this rank, chunk by chunk, in
    the layout language with each decoder layer's global number: what tests hold to the layout."""
    from launchers.megatron_core.gpt_build import built_stage

    stages = [built_stage(chunk.module) for chunk in chunks]
    text = " | ".join(f"{s.symbols} {list(s.layer_numbers)}" for s in stages)
    return f"{BUILT_PREFIX} rank {rank}: {text}"


def _leave(code: int) -> NoReturn:
    """Exit at once, output flushed, skipping gloo's teardown (it can abort the process)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
