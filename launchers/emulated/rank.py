"""One emulated rank of the job: its groups, neighbours, costs, timers and training loop.

Pipeline neighbours exchange real tensors over gloo, batched like Megatron's
``batch_isend_irecv`` and waited together (a gloo send completes only once its receive is
posted, as with NCCL), so bubbles and waits emerge from real concurrency; each tensor carries its
micro-batch and stage, and a compute whose input has not arrived is an error.  Compute sleeps
for its cost with lognormal noise, a transfer sleeps the link's time on the sender, the step tail
runs a real all-reduce over the DP group; every sleep is multiplied by the profile's
``time_scale``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from launchers.emulated.config import RunConfig
from launchers.emulated.costs import rank_costs
from launchers.emulated.logs import (
    COMPUTE_TIMERS,
    Timers,
    iteration_report,
    memory_report,
    timer_block,
)
from launchers.emulated.profile import HardwareProfile
from launchers.emulated.schedule import rank_program
from ray_layout.measure.log_format import P2P_TIMER_OF_CALL
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

# _batched_p2p_ops posts in this order; tags keep the two directions of a link apart (with
# PP = 2 and interleaving, the next and the previous rank are the same process).
_POST_ORDER = (SEND_PREV, RECV_PREV, SEND_NEXT, RECV_NEXT)
_TAG = {SEND_NEXT: 1, RECV_PREV: 1, SEND_PREV: 2, RECV_NEXT: 2}
_SENDS = frozenset({SEND_NEXT, SEND_PREV})


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
        with self.timers(COMPUTE_TIMERS[0] if forward else COMPUTE_TIMERS[1]):
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
            print(iteration_report(config, iteration, elapsed_ms, self.world_size), flush=True)
        if logged < 2 and self.dp_rank == 0:
            print(memory_report(self.rank, iteration, self.costs.memory), flush=True)
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
