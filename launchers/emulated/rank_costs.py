"""What one emulated rank costs: its chunks' compute, its step tail and its peak memory.

Compute comes from the hardware profile's unit costs, never from FLOP ratios; a backward also
re-runs the forward work the job's recompute flags cover, priced by the rule the planner uses
(``ray_layout.model.recompute_cost``), as a GPU's backward would.  Peak memory is
the planner's memory model (``search.memory``) under the profile's calibration, with the
micro-batches in flight counted on this emulator's own order of work: the model is shared
because it is what a profile's memory numbers mean (``memory_calibration``, overhead); the
simulator's order and timing are not used.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from launchers.emulated.config import RunConfig
from launchers.emulated.rank_order import held_at_peak, pipeline_programs
from ray_layout.model.costs import UnitCosts, stage_compute_ms
from ray_layout.model.layout import MTP
from ray_layout.model.sizing import stage_sizes
from search.cost_model import build_cost_model
from search.memory import StageMemory, stage_memory
from search.pipeline_ops import Op
from search.space import LayoutSpace

RESERVED_SLACK = 1.05  # the caching allocator reserves a little more than it hands out


@dataclass(frozen=True)
class RankCosts:
    """One PP rank's emulated milliseconds (before jitter and time scale) and memory."""

    forward_ms: tuple[float, ...]  # one micro-batch through each of the rank's chunks
    backward_ms: tuple[float, ...]  # recomputation included
    grad_sync_ms: float
    optimizer_ms: float
    memory: StageMemory
    held_microbatches: int  # micro-batches whose activations the rank holds at its peak
    # [forward chunk][backward chunk]: what a merged step of combined 1F1B hides (all 0 without)
    hidden_ms: tuple[tuple[float, ...], ...] = ()


def rank_costs(
    config: RunConfig,
    costs: UnitCosts,
    pp_rank: int,
    programs: Sequence[Sequence[Op]] | None = None,
) -> RankCosts:
    """Compute, step tail and peak memory of PP rank ``pp_rank`` under ``costs``; ``programs``
    are every PP rank's order of work (default: computed here, see ``pipeline_programs``)."""
    layout, pp = config.layout, config.parallel.pp
    forward, backward = stage_compute_ms(costs, config.model, layout.stages, config.memory)
    holds_mtp = MTP in "".join(layout.rank_chunks(pp_rank))
    factor = costs.mtp_standalone_factor if layout.mtp_standalone and holds_mtp else 1.0
    stage = stage_sizes(config.model, config.parallel, layout.stages)[pp_rank]
    gparams = stage.gpu_gigaparams
    if programs is None:
        programs = pipeline_programs(config.schedule_shape)
    held = [held_at_peak(program, layout.vpp) for program in programs]
    memory = stage_memory(config.model, config.parallel, layout, costs, held, config.memory)[
        pp_rank
    ]
    return RankCosts(
        forward_ms=tuple(ms * factor for ms in forward[pp_rank::pp]),
        backward_ms=tuple(ms * factor for ms in backward[pp_rank::pp]),
        grad_sync_ms=costs.grad_sync_ms_per_gparam * gparams,
        optimizer_ms=costs.optimizer_ms_per_gparam * gparams,
        memory=memory,
        held_microbatches=sum(held[pp_rank].values()),
        hidden_ms=_hidden(config, costs, pp_rank),
    )


def _hidden(config: RunConfig, costs: UnitCosts, pp_rank: int) -> tuple[tuple[float, ...], ...]:
    """[forward chunk][backward chunk] ms a merged step on this rank hides: the planner's
    two-stream model of a merged layer pair (``search.combined``) over the rank's chunks, as a
    GPU's streams would run it, the emulator having no streams of its own."""
    layout, vpp = config.layout, config.layout.vpp
    if not config.ep_overlap.on:
        return tuple((0.0,) * vpp for _ in range(vpp))
    model = build_cost_model(
        config.model,
        config.parallel,
        costs,
        config.num_microbatches,
        config.group_size,
        config.memory,
        config.ep_overlap,
    )
    space, cuts = LayoutSpace.holding(layout)
    counts = space.unit_counts(cuts[None], model.units, model.moe_pattern)
    hidden = model.merge.hidden_ms(counts, config.parallel.pp, vpp)[:, 0]
    first = pp_rank * vpp * vpp
    return tuple(tuple(hidden[first + f * vpp : first + (f + 1) * vpp]) for f in range(vpp))
