"""One rank's training with megatron-core's own parts: DDP, optimizer, schedule and timers.

The loop is Megatron-LM's ``train_step`` and ``training_log`` cut to what a profiling run needs:
zero the grad buffers, ``get_forward_backward_func()`` over synthetic micro-batches, the
optimizer step, then the step's end at the slowest rank's logical clock; at iteration 1 and at
every ``--log-interval`` the iteration line (last rank), memory lines (DP rank 0, first two logs)
and megatron-core's ``Timers.log`` block over every rank.
"""

from __future__ import annotations

import logging
import resource
import sys
from collections.abc import Iterator, Sequence
from functools import partial
from typing import Any

from launchers.emulated.config import RunConfig
from launchers.emulated.log_lines import TIMERS_TO_LOG
from launchers.megatron_core.logical_clock import LogicalClock
from launchers.megatron_core.op_trace import OpTrace
from ray_layout.measure.log_format import iteration_line, memory_line
from ray_layout.model.sizing import training_flops_per_iteration


def synthetic_batches(run: RunConfig, seed: int) -> Iterator[dict[str, Any]]:
    """Micro-batches of random tokens with an explicit causal mask (megatron-core's default
    mask helper is CUDA-only); the same ``seed`` gives every stage the same sequence."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    mbs, seq, vocab = run.parallel.micro_batch_size, run.model.seq_length, run.model.vocab_size
    mask = torch.triu(torch.ones(seq, seq, dtype=torch.bool), diagonal=1).view(1, 1, seq, seq)
    positions = torch.arange(seq).unsqueeze(0).expand(mbs, seq)
    while True:
        text = torch.randint(0, vocab, (mbs, seq + 1), generator=generator)
        yield {
            "tokens": text[:, :-1].contiguous(),
            "labels": text[:, 1:].contiguous(),
            "loss_mask": torch.ones(mbs, seq),
            "attention_mask": mask,
            "position_ids": positions,
        }


def _loss(loss_mask: Any, output: Any) -> tuple[Any, Any, dict[str, Any]]:
    """Megatron-LM's GPT loss: summed over tokens, with the token count for the schedule."""
    import torch

    mask = loss_mask.view(-1).float()
    loss = torch.sum(output.float().view(-1) * mask)
    tokens = mask.sum().to(torch.int)
    report = torch.cat([loss.detach().view(1), tokens.float().view(1)])
    return loss, tokens, {"lm loss": report}


def forward_step(
    timers: Any, trace: OpTrace | None, data_iterator: Iterator[dict[str, Any]], model: Any
) -> Any:
    """``pretrain_gpt.py``'s forward step: a batch, the model, the loss function."""
    if trace is not None:
        trace.forward(model)
    timers("batch-generator", log_level=2).start()
    batch = next(data_iterator)
    timers("batch-generator").stop()
    output = model(
        batch["tokens"],
        batch["position_ids"],
        batch["attention_mask"],
        labels=batch["labels"],
        loss_mask=batch["loss_mask"],
    )
    return output, partial(_loss, batch["loss_mask"])


