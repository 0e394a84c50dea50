"""One emulated rank as a launcher starts it: inputs from the environment and the command line,
the out-of-memory check, training, and an exit status a launcher can classify."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import NoReturn

import torch.distributed as dist

from launchers.emulated.config import RunConfig, run_config
from launchers.emulated.environment import NODE_ENV, PROFILE_ENV, env_int
from launchers.emulated.hardware import HardwareProfile, load_profile
from launchers.emulated.oom import fits, out_of_memory_message
from launchers.emulated.rank import EmulatedRank
from ray_layout.errors import EXIT_BAD_INPUT, EXIT_FAILURE, ConfigError, InputError


def main(argv: Sequence[str] | None = None) -> int:
    """Run one rank: bad input returns 2 (one line on stderr, as Megatron's argparse); the
    process then ends with 0 when it trained, 1 when out of memory or on a failure of its own
    or of a peer."""
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        world_size = env_int("WORLD_SIZE")
        rank = env_int("RANK")
        if rank >= world_size:
            raise ConfigError(f"RANK {rank} is not below WORLD_SIZE {world_size}")
        config = run_config(argv, world_size)
        if PROFILE_ENV not in os.environ:
            raise ConfigError(f"{PROFILE_ENV} is not set: point it at a hardware profile YAML")
        profile = load_profile(os.environ[PROFILE_ENV])
        emulated = EmulatedRank(config, profile, rank, world_size)
        node = env_int(NODE_ENV, rank // profile.costs.gpus_per_node)
        device = env_int("LOCAL_RANK", 0)
    except InputError as error:
        print(error, file=sys.stderr, flush=True)
        return EXIT_BAD_INPUT
    _warn_on_other_shape(config, profile)
    try:
        emulated.connect(node)
        if not fits(emulated.costs, profile.hbm_gib):
            print(out_of_memory_message(emulated.costs, profile.hbm_gib, device), file=sys.stderr)
            _leave(EXIT_FAILURE)
        emulated.train()
        dist.barrier()  # no peer still talks to this rank
    except Exception:  # a peer left (gloo: connection closed) or a bug: report it as Python does
        sys.excepthook(*sys.exc_info())
        _leave(EXIT_FAILURE)
    _leave(0)


def _leave(code: int) -> NoReturn:
    """Exit at once with ``code``, output flushed, skipping the interpreter's teardown: tearing
    down gloo's threads can abort the process (SIGABRT, "terminate called without an active
    exception"), after a peer has gone or, now and then, after a run that ended well."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _warn_on_other_shape(config: RunConfig, profile: HardwareProfile) -> None:
    """The profile's costs were measured for one micro-batch shape; say when this run differs."""
    costs, parallel = profile.costs, config.parallel
    shape = (parallel.micro_batch_size, config.model.seq_length, parallel.tp, parallel.ep)
    if shape != (costs.micro_batch_size, costs.seq_length, costs.tp, costs.ep):
        print(
            f"warning: {profile.name} has costs for micro-batch {costs.micro_batch_size}, "
            f"sequence {costs.seq_length}, TP {costs.tp}, EP {costs.ep}; this run has "
            f"{shape[0]}, {shape[1]}, {shape[2]}, {shape[3]}: using them as they are",
            file=sys.stderr,
            flush=True,
        )
