"""The emulated backend: a CPU stand-in for one rank of Megatron-LM's ``pretrain_gpt.py``.

    RAY_LAYOUT_HARDWARE_PROFILE=cluster_configs/hardware/h200_emulated.yaml \\
    RANK=3 WORLD_SIZE=4 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 \\
    python -m launchers.emulated_megatron <the arguments pretrain_gpt.py gets>

It makes the whole tuning loop runnable and testable without GPUs, while staying independent of
the planner's simulator:

- the command line is read with Megatron's flag table (``ray_layout.model.megatron_args``): an
  unknown flag or a bad value exits 2 with one line on stderr, as Megatron's argparse would;
- the order of forward and backward work comes from megatron-core's own
  ``get_pp_rank_microbatches`` and ``get_schedule_table``, with the p2p calls Megatron makes at
  each point (``overlap_p2p_comm`` off, as ``search/schedule.py`` assumes; its op types are
  shared, its order is not);
- pipeline neighbours exchange real tensors over gloo, batched like Megatron's
  ``batch_isend_irecv`` and waited together (a gloo send completes only once its receive is
  posted, as with NCCL), so bubbles and waits emerge from real concurrency; each tensor carries
  its micro-batch and stage, and a compute whose input has not arrived is an error;
- compute sleeps for each unit's cost in the hardware profile (never FLOP ratios) with per-op
  lognormal jitter; a transfer sleeps the profile's intra- or inter-node time on the sender; an
  MTP-standalone layout adds ``mtp_standalone_extra`` to the MTP rank's compute; the step tail
  sleeps in proportion to the rank's parameters (gradient sync, with a real all-reduce over the
  DP group, then the optimizer); every sleep is multiplied by the profile's ``time_scale``;
- level-1 timers start with a world barrier, as under Megatron's default
  ``--barrier-with-level-1-timing``, so every step starts together;
- memory: the rank's peak from ``search.memory`` with the profile's calibration; past
  ``hbm_gib`` the rank prints PyTorch's out-of-memory line and exits 1 before training (its
  neighbours then fail on gloo, as a real job would);
- logs: Megatron's timer blocks (gathered to the last rank, in emulated ms, with the
  first-interval quirk), iteration lines and memory lines (``ray_layout.measure.log_format``).

Environment: ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` (torch's ``env://``
rendezvous), ``LOCAL_RANK`` (the GPU named in the out-of-memory line, default 0),
``RAY_LAYOUT_HARDWARE_PROFILE`` (required), ``RAY_LAYOUT_NODE_RANK`` (the node this rank runs
on, set by a launcher that knows; default ``RANK // gpus_per_node``, which is how torchrun packs
ranks). Global ranks run tp-cp-dp-pp, PP outermost.

Not emulated: evaluation, checkpoints, data loading, tensor/context/expert-parallel
communication, Megatron's overlapped p2p (its default for interleaving; launchers should pass
``--no-overlap-p2p-communication`` when measured and emulated runs are to match).
"""

from __future__ import annotations

import math
import os
import shlex
import sys
import time
import warnings
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from ray_layout.errors import ConfigError, LayoutError
from ray_layout.measure.log_format import (
    P2P_TIMER_OF_CALL,
    TIMER_LOGGER_PREFIX,
    iteration_line,
    memory_line,
    timers_all,
    timers_max,
    timers_minmax,
)
from ray_layout.measure.logs import LEVEL1_TIMERS, LEVEL2_TIMERS
from ray_layout.model.baselines import megatron_default
from ray_layout.model.costs import FORMAT, UnitCosts, costs_from_dict, stage_compute_ms
from ray_layout.model.layout import MTP, Layout, validate
from ray_layout.model.megatron_args import (
    load_megatron_command_line,
    megatron_flag_table,
    parse_flags,
)
from ray_layout.model.sizing import WEIGHT_BYTES, stage_sizes, training_flops_per_iteration
from ray_layout.model.spec import ModelSpec, ParallelConfig, read_mapping, with_parallel
from search.cost_model import in_flight_at_peak
from search.memory import GIB, StageMemory, stage_memory
from search.schedule import (
    BACKWARD,
    FORWARD,
    RECV_NEXT,
    RECV_PREV,
    SEND_NEXT,
    SEND_PREV,
    Compute,
    Op,
    P2PCall,
)

