"""The emulated backend: a CPU stand-in for one rank of Megatron-LM's ``pretrain_gpt.py``.

    RAY_LAYOUT_HARDWARE_PROFILE=cluster_configs/hardware/h200_emulated.yaml \\
    RANK=3 WORLD_SIZE=4 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 \\
    python -m launchers.emulated_megatron <the arguments pretrain_gpt.py gets>

It makes the whole tuning loop runnable and testable without GPUs.  The code lives in
``launchers/emulated/``; this module is its entry.  It is independent of the planner's simulator
(``search.schedule``): it takes neither its order of work nor its timing, so that measuring the
emulator tests the planner rather than the planner agreeing with itself.  Two things are shared
as vocabulary: the op types and the schedule's shape (``Compute``, ``P2PCall``, the transfer
names and ``ScheduleShape`` of ``search.pipeline_ops``), so that a test can hold the two orders
side by side, and the memory model
(``search.memory``), since a profile's memory calibration and overhead mean what that model
says.

- the command line is read with Megatron's flag table (``ray_layout.model.megatron_args``): an
  unknown flag, a stray word or a bad value exits 2 with one line on stderr, as Megatron's
  argparse would;
- the order of forward and backward work comes from megatron-core's own
  ``get_pp_rank_microbatches`` and ``get_schedule_table``, with the p2p calls Megatron makes at
  each point; an interleaved job with ``overlap_p2p_comm`` on (Megatron's default there, off
  with ``--no-overlap-p2p-communication``) follows megatron-core's schedule function itself,
  run with stub communicators (``launchers/emulated/megatron_trace.py``): calls that only post
  their sends and receives, and the waits Megatron makes for each later;
- pipeline neighbours exchange real tensors over gloo, batched like Megatron's
  ``batch_isend_irecv`` and waited together (a gloo send completes only once its receive is
  posted, as with NCCL), so bubbles and waits emerge from real concurrency; each tensor carries
  its micro-batch and stage, and a compute whose input has not arrived is an error;
- compute sleeps for each unit's cost in the hardware profile (never FLOP ratios) with per-op
  lognormal jitter; a backward also sleeps the forward work the recompute flags re-run
  (``--recompute-granularity`` and its method, layers and modules), priced as the planner prices
  it (``ray_layout.model.recompute_cost``); a transfer sleeps the profile's intra- or inter-node
  time on the sender; an MTP-standalone layout adds ``mtp_standalone_extra`` to the MTP rank's
  compute; the step tail sleeps in proportion to the rank's parameters (gradient sync, with a
  real all-reduce over the DP group, then the optimizer); every sleep is multiplied by the
  profile's ``time_scale``;
- level-1 timers start with a world barrier, as under Megatron's default
  ``--barrier-with-level-1-timing``, so every step starts together;
- memory: the rank's peak from ``search.memory`` with the profile's calibration and the
  micro-batches in flight of its own order of work; past ``hbm_gib`` the rank prints PyTorch's
  out-of-memory line and exits 1 before training; its peers then fail on gloo ("Connection
  closed by peer", a communication failure to a launcher) and exit 1, as a real job would;
- logs: Megatron's timer blocks (gathered to the last rank, in emulated ms, with the
  first-interval quirk), iteration lines and memory lines (``ray_layout.measure.log_format``).

Environment: ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` (torch's ``env://``
rendezvous), ``LOCAL_RANK`` (the GPU named in the out-of-memory line, default 0),
``RAY_LAYOUT_HARDWARE_PROFILE`` (required), ``RAY_LAYOUT_NODE_RANK`` (the node this rank runs
on, set by a launcher that knows; default ``RANK // gpus_per_node``, which is how torchrun packs
ranks). Global ranks run tp-cp-dp-pp, PP outermost.

Not emulated: evaluation, checkpoints, data loading, tensor/context/expert-parallel
communication (and so ``--overlap-moe-expert-parallel-comm``), ``--overlap-p2p-communication-
warmup-flush``.
"""

import sys

from launchers.emulated.rank_program import main

if __name__ == "__main__":
    sys.exit(main())
