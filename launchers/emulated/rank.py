"""One emulated rank of the job: its groups, neighbours, costs, timers and training loop.

Pipeline neighbours exchange real tensors over gloo, batched like Megatron's
``batch_isend_irecv`` and waited together (a gloo send completes only once its receive is
posted, as with NCCL), or with overlapped p2p posted by one call and waited for later, one by
one, where Megatron waits, so bubbles and waits emerge from real concurrency; each tensor
carries its micro-batch, stage and the time it was sent, and a compute whose input has not
arrived is an error.  Compute lasts its cost with lognormal noise; a transfer lasts the link's
time from when both its ends have posted (each stamps its post time on what it sends: the data
one way, an acknowledgement the other); the step tail runs a real all-reduce over the DP group
and the step ends on one over the world, as the optimizer's grad-norm all-reduce ends it.  Every
cost is multiplied by the profile's ``time_scale`` and kept against deadlines
(:mod:`launchers.emulated.clock`): waits for a peer are real, the time a rank resumes at is the
scheduled one.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
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
from search.pipeline_ops import BACKWARD, FORWARD, Compute, Op, P2PCall, Transfer, Wait

# _batched_p2p_ops posts in this order; tags keep the two directions of a link apart (with
# PP = 2 and interleaving, the next and the previous rank are the same process).
_POST_ORDER = (Transfer.SEND_PREV, Transfer.RECV_PREV, Transfer.SEND_NEXT, Transfer.RECV_NEXT)
_TAG = {Transfer.SEND_NEXT: 1, Transfer.RECV_PREV: 1, Transfer.SEND_PREV: 2, Transfer.RECV_NEXT: 2}
_SENDS = frozenset({Transfer.SEND_NEXT, Transfer.SEND_PREV})
_ACK_TAG = {transfer: tag + 2 for transfer, tag in _TAG.items()}


@dataclass
class _Transfer:
    """One posted send or receive: when this rank posted it, its link, the tensor that comes
    back stamped with the partner's post time, and the kind of item a receive brings."""

    kind: str  # Transfer.SEND_NEXT, Transfer.RECV_PREV, ...
    posted: float
    link_ms: float
    stamped: torch.Tensor
    arrives: str | None  # FORWARD or BACKWARD for a receive
    operations: list[Any]
    requests: list[Any] = field(default_factory=list)


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
            shared = [pipeline_programs(config.schedule_shape)]
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
        for transfer, peer in (
            (Transfer.SEND_NEXT, self.next_rank),
            (Transfer.SEND_PREV, self.prev_rank),
        ):
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
        """The rank's ops in order.  A blocking call waits for its transfers; with overlapped
        p2p a call may only post them (its timer times the posting), and a :class:`Wait` later
        waits for one; a send nobody waits for completes on its own before the step ends."""
        arrived: dict[str, set[tuple[int, int]]] = {FORWARD: set(), BACKWARD: set()}
        done: dict[str, tuple[int, int]] = {}  # the latest (micro-batch, stage) of each kind
        pending: dict[tuple[str, int], _Transfer] = {}  # posted, not yet waited: (kind, n-th)
        posts: dict[str, int] = {}
        forward_chunk = 0  # of the latest forward: a merged backward runs with it
        for op in program:
            if isinstance(op, Compute):
                self._compute(op, arrived, forward_chunk)
                done[op.kind] = (op.microbatch, op.chunk * self.config.parallel.pp + self.pp_rank)
                forward_chunk = op.chunk if op.kind == FORWARD else forward_chunk
            elif isinstance(op, Wait):
                self._complete([pending.pop((op.transfer, op.post))], arrived)
            else:
                with self.timers(P2P_TIMER_OF_CALL[op.name]):
                    transfers = self._post(op, done)
                    if op.blocking:
                        self._complete(transfers, arrived)
                for transfer in transfers if not op.blocking else ():
                    pending[(transfer.kind, posts.get(transfer.kind, 0))] = transfer
                    posts[transfer.kind] = posts.get(transfer.kind, 0) + 1
        for transfer in pending.values():
            for request in transfer.requests:
                request.wait()

    def _compute(
        self, op: Compute, arrived: Mapping[str, set[tuple[int, int]]], forward_chunk: int = 0
    ) -> None:
        """Last the chunk's cost with lognormal noise of mean 1, once its input is here; a
        backward merged with the forward before it (of ``forward_chunk``) less what the merge
        hides, timed as forward-compute as Megatron times the merged step."""
        stage = op.chunk * self.config.parallel.pp + self.pp_rank
        source = stage - 1 if op.kind == FORWARD else stage + 1
        if 0 <= source < self.num_stages and (op.microbatch, source) not in arrived[op.kind]:
            raise RuntimeError(
                f"PP rank {self.pp_rank}: {op.kind}{op.microbatch} of chunk {op.chunk} before "
                f"its input from stage {source} arrived"
            )
        forward = op.kind == FORWARD
        ms = (self.costs.forward_ms if forward else self.costs.backward_ms)[op.chunk]
        if op.merged:
            ms -= self.costs.hidden_ms[forward_chunk][op.chunk]
        noise = self.rng.lognormal(-(self.sigma**2) / 2, self.sigma)
        with self.timers(COMPUTE_TIMERS[0] if forward or op.merged else COMPUTE_TIMERS[1]):
            self.clock.advance(ms * noise)

    def _post(self, call: P2PCall, done: Mapping[str, tuple[int, int]]) -> list[_Transfer]:
        """Post every send and receive of one call at once, each with its acknowledgement the
        other way (batched as ``batch_isend_irecv``); nothing is waited for here."""
        posted = self.clock.now
        transfers = []
        for transfer in _POST_ORDER:
            if transfer not in call.transfers:
                continue
            toward_next = transfer in (Transfer.SEND_NEXT, Transfer.RECV_NEXT)
            peer = self.next_rank if toward_next else self.prev_rank
            link_ms = self.send_ms[Transfer.SEND_NEXT if toward_next else Transfer.SEND_PREV]
            kind = FORWARD if transfer in (Transfer.SEND_NEXT, Transfer.RECV_PREV) else BACKWARD
            group, tag, ack_tag = self.pp_group, _TAG[transfer], _ACK_TAG[transfer]
            if transfer in _SENDS:
                data = torch.tensor([*done[kind], posted], dtype=torch.float64)
                ack = torch.empty(1, dtype=torch.float64)
                ops = [
                    dist.P2POp(dist.isend, data, peer, group, tag),
                    dist.P2POp(dist.irecv, ack, peer, group, ack_tag),
                ]
                transfers.append(_Transfer(transfer, posted, link_ms, ack, None, ops))
            else:
                data = torch.empty(3, dtype=torch.float64)
                ack = torch.tensor([posted], dtype=torch.float64)
                ops = [
                    dist.P2POp(dist.irecv, data, peer, group, tag),
                    dist.P2POp(dist.isend, ack, peer, group, ack_tag),
                ]
                transfers.append(_Transfer(transfer, posted, link_ms, data, kind, ops))
        operations = [op for transfer in transfers for op in transfer.operations]
        if operations:
            requests = iter(dist.batch_isend_irecv(operations))
            for transfer in transfers:
                transfer.requests = [next(requests) for _ in transfer.operations]
        return transfers

    def _complete(
        self, transfers: Sequence[_Transfer], arrived: Mapping[str, set[tuple[int, int]]]
    ) -> None:
        """Wait for posted transfers.  Each starts when both its ends have posted (each learns
        the other's scheduled post time) and lasts the link's time; the rank resumes when the
        last one ends, or at once if all ended while it computed, as in the simulator."""
        latest = self.clock.now
        for transfer in transfers:
            for request in transfer.requests:
                request.wait()
            *sent, partner_posted = transfer.stamped.tolist()
            if transfer.arrives is not None:
                arrived[transfer.arrives].add((int(sent[0]), int(sent[1])))
            start = max(transfer.posted, partner_posted)
            latest = max(latest, start + self.clock.seconds(transfer.link_ms))
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
            block = timer_block(
                gathered, config.timing_log_option, config.timing_log_level, normalizer
            )
            if block is not None:
                print(block, flush=True)