PROFILE_ENV = "RAY_LAYOUT_HARDWARE_PROFILE"
NODE_ENV = "RAY_LAYOUT_NODE_RANK"
EXIT_BAD_INPUT = 2  # what Megatron's argparse exits with
EXIT_FAILED = 1  # an uncaught exception, e.g. torch.OutOfMemoryError
SOURCE = "pretrain_gpt.py arguments"

# training_log's timers_to_log order: forward-backward, compute, the level-2 p2p timers, then
# the rest of level 1 (LEVEL1_TIMERS and LEVEL2_TIMERS list the same names by level).
_COMPUTE_TIMERS = ("forward-compute", "backward-compute")
TIMERS_TO_LOG = (
    LEVEL1_TIMERS[0],
    *_COMPUTE_TIMERS,
    *(name for name in LEVEL2_TIMERS if name not in _COMPUTE_TIMERS),
    *LEVEL1_TIMERS[1:],
)
_LEVEL1 = frozenset(LEVEL1_TIMERS)
# _batched_p2p_ops posts in this order; tags keep the two directions of a link apart (with
# PP = 2 and interleaving, the next and the previous rank are the same process).
_POST_ORDER = (SEND_PREV, RECV_PREV, SEND_NEXT, RECV_NEXT)
_TAG = {SEND_NEXT: 1, RECV_PREV: 1, SEND_PREV: 2, RECV_NEXT: 2}
_SENDS = frozenset({SEND_NEXT, SEND_PREV})
_RESERVED_SLACK = 1.05  # the caching allocator reserves a little more than it hands out
# Megatron accepts at most one of these and a layout string
_VIRTUAL_STAGE_DESTS = {
    "num_virtual_stages_per_pipeline_rank",
    "num_layers_per_virtual_pipeline_stage",
}
_PROFILE_NUMBERS = ("hbm_gib", "time_scale", "jitter_cv", "mtp_standalone_extra")
_POSITIVE_NUMBERS = frozenset({"hbm_gib", "time_scale"})


# The hardware profile


@dataclass(frozen=True)
class HardwareProfile:
    """An emulated cluster: unit costs in the planner's own format (so a fit of emulated runs can
    be compared with them field by field), HBM per GPU, the time scale and per-op noise."""

    name: str
    hbm_gib: float
    time_scale: float
    jitter_cv: float
    costs: UnitCosts  # mtp_standalone_factor = 1 + the profile's mtp_standalone_extra


def load_profile(path: str | Path) -> HardwareProfile:
    """Read a profile YAML (schema: ``cluster_configs/hardware/h200_emulated.yaml``); any problem
    is a one-line :class:`ConfigError` naming the file."""
    path = Path(path)
    source = str(path)
    raw = read_mapping(path, source)
    reserved = sorted({"format", "source", "mtp_standalone_factor"} & set(raw))
    if reserved:
        raise ConfigError(
            f"{source}: {', '.join(reserved)} is not a profile field (the profile has "
            "mtp_standalone_extra instead of a factor)"
        )
    numbers = {}
    for key in _PROFILE_NUMBERS:
        value = raw.pop(key, None)
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
        ):
            raise ConfigError(f"{source}: {key} must be a finite number, got {value!r}")
        if value < 0 or (key in _POSITIVE_NUMBERS and value == 0):
            bound = "> 0" if key in _POSITIVE_NUMBERS else ">= 0"
            raise ConfigError(f"{source}: {key} must be {bound}, got {value}")
        numbers[key] = float(value)
    name = raw.pop("name", path.stem)
    extra = numbers.pop("mtp_standalone_extra")
    costs = costs_from_dict(
        {"format": FORMAT, "source": "manual", "mtp_standalone_factor": 1 + extra, **raw},
        source=source,
    )
    return HardwareProfile(name=str(name), costs=costs, **numbers)


# The command line


