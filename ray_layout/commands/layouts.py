"""``python -m ray_layout layouts``: count or list every layout Megatron accepts."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from rich.console import Console

from ray_layout.commands.common import Command, ModelSettings, emit, json_flag
from ray_layout.model.layout import check_interleaving
from ray_layout.model.spec import check_pipeline_stages
from ray_layout.options.checks import MAX_LISTED, between
from ray_layout.options.flag_fields import option
from search.space import LayoutSpace


@dataclass(frozen=True, kw_only=True)
class LayoutsSettings(ModelSettings):
    """The config with its overrides (``--pp``, ``--vpp``, ``--env``, ...), as every command
    that reads a config takes them."""

    count: bool = option(False, help="only count (no enumeration)")
    allow_empty_stages: bool = option(False)
    allow_standalone_mtp: bool = option(False)
    limit: int = option(50, help="list at most N (default 50)", checks=[between(0, MAX_LISTED)])
    as_json: bool = json_flag()


def run_layouts(settings: LayoutsSettings, console: Console) -> None:
    recipe = settings.recipe()
    model, pp, vpp = recipe.model, recipe.parallel.pp, recipe.parallel.vpp
    check_interleaving(pp, vpp, overlap_p2p_comm=recipe.flags.p2p_overlap)
    check_pipeline_stages(pp, vpp, source="--pp, --vpp")
    space = LayoutSpace.of(
        model,
        recipe.parallel,
        allow_empty_stages=settings.allow_empty_stages,
        allow_standalone_mtp=settings.allow_standalone_mtp,
    )
    counted = space.count()
    listed = [] if settings.count else [str(x) for x in itertools.islice(space, settings.limit)]
    report = {
        "valid": counted.valid,
        "mtp_standalone": counted.standalone,
        "in_space": counted.total,
        "layouts": listed,
    }

    def show(report: dict[str, Any], console: Console) -> None:
        stages = (
            " (empty stages allowed)" if settings.allow_empty_stages else ", every stage non-empty"
        )
        standalone_note = (
            "kept"
            if settings.allow_standalone_mtp
            else f"left out, {counted.total:,} remain; --allow-standalone-mtp keeps them"
        )
        console.print(
            f"{counted.valid:,} valid layouts for {model.num_layers} decoder + "
            f"{model.mtp_num_layers} MTP layers on PP={pp} VPP={vpp}"
            f"{stages}; "
            f"{counted.standalone:,} of them MTP-standalone ({standalone_note})",
            highlight=False,
        )
        standalone_kept = settings.allow_standalone_mtp and model.mtp_num_layers
        if standalone_kept and vpp > 1 and space.first_mtp_stage == space.num_stages - 1:
            console.print(
                "MTP stays on the last rank: with tied embeddings and VPP > 1, megatron-core "
                "0.16.1 cannot build it elsewhere (docs/layouts.md)",
                highlight=False,
            )
        for text in listed:
            console.print(text, highlight=False, markup=False)
        if listed and counted.total > len(listed):
            console.print(f"... {counted.total - len(listed):,} more (--limit N)")

    emit(report, settings.as_json, show, console)


LAYOUTS = Command("layouts", "count or list every valid layout", LayoutsSettings, run_layouts)
