"""The layouts every plan and tune is compared with, by name, and two of them built here:
Megatron's default split and the count rule (the config's own, *current* layout is
``model.split``'s).

Megatron's default (no layout string) gives each PP rank ``num_layers / PP`` decoder layers,
split evenly over its virtual chunks, with the embedding on the first stage and every MTP layer,
the output layer and the loss on the last (``transformer_block.get_num_layers_to_build``).  The
count-based rule ("auto layout" of Megatron Lite) counts E, each m and L as one layer each and
cuts the units as evenly as possible over every virtual stage, earlier stages taking the
remainder.
"""

from __future__ import annotations

from enum import StrEnum

from ray_layout.errors import LayoutError
from ray_layout.model.layout import DECODER, EMBEDDING, LOSS, MTP, Layout, validate


class BaselineName(StrEnum):
    """The baselines, in the order they are shown; string values, so the store, the JSON and the
    report keep the very names they hold."""

    CURRENT = "current"  # the layout the config's own split gives (model.split.current_layout)
    DEFAULT = "Megatron default"
    COUNT_BASED = "count-based rule"

    @property
    def short(self) -> str:
        """The one word for it where the full name does not fit: an A/B arm's name, a JSON key
        (``speedup_vs_count_based``), a table column; the only long-to-short map."""
        return _SHORT[self]


_SHORT = {
    BaselineName.CURRENT: "current",
    BaselineName.DEFAULT: "default",
    BaselineName.COUNT_BASED: "count-based",
}


def megatron_default(
    num_layers: int,
    mtp_num_layers: int,
    pp: int,
    vpp: int = 1,
    *,
    account_for_embedding: bool = False,
    account_for_loss: bool = False,
    first_stage_layers: int | None = None,
    last_stage_layers: int | None = None,
) -> Layout:
    """The layout Megatron builds without ``--pipeline-model-parallel-layout``, or a
    :class:`LayoutError` saying why Megatron would refuse the configuration."""
    uneven = first_stage_layers is not None or last_stage_layers is not None
    if uneven and (account_for_embedding or account_for_loss):
        raise LayoutError(
            "Megatron rejects --decoder-first/last-pipeline-num-layers together with "
            "--account-for-embedding/loss-in-pipeline-split"
        )
    per_rank = [0] * pp
    if uneven:
        middle_layers, middle_ranks = num_layers, pp
        for rank, count, flag in (
            (0, first_stage_layers, "--decoder-first-pipeline-num-layers"),
            (pp - 1, last_stage_layers, "--decoder-last-pipeline-num-layers"),
        ):
            if count is None:
                continue
            if count <= 0:
                raise LayoutError(f"{flag} must be > 0, got {count}")
            if count % vpp:
                raise LayoutError(f"{flag} {count} is not divisible by VPP={vpp}")
            per_rank[rank] = count
            middle_layers -= count
            middle_ranks -= 1
        if middle_layers < 0:
            raise LayoutError(
                f"first + last stage layers exceed the model's {num_layers} decoder layers"
            )
        if bool(middle_layers) != bool(middle_ranks) or (
            middle_ranks and middle_layers % middle_ranks
        ):
            raise LayoutError(
                f"{middle_layers} remaining decoder layers cannot be split evenly over "
                f"{middle_ranks} middle stages"
            )
        for rank in range(pp):
            is_set = (rank == 0 and first_stage_layers is not None) or (
                rank == pp - 1 and last_stage_layers is not None
            )
            if not is_set:
                per_rank[rank] = middle_layers // middle_ranks
    else:
        slots = num_layers + account_for_embedding + account_for_loss
        if slots % pp:
            counted = " + ".join(
                [f"{num_layers} decoder layers"]
                + (["the embedding"] if account_for_embedding else [])
                + (["the loss"] if account_for_loss else [])
            )
            raise LayoutError(
                f"Megatron has no default split: {counted} = {slots} is not divisible by "
                f"PP={pp}; a layout string is needed"
            )
        per_rank = [slots // pp] * pp
    if any(count % vpp for count in per_rank):
        raise LayoutError(
            f"Megatron has no default split: per-rank layer counts {per_rank} are not divisible "
            f"by VPP={vpp}"
        )
    counts = [per_rank[stage % pp] // vpp for stage in range(pp * vpp)]
    if account_for_embedding:
        counts[0] -= 1
    if account_for_loss:
        counts[-1] -= 1
    if min(counts) < 0:
        raise LayoutError("not enough layers for the embedding/loss slot on the first/last stage")
    stages = [DECODER * count for count in counts]
    stages[0] = EMBEDDING + stages[0]
    stages[-1] = stages[-1] + MTP * mtp_num_layers + LOSS
    return Layout(tuple(stages), pp)


def count_based(num_layers: int, mtp_num_layers: int, pp: int, vpp: int = 1) -> Layout:
    """E, every t, every m and L count one unit each, cut over the PP x VPP stages in Megatron's
    flat order (a layout of that VPP): stage s takes ``base + (s < rem)`` units.  A
    :class:`LayoutError` where the cut is one Megatron refuses (the MTP block split)."""
    units = EMBEDDING + DECODER * num_layers + MTP * mtp_num_layers + LOSS
    count = pp * vpp
    base, remainder = divmod(len(units), count)
    if base == 0:
        where = f"PP={pp}" if vpp == 1 else f"PP={pp} x VPP={vpp} = {count}"
        raise LayoutError(f"{len(units)} units cannot fill {where} stages")
    stages, start = [], 0
    for stage in range(count):
        size = base + (1 if stage < remainder else 0)
        stages.append(units[start : start + size])
        start += size
    layout = Layout(tuple(stages), pp)
    try:
        validate(layout, num_layers, mtp_num_layers)
    except LayoutError as exc:
        raise LayoutError(
            f"the count-based rule gives {layout}, which Megatron refuses: {exc}"
        ) from None
    return layout