class CoreTrainer:
    """The training loop of one rank over its model chunks (DDP-wrapped) and optimizer."""

    def __init__(
        self,
        run: RunConfig,
        chunks: Sequence[Any],
        optimizer: Any,
        clock: LogicalClock,
        trace: OpTrace | None = None,
    ) -> None:
        import torch.distributed as dist
        from megatron.core import parallel_state
        from megatron.core.timers import Timers

        self.run, self.chunks, self.optimizer, self.clock = run, list(chunks), optimizer, clock
        self.trace = trace
        self.timers = Timers(run.timing_log_level, run.timing_log_option)
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.dp_rank = parallel_state.get_data_parallel_rank()
        seed = run.seed + 1000 * self.dp_rank
        self.iterators = [synthetic_batches(run, seed) for _ in self.chunks]
        self.losses: list[dict[str, Any]] = []
        self.grad_norm: float | None = None
        _timer_logger()

    def configure(self, config: Any) -> None:
        """What Megatron-LM's ``setup_model_and_optimizer`` and ``train`` set on the config."""
        from megatron.core.distributed import finalize_model_grads

        config.timers = self.timers
        config.barrier_with_L1_time = self.run.barrier_with_l1_time
        config.finalize_model_grads_func = finalize_model_grads
        config.grad_scale_func = self.optimizer.scale_loss
        no_sync = [chunk.no_sync for chunk in self.chunks]
        config.no_sync_func = no_sync if len(no_sync) > 1 else no_sync[0]

    def train(self) -> None:
        """Every iteration, logging at 1 and at multiples of ``--log-interval``."""
        run = self.run
        started, iterations, logged = self._end_step(), 0, 0
        for iteration in range(1, run.train_iters + 1):
            self.step()
            ended = self._end_step()
            iterations += 1
            if iteration == 1 or iteration % run.log_interval == 0:
                with self.clock.hold():
                    self._log(iteration, (ended - started) / iterations, logged)
                started, iterations, logged = ended, 0, logged + 1

    def step(self) -> None:
        """Megatron-LM's ``train_step``: grads zeroed, forward-backward, the optimizer step."""
        from megatron.core.pipeline_parallel import get_forward_backward_func

        run, timers = self.run, self.timers
        for chunk in self.chunks:
            chunk.zero_grad_buffer()
        self.optimizer.zero_grad()
        # the schedule times itself under "forward-backward" (megatron-core 0.16.1)
        self.losses = get_forward_backward_func()(
            forward_step_func=partial(forward_step, timers, self.trace),
            data_iterator=self.iterators if len(self.chunks) > 1 else self.iterators[0],
            model=self.chunks if len(self.chunks) > 1 else self.chunks[0],
            num_microbatches=run.num_microbatches,
            seq_length=run.model.seq_length,
            micro_batch_size=run.parallel.micro_batch_size,
            forward_only=False,
        )
        timers("optimizer", log_level=1).start(barrier=run.barrier_with_l1_time)
        _, grad_norm, _ = self.optimizer.step()
        timers("optimizer").stop()
        self.grad_norm = None if grad_norm is None else float(grad_norm)

    def _end_step(self) -> float:
        """The step ends at the slowest rank's clock (the optimizer's grad-norm all-reduce)."""
        import torch
        import torch.distributed as dist

        with self.clock.hold():
            latest = torch.tensor([self.clock.now()], dtype=torch.float64)
            dist.all_reduce(latest, op=dist.ReduceOp.MAX)
        self.clock.reach(latest.item())
        return latest.item()

    def _log(self, iteration: int, seconds_per_iteration: float, logged: int) -> None:
        """``training_log``: the iteration line, memory lines and the timer block."""
        run = self.run
        if self.rank == self.world_size - 1:
            print(self._iteration_text(iteration, seconds_per_iteration * 1e3), flush=True)
        if logged < 2 and self.dp_rank == 0:
            print(_memory_text(self.rank, iteration), flush=True)
        # Megatron's quirk, as the emulator keeps it: the first logged interval is not reset
        self.timers.log(list(TIMERS_TO_LOG), normalizer=run.log_interval, reset=bool(logged))
        sys.stdout.flush()

    def _iteration_text(self, iteration: int, elapsed_ms: float) -> str:
        run = self.run
        batch = run.global_batch_size
        throughput = None
        if run.log_throughput:
            flops = training_flops_per_iteration(run.model, batch)
            throughput = flops / (elapsed_ms / 1e3 * self.world_size * 1e12)
        return iteration_line(
            iteration,
            run.train_iters,
            iteration * batch,
            elapsed_ms,
            batch,
            _mean_losses(self.losses),
            learning_rate=run.learning_rate,
            throughput_tflops=throughput,
            grad_norm=self.grad_norm,
        )


def _mean_losses(losses: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Each loss over the step's micro-batches: summed loss over summed tokens."""
    totals: dict[str, list[float]] = {}
    for reported in losses:
        for name, value in reported.items():
            loss, tokens = (float(v) for v in value.view(-1)[:2])
            total = totals.setdefault(name, [0.0, 0.0])
            total[0] += loss
            total[1] += tokens
    return {name: loss / max(tokens, 1.0) for name, (loss, tokens) in totals.items()}


def _memory_text(rank: int, iteration: int) -> str:
    """Megatron's memory line with the process's resident memory in place of CUDA's allocator
    (current RSS as allocated and reserved, peak RSS as their maxima)."""
    with open("/proc/self/statm") as statm:
        resident_pages = int(statm.read().split()[1])
    current_mb = resident_pages * resource.getpagesize() / 2**20
    peak_mb = max(current_mb, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10)
    return memory_line(rank, iteration, current_mb, peak_mb, current_mb, peak_mb)


def _timer_logger() -> None:
    """megatron-core's timers log at INFO: print them as Python's default format does."""
    logger = logging.getLogger("megatron.core.timers")
    if any(getattr(h, "_ray_layout", False) for h in logger.handlers):
        return
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("%(levelname)s:%(name)s:%(message)s"))
    handler._ray_layout = True  # type: ignore[attr-defined]
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