@dataclass(frozen=True)
class RunConfig:
    """What one rank takes from its command line and world size."""

    model: ModelSpec
    parallel: ParallelConfig  # DP from WORLD_SIZE, VPP from the layout
    layout: Layout
    num_microbatches: int
    group_size: int  # --microbatch-group-size-per-virtual-pipeline-stage, PP by default
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
    def global_batch_size(self) -> int:
        return self.num_microbatches * self.parallel.micro_batch_size * self.parallel.dp


def run_config(argv: Sequence[str], world_size: int) -> RunConfig:
    """Parse ``argv`` as Megatron would (one-line :class:`ConfigError` or :class:`LayoutError`)."""
    flags = parse_flags(list(argv), SOURCE)
    table = megatron_flag_table()

    def flag(name: str) -> Any:
        entry = table[name]
        return flags.get(entry["dest"], entry["default"])

    recipe = load_megatron_command_line(shlex.join(["pretrain_gpt.py", *argv]), SOURCE)
    train_iters = flag("--train-iters")
    if train_iters is None or train_iters < 1:
        raise ConfigError(f"{SOURCE}: --train-iters N (N >= 1) is needed; --train-samples is not")
    if flag("--log-interval") < 1:
        raise ConfigError(f"{SOURCE}: --log-interval must be >= 1")
    p = recipe.parallel
    model_parallel = p.tp * p.cp * p.pp
    if world_size % model_parallel:
        raise ConfigError(
            f"{SOURCE}: WORLD_SIZE {world_size} is not divisible by TP·CP·PP = {model_parallel}"
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
        raise ConfigError(f"{SOURCE}: a layout excludes the other virtual-pipeline flags")
    else:
        layout = Layout.parse(text, p.pp)
    validate(layout, model.num_layers, model.mtp_num_layers)
    parallel = with_parallel(recipe, dp=world_size // model_parallel, vpp=layout.vpp).parallel
    num_microbatches = parallel.num_microbatches_or_none or 1  # Megatron: GBS = MBS x DP
    group_size = flag("--microbatch-group-size-per-virtual-pipeline-stage") or parallel.pp
    if layout.vpp > 1 and not parallel.pp <= group_size <= num_microbatches:
        raise ConfigError(
            f"{SOURCE}: interleaving needs PP ({parallel.pp}) <= micro-batch group size "
            f"({group_size}) <= micro-batches ({num_microbatches})"
        )
    if layout.vpp > 1 and 0 < num_microbatches % group_size < parallel.pp:
        raise ConfigError(
            f"{SOURCE}: the last micro-batch group ({num_microbatches % group_size}) is smaller "
            f"than PP ({parallel.pp})"
        )
    return RunConfig(
        model=model,
        parallel=parallel,
        layout=layout,
        num_microbatches=num_microbatches,
        group_size=group_size,
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


# The schedule


def _call(
    name: str,
    *,
    send_next: bool = False,
    send_prev: bool = False,
    recv_prev: bool = False,
    recv_next: bool = False,
) -> P2PCall:
    """A p2p call of Megatron's; an interleaved call with nothing to move still runs its timer."""
    wanted = ((SEND_NEXT, send_next), (SEND_PREV, send_prev), (RECV_PREV, recv_prev),
              (RECV_NEXT, recv_next))  # fmt: skip
    return P2PCall(name, tuple(transfer for transfer, on in wanted if on))


def rank_program(
    pp: int, pp_rank: int, vpp: int, num_microbatches: int, group_size: int
) -> list[Op]:
    """One rank's computations and p2p calls in the order Megatron issues them.

    How many forwards warm up, and which (micro-batch, chunk) the k-th forward is, come from
    megatron-core's ``get_pp_rank_microbatches`` and ``get_schedule_table``; a backward runs
    chunk VPP-1-c.  The p2p calls follow ``forward_backward_pipelining_without_interleaving``
    and ``..._with_interleaving`` (``overlap_p2p_comm`` off).
    """
    with warnings.catch_warnings():  # "Transformer Engine and Apex are not installed"
        warnings.simplefilter("ignore")
        from megatron.core.pipeline_parallel import schedules

    communicator = SimpleNamespace(
        pp_group=SimpleNamespace(size=lambda: pp, rank=lambda: pp_rank),
        virtual_pipeline_model_parallel_size=vpp if vpp > 1 else None,
    )
    total, all_warmup, warmup, remaining = schedules.get_pp_rank_microbatches(
        num_microbatches, vpp, group_size, p2p_communicator=communicator
    )
    table = schedules.get_schedule_table(num_microbatches, vpp, group_size)
    if vpp == 1:
        ops = _one_f_one_b(pp, pp_rank, table, warmup, remaining)
    else:
        ops = _interleaved(pp, pp_rank, vpp, table, total, all_warmup, warmup, remaining)
    return [op for op in ops if op is not None]


def _one_f_one_b(
    pp: int, rank: int, table: Sequence[tuple[int, int]], warmup: int, remaining: int
) -> list[Op | None]:
    """Warm-up forwards, steady forward/backward pairs, cool-down backwards.  The first and last
    stage skip the calls toward the pipeline's ends, timers included."""
    first, last = rank == 0, rank == pp - 1
    recv_forward = None if first else _call("recv_forward", recv_prev=True)
    send_forward = None if last else _call("send_forward", send_next=True)
    recv_backward = None if last else _call("recv_backward", recv_next=True)
    send_backward = None if first else _call("send_backward", send_prev=True)
    ops: list[Op | None] = []
    for k in range(warmup):
        ops += [recv_forward, Compute(FORWARD, *table[k]), send_forward]
    if remaining:
        ops.append(recv_forward)
    for i in range(remaining):
        ops += [
            Compute(FORWARD, *table[warmup + i]),
            None if last else _call("send_forward_recv_backward", send_next=True, recv_next=True),
            Compute(BACKWARD, *table[i]),
        ]
        if i == remaining - 1:
            ops.append(send_backward)
        elif not first:
            ops.append(_call("send_backward_recv_forward", send_prev=True, recv_prev=True))
    for i in range(warmup):
        ops += [recv_backward, Compute(BACKWARD, *table[remaining + i]), send_backward]
    return ops


def _interleaved(
    pp: int,
    rank: int,
    vpp: int,
    table: Sequence[tuple[int, int]],
    total: int,
    all_warmup: bool,
    warmup: int,
    remaining: int,
) -> list[Op | None]:
    """``forward_backward_pipelining_with_interleaving`` with ``overlap_p2p_comm`` off."""
    first, last = rank == 0, rank == pp - 1

    def chunk(k: int, forward: bool) -> int:
        c = table[k % total][1]
        return c if forward else vpp - 1 - c

    def forward(k: int) -> tuple[Compute, bool]:
        """The k-th forward and whether it sends (the last stage's output goes to the loss)."""
        c = chunk(k, True)
        return Compute(FORWARD, table[k % total][0], c), not (last and c == vpp - 1)

    def backward(k: int) -> tuple[Compute, bool]:
        c = chunk(k, False)
        return Compute(BACKWARD, table[k % total][0], c), not (first and c == 0)

    def receives(k: int, forward: bool) -> bool:
        """``recv_tensor_from_previous_stage``: the stage that starts this direction receives
        nothing until the ring has filled, nor for a chunk the ring does not feed."""
        if not (first if forward else last):
            return True
        if k < pp - 1:
            return False
        return chunk(k - (pp - 1), forward) != (vpp - 1 if forward else 0)

    ops: list[Op | None] = [None if first else _call("recv_forward", recv_prev=True)]
    for k in range(warmup):
        compute, send_next = forward(k)
        recv_prev = receives(k, True) and k != total - 1
        ops.append(compute)
        if k == warmup - 1 and not all_warmup:
            name = "send_forward_backward_recv_forward_backward"
            ops.append(_call(name, send_next=send_next, recv_prev=recv_prev, recv_next=not last))
        else:
            ops.append(_call("send_forward_recv_forward", send_next=send_next, recv_prev=recv_prev))
    for k in range(remaining):
        f_compute, send_next = forward(k + warmup)
        b_compute, send_prev = backward(k)
        ops += [
            f_compute,
            b_compute,
            _call(
                "send_forward_backward_recv_forward_backward",
                send_next=send_next,
                send_prev=send_prev,
                recv_prev=receives(k + warmup, True) and k != remaining - 1,
                recv_next=receives(k, False),
            ),
        ]
    if all_warmup:
        ops.append(None if last else _call("recv_backward", recv_next=True))
    for k in range(remaining, total):
        compute, send_prev = backward(k)
        recv_next = receives(k, False) and k != total - 1
        ops += [
            compute,
            _call("send_backward_recv_backward", send_prev=send_prev, recv_next=recv_next),
        ]
    return ops


# What one rank costs


@dataclass(frozen=True)
class RankCosts:
    """One PP rank's emulated milliseconds (before jitter and time scale) and memory."""

    forward_ms: tuple[float, ...]  # one micro-batch through each of the rank's chunks
    backward_ms: tuple[float, ...]
    grad_sync_ms: float
    optimizer_ms: float
    memory: StageMemory
    held_microbatches: int  # micro-batches whose activations the rank holds at its peak


def rank_costs(config: RunConfig, costs: UnitCosts, pp_rank: int) -> RankCosts:
    """Compute, step tail and peak memory of PP rank ``pp_rank`` under ``costs``."""
    layout, pp = config.layout, config.parallel.pp
    forward, backward = stage_compute_ms(costs, config.model, layout.stages)
    holds_mtp = MTP in "".join(layout.rank_chunks(pp_rank))
    factor = costs.mtp_standalone_factor if layout.mtp_standalone and holds_mtp else 1.0
    stage = stage_sizes(config.model, config.parallel, layout.stages)[pp_rank]
    gparams = stage.memory.weights / WEIGHT_BYTES / 1e9
    in_flight = in_flight_at_peak(pp, layout.vpp, config.num_microbatches, config.group_size)
    held = [dict(enumerate(row.tolist())) for row in in_flight]
    memory = stage_memory(config.model, config.parallel, layout, costs, held)[pp_rank]
    return RankCosts(
        forward_ms=tuple(ms * factor for ms in forward[pp_rank::pp]),
        backward_ms=tuple(ms * factor for ms in backward[pp_rank::pp]),
        grad_sync_ms=costs.grad_sync_ms_per_gparam * gparams,
        optimizer_ms=costs.optimizer_ms_per_gparam * gparams,
        memory=memory,
        held_microbatches=int(in_flight[pp_rank].sum()),
    )


def _size(count: float) -> str:
    """PyTorch's ``format_size``."""
    return f"{count / GIB:.2f} GiB" if count >= GIB else f"{count / 2**20:.2f} MiB"


def out_of_memory_message(rank: RankCosts, hbm_gib: float, device: int) -> str:
    """The line PyTorch raises when the rank's peak passes ``hbm_gib``: the allocation that
    fails is one more micro-batch's activations (the optimizer state if none are held)."""
    memory = rank.memory
    held = memory.activations + memory.logits
    request = held / rank.held_microbatches if rank.held_microbatches else memory.optimizer
    capacity = hbm_gib * GIB
    in_use = min(memory.total - request, capacity)
    reserved = max(in_use - memory.overhead, 0.0)  # the overhead is CUDA context and NCCL
    allocated = reserved / _RESERVED_SLACK
    return (
        f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {_size(request)}. "
        f"GPU {device} has a total capacity of {_size(capacity)} of which "
        f"{_size(capacity - in_use)} is free. Including non-PyTorch memory, this process has "
        f"{_size(in_use)} memory in use. Of the allocated memory {_size(allocated)} is "
        f"allocated by PyTorch, and {_size(reserved - allocated)} is reserved by PyTorch but "
        "unallocated. If reserved but unallocated memory is large try setting "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See "
        "documentation for Memory Management  "
        "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
    )


# Timers and logs


class Timers:
    """Megatron's timers on one rank: seconds accumulated per name until reset."""

    def __init__(self) -> None:
        self.seconds: defaultdict[str, float] = defaultdict(float)

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] += time.perf_counter() - start


def timer_block(
    gathered: Sequence[Mapping[str, float]],
    option: str,
    level: int,
    normalizer: float,
) -> str | None:
    """Megatron's timer block over every rank's seconds, each divided by ``normalizer`` seconds
    (log interval x time scale / 1000): ``max`` and ``minmax`` look only at ranks with a value;
    None when nothing was timed, as Megatron prints nothing then."""
    names = [n for n in TIMERS_TO_LOG if level >= (1 if n in _LEVEL1 else 2)]
    ms = {n: [seconds.get(n, 0.0) / normalizer for seconds in gathered] for n in names}
    if option == "all":
        if not any(value > 0 for values in ms.values() for value in values):
            return None
        return timers_all({n: dict(enumerate(v)) for n, v in ms.items()}, TIMER_LOGGER_PREFIX)
    timed = {n: [value for value in values if value > 0] for n, values in ms.items()}
    timed = {n: values for n, values in timed.items() if values}
    if not timed:
        return None
    if option == "max":
        return timers_max({n: max(v) for n, v in timed.items()}, TIMER_LOGGER_PREFIX)
    return timers_minmax({n: (min(v), max(v)) for n, v in timed.items()}, TIMER_LOGGER_PREFIX)


def _losses(model: ModelSpec, iteration: int) -> dict[str, float]:
    """Falling losses under Megatron's names (``lm loss``, ``mtp_1 loss``...); the values mean
    nothing."""
    lm = 11.0 / (1 + 0.01 * iteration)
    return {"lm loss": lm} | {f"mtp_{d} loss": lm * (1 + 0.01 * d)
                              for d in range(1, model.mtp_num_layers + 1)}  # fmt: skip


# One rank


class EmulatedRank:
    """One process of the job: its groups, neighbours, costs, timers and training loop."""

    def __init__(
        self, config: RunConfig, profile: HardwareProfile, rank: int, world_size: int
    ) -> None:
        p = config.parallel
        self.config, self.profile = config, profile
        self.rank, self.world_size = rank, world_size
        per_stage = world_size // p.pp
        self.pp_rank = rank // per_stage
        inner = p.tp * p.cp
        self.dp_rank = rank % per_stage // inner
        self.costs = rank_costs(config, profile.costs, self.pp_rank)
        self.next_rank = (rank + per_stage) % world_size
        self.prev_rank = (rank - per_stage) % world_size
        # TP and CP peers run in lockstep on a real cluster: give them the same noise.
        self.rng = np.random.default_rng([config.seed, self.pp_rank, self.dp_rank])
        self.sigma = math.sqrt(math.log1p(profile.jitter_cv**2))
        self.timers = Timers()
        self.num_stages = p.pp * p.vpp
        self.pp_group: dist.ProcessGroup | None = None
        self.dp_group: dist.ProcessGroup | None = None
        self.send_ms: dict[str, float] = {}

    def connect(self, node: int) -> None:
        """Join the world; build every pipeline and DP group (all ranks, same order); learn
        which neighbours share this rank's node.  Once the nodes are gathered every rank has
        built its groups, so a rank may leave (out of memory) without hanging the others."""
        p = self.config.parallel
        dist.init_process_group(
            "gloo",
            rank=self.rank,
            world_size=self.world_size,
            timeout=timedelta(minutes=self.config.timeout_minutes),
        )
        per_stage = self.world_size // p.pp
        for position in range(per_stage):
            group = dist.new_group(list(range(position, self.world_size, per_stage)))
            if position == self.rank % per_stage:
                self.pp_group = group
        inner = p.tp * p.cp
        for stage in range(p.pp):
            for offset in range(inner):
                members = [stage * per_stage + offset + inner * d for d in range(p.dp)]
                group = dist.new_group(members)
                if self.rank in members:
                    self.dp_group = group
        nodes: list[Any] = [None] * self.world_size
        dist.all_gather_object(nodes, node)
        costs = self.profile.costs
        for transfer, peer in ((SEND_NEXT, self.next_rank), (SEND_PREV, self.prev_rank)):
            same = nodes[peer] == node
            self.send_ms[transfer] = costs.p2p_intra_node_ms if same else costs.p2p_inter_node_ms

    def fits(self) -> bool:
        return self.costs.memory.total <= self.profile.hbm_gib * GIB

    def _sleep(self, ms: float) -> None:
        time.sleep(ms * self.profile.time_scale / 1e3)

    def _barrier(self) -> None:
        if self.config.barrier_with_l1_time:
            dist.barrier()

    def train(self) -> None:
        """Megatron's training loop: a step per iteration, logging at iteration 1 and at every
        multiple of ``--log-interval``.  Starts with a barrier, as Megatron's set-up ends with
        one: a rank that left (out of memory) makes the others fail here."""
        dist.barrier()
        config, p = self.config, self.config.parallel
        program = rank_program(p.pp, self.pp_rank, p.vpp, config.num_microbatches,
                               config.group_size)  # fmt: skip
        started, iterations, logged = time.perf_counter(), 0, 0
        for iteration in range(1, config.train_iters + 1):
            self._step(program)
            iterations += 1
            if iteration == 1 or iteration % config.log_interval == 0:
                per_iteration = (time.perf_counter() - started) / iterations
                self._log(iteration, per_iteration, logged)
                started, iterations, logged = time.perf_counter(), 0, logged + 1

    def _step(self, program: Sequence[Op]) -> None:
        """The pipeline, then DP gradient sync (inside forward-backward, as
        ``finalize_model_grads`` runs in the schedule) and the optimizer step."""
        self._barrier()
        with self.timers("forward-backward"):
            self._pipeline(program)
            self._barrier()
            with self.timers("all-grads-sync"):
                self._sleep(self.costs.grad_sync_ms)
                dist.all_reduce(torch.ones(1), group=self.dp_group)
        self._barrier()
        with self.timers("optimizer"):
            self._sleep(self.costs.optimizer_ms)

    def _pipeline(self, program: Sequence[Op]) -> None:
        arrived: dict[str, set[tuple[int, int]]] = {FORWARD: set(), BACKWARD: set()}
        done: dict[str, tuple[int, int]] = {}  # the latest (micro-batch, stage) of each kind
        for op in program:
            if isinstance(op, Compute):
                self._compute(op, arrived)
                done[op.kind] = (op.microbatch, op.chunk * self.config.parallel.pp + self.pp_rank)
            else:
                with self.timers(P2P_TIMER_OF_CALL[op.name]):
                    self._exchange(op, done, arrived)

    def _compute(self, op: Compute, arrived: Mapping[str, set[tuple[int, int]]]) -> None:
        """Sleep for the chunk's cost with lognormal noise of mean 1, once its input is here."""
        stage = op.chunk * self.config.parallel.pp + self.pp_rank
        source = stage - 1 if op.kind == FORWARD else stage + 1
        if 0 <= source < self.num_stages and (op.microbatch, source) not in arrived[op.kind]:
            raise RuntimeError(
                f"PP rank {self.pp_rank}: {op.kind}{op.microbatch} of chunk {op.chunk} before "
                f"its input from stage {source} arrived"
            )
        forward = op.kind == FORWARD
        ms = (self.costs.forward_ms if forward else self.costs.backward_ms)[op.chunk]
        noise = self.rng.lognormal(-(self.sigma**2) / 2, self.sigma)
        with self.timers(_COMPUTE_TIMERS[0] if forward else _COMPUTE_TIMERS[1]):
            self._sleep(ms * noise)

    def _exchange(
        self,
        call: P2PCall,
        done: Mapping[str, tuple[int, int]],
        arrived: Mapping[str, set[tuple[int, int]]],
    ) -> None:
        """One batched call: the sender sleeps the link's transfer time, then every send and
        receive is posted at once and all are waited for together."""
        sends = [transfer for transfer in call.transfers if transfer in _SENDS]
        if sends:
            self._sleep(max(self.send_ms[transfer] for transfer in sends))
        ops, received = [], []
        for transfer in _POST_ORDER:
            if transfer not in call.transfers:
                continue
            peer = self.next_rank if transfer in (SEND_NEXT, RECV_NEXT) else self.prev_rank
            kind = FORWARD if transfer in (SEND_NEXT, RECV_PREV) else BACKWARD
            if transfer in _SENDS:
                tensor = torch.tensor(done[kind], dtype=torch.float32)
                ops.append(dist.P2POp(dist.isend, tensor, peer, self.pp_group, _TAG[transfer]))
            else:
                tensor = torch.empty(2)
                received.append((kind, tensor))
                ops.append(dist.P2POp(dist.irecv, tensor, peer, self.pp_group, _TAG[transfer]))
        if ops:
            for request in dist.batch_isend_irecv(ops):
                request.wait()
        for kind, tensor in received:
            microbatch, stage = (int(value) for value in tensor.tolist())
            arrived[kind].add((microbatch, stage))

    def _log(self, iteration: int, seconds_per_iteration: float, logged: int) -> None:
        """``training_log``: the iteration line (last rank), memory lines (DP rank 0, first two
        logs) and the timer block (gathered from all ranks, printed by the last)."""
        config, scale = self.config, self.profile.time_scale
        last = self.rank == self.world_size - 1
        if last:
            elapsed_ms = seconds_per_iteration * 1e3 / scale
            batch = config.global_batch_size
            throughput = None
            if config.log_throughput:
                flops = training_flops_per_iteration(config.model, batch)
                throughput = flops / (elapsed_ms / 1e3 * self.world_size * 1e12)
            line = iteration_line(
                iteration,
                config.train_iters,
                iteration * batch,
                elapsed_ms,
                batch,
                _losses(config.model, iteration),
                learning_rate=config.learning_rate,
                throughput_tflops=throughput,
                grad_norm=2.0 / math.sqrt(iteration),
            )
            print(line, flush=True)
        if logged < 2 and self.dp_rank == 0:
            memory = self.costs.memory
            peak_mb = (memory.total - memory.overhead) / 2**20  # PyTorch's allocator only
            static_mb = (memory.weights + memory.gradients + memory.optimizer) / 2**20
            reserved_mb = peak_mb * _RESERVED_SLACK
            line = memory_line(self.rank, iteration, static_mb, peak_mb, reserved_mb, reserved_mb)
            print(line, flush=True)
        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, dict(self.timers.seconds))
        if logged:  # Megatron's quirk: the first logged interval is not reset
            self.timers.seconds.clear()
        if last:
            normalizer = config.log_interval * scale / 1e3
            block = timer_block(gathered, config.timing_log_option, config.timing_log_level,
                                normalizer)  # fmt: skip
            if block is not None:
                print(block, flush=True)


def _env_int(name: str, default: int | None = None) -> int:
    text = os.environ.get(name)
    if text is None and default is not None:
        return default
    if text is None or not text.strip().isdigit():
        raise ConfigError(
            f"environment variable {name} must be a non-negative integer, got {text!r}"
        )
    return int(text)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one rank; 2 for bad input (one line on stderr), 1 for out of memory."""
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        world_size = _env_int("WORLD_SIZE")
        rank = _env_int("RANK")
        if rank >= world_size:
            raise ConfigError(f"RANK {rank} is not below WORLD_SIZE {world_size}")
        config = run_config(argv, world_size)
        if PROFILE_ENV not in os.environ:
            raise ConfigError(f"{PROFILE_ENV} is not set: point it at a hardware profile YAML")
        profile = load_profile(os.environ[PROFILE_ENV])
        emulated = EmulatedRank(config, profile, rank, world_size)
        node = _env_int(NODE_ENV, rank // profile.costs.gpus_per_node)
        device = _env_int("LOCAL_RANK", 0)
    except (ConfigError, LayoutError) as error:
        print(error, file=sys.stderr, flush=True)
        return EXIT_BAD_INPUT
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
    emulated.connect(node)
    if not emulated.fits():
        print(out_of_memory_message(emulated.costs, profile.hbm_gib, device), file=sys.stderr,
              flush=True)  # fmt: skip
        return EXIT_FAILED
    emulated.train()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
