"""One emulated rank of the job: its groups, neighbours, costs, timers and training loop.

Pipeline neighbours exchange real tensors over gloo, batched like Megatron's
``batch_isend_irecv`` and waited together (a gloo send completes only once its receive is
posted, as with NCCL), so bubbles and waits emerge from real concurrency; each tensor carries its
micro-batch, stage and the time it was sent, and a compute whose input has not arrived is an
error.  Compute lasts its cost with lognormal noise; a transfer lasts the link's time from
when both its ends have posted (each stamps its post time on what it sends: the data one way,
an acknowledgement the other); the step tail runs a real all-reduce over the DP group and the
step ends on one over the world, as the optimizer's grad-norm all-reduce ends it.  Every cost
is multiplied by the profile's ``time_scale`` and kept against deadlines
(:mod:`launchers.emulated.clock`): waits for a peer are real, the time a rank resumes at is
the scheduled one.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from launchers.emulated.clock import Clock
from launchers.emulated.config import RunConfig
from launchers.emulated.hardware import HardwareProfile
from launchers.emulated.log_lines import (
    COMPUTE_TIMERS,
    Timers,
    iteration_report,
    memory_report,
    timer_block,
)
from launchers.emulated.rank_costs import RankCosts, rank_costs
from launchers.emulated.rank_order import pipeline_programs
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
_ACK_TAG = {transfer: tag + 2 for transfer, tag in _TAG.items()}


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
        self.costs: RankCosts  # known once connected (see :meth:`connect`)
        self.program: list[Op] = []
        self.next_rank = (rank + per_stage) % world_size
        self.prev_rank = (rank - per_stage) % world_size
        # TP and CP peers run in lockstep on a real cluster: give them the same noise.
        self.rng = np.random.default_rng([config.seed, self.pp_rank, self.dp_rank])
        self.sigma = math.sqrt(math.log1p(profile.jitter_cv**2))
        self.clock = Clock(profile.time_scale)
        self.timers = Timers(lambda: self.clock.now)
        self.num_stages = p.pp * p.vpp
        self.pp_group: dist.ProcessGroup | None = None
        self.dp_group: dist.ProcessGroup | None = None
        self.send_ms: dict[str, float] = {}

    def connect(self, node: int) -> None:
        """Join the world; take this rank's order of work and costs from the programs rank 0
        computed for the whole pipeline; build every pipeline and DP group (all ranks, same
        order); learn which neighbours share this rank's node.  Once the nodes are gathered
        every rank has built its groups, so a rank may leave (out of memory) without hanging
        the others."""
        config, p = self.config, self.config.parallel
        dist.init_process_group(
            "gloo",
            rank=self.rank,
            world_size=self.world_size,
            timeout=timedelta(minutes=config.timeout_minutes),
        )
        shared: list[Any] = [None]
        if self.rank == 0:
            shared = [pipeline_programs(p.pp, p.vpp, config.num_microbatches, config.group_size)]
        dist.broadcast_object_list(shared, src=0)
        programs = shared[0]
        self.program = programs[self.pp_rank]
        self.costs = rank_costs(config, self.profile.costs, self.pp_rank, programs)
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

    def _synchronize(self, group: dist.ProcessGroup | None) -> None:
        """A real all-reduce over ``group`` that leaves every member at the latest one's
        scheduled time."""
        latest = torch.tensor([self.clock.now], dtype=torch.float64)
        dist.all_reduce(latest, op=dist.ReduceOp.MAX, group=group)
        self.clock.reach(latest.item())

    def _barrier(self) -> None:
        if self.config.barrier_with_l1_time:
            self._synchronize(None)

    def train(self) -> None:
        """Megatron's training loop: a step per iteration, logging at iteration 1 and at every
        multiple of ``--log-interval``.  Starts with a barrier, as Megatron's set-up ends with
        one: a rank that left (out of memory) makes the others fail here."""
        dist.barrier()
        config = self.config
        self._start_together()
        started, iterations, logged = self.clock.now, 0, 0
        for iteration in range(1, config.train_iters + 1):
            self._step(self.program)
            iterations += 1
            if iteration == 1 or iteration % config.log_interval == 0:
                per_iteration = (self.clock.now - started) / iterations
                self._log(iteration, per_iteration, logged)
                self._start_together()  # logging is real work, not emulated
                started, iterations, logged = self.clock.now, 0, logged + 1
        print(self.clock.summary(self.rank), file=sys.stderr, flush=True)

    def _start_together(self) -> None:
        self.clock.anchor()
        self._synchronize(None)

    def _step(self, program: Sequence[Op]) -> None:
        """The pipeline, then DP gradient sync (inside forward-backward, as
        ``finalize_model_grads`` runs in the schedule) and the optimizer step."""
        self._barrier()
        with self.timers("forward-backward"):
            self._pipeline(program)
            self._barrier()
            with self.timers("all-grads-sync"):
                self.clock.advance(self.costs.grad_sync_ms)
                self._synchronize(self.dp_group)
        self._barrier()
        with self.timers("optimizer"):
            self.clock.advance(self.costs.optimizer_ms)
        self._synchronize(None)  # the optimizer's grad-norm all-reduce: the step ends together

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
        """Last the chunk's cost with lognormal noise of mean 1, once its input is here."""
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
            self.clock.advance(ms * noise)

    def _exchange(
        self,
        call: P2PCall,
        done: Mapping[str, tuple[int, int]],
        arrived: Mapping[str, set[tuple[int, int]]],
    ) -> None:
        """One batched call: every send and receive is posted at once, each with its
        acknowledgement the other way, and all are waited for together.  A transfer starts when
        both its ends have posted (each learns the other's scheduled post time) and lasts the
        link's time; the call ends when its last transfer does, as in the simulator."""
        posted = self.clock.now
        ops, ends = [], []
        for transfer in _POST_ORDER:
            if transfer not in call.transfers:
                continue
            toward_next = transfer in (SEND_NEXT, RECV_NEXT)
            peer = self.next_rank if toward_next else self.prev_rank
            link_ms = self.send_ms[SEND_NEXT if toward_next else SEND_PREV]
            kind = FORWARD if transfer in (SEND_NEXT, RECV_PREV) else BACKWARD
            group, tag, ack_tag = self.pp_group, _TAG[transfer], _ACK_TAG[transfer]
            if transfer in _SENDS:
                data = torch.tensor([*done[kind], posted], dtype=torch.float64)
                ack = torch.empty(1, dtype=torch.float64)
                ends.append((link_ms, ack, None))
                ops.append(dist.P2POp(dist.isend, data, peer, group, tag))
                ops.append(dist.P2POp(dist.irecv, ack, peer, group, ack_tag))
            else:
                data = torch.empty(3, dtype=torch.float64)
                ack = torch.tensor([posted], dtype=torch.float64)
                ends.append((link_ms, data, kind))
                ops.append(dist.P2POp(dist.irecv, data, peer, group, tag))
                ops.append(dist.P2POp(dist.isend, ack, peer, group, ack_tag))
        if not ops:
            return
        for request in dist.batch_isend_irecv(ops):
            request.wait()
        latest = posted
        for link_ms, stamped, kind in ends:
            *sent, partner_posted = stamped.tolist()
            if kind is not None:
                arrived[kind].add((int(sent[0]), int(sent[1])))
            latest = max(latest, max(posted, partner_posted) + self.clock.seconds(link_ms))
        self.clock.reach(latest)

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
