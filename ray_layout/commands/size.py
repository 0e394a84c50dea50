"""``python -m ray_layout size``: parameters, FLOPs and static memory per unit and per stage."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from rich.console import Console
from rich.table import Table

from ray_layout.commands.common import Command, ModelSettings, emit, json_flag
from ray_layout.commands.config_layout import NOTE, config_layout
from ray_layout.model.layout import Layout, validate_buildable
from ray_layout.model.memory_settings import MemorySettings
from ray_layout.model.sizing import (
    DECODER,
    GIB,
    StageSize,
    parameter_count,
    stage_sizes,
    unit_sizes,
)
from ray_layout.model.spec import ParallelConfig, Recipe
from ray_layout.options.flag_fields import option
from search.memory import static_bytes


@dataclass(frozen=True, kw_only=True)
class SizeSettings(ModelSettings):
    layout: str | None = option(
        None, help="size this layout instead of the config's own (else Megatron's default)"
    )
    as_json: bool = json_flag()


def _billions(count: float) -> str:
    return f"{count / 1e9:.2f}B" if count >= 1e8 else f"{count / 1e6:.2f}M"


def size_report(recipe: Recipe, layout: Layout, layout_source: str) -> dict[str, Any]:
    """Everything ``size`` prints, as plain data (the ``--json`` output)."""
    model, parallel = recipe.model, recipe.parallel
    validate_buildable(
        layout,
        model.num_layers,
        model.mtp_num_layers,
        tied_embeddings=model.tied_embeddings,
    )
    counts = parameter_count(model)
    units = unit_sizes(model, parallel.micro_batch_size, parallel.tp)
    reference = units.get(DECODER) or units.get("t_moe")
    flags = recipe.flags.memory  # the job's optimizer dtypes and offload
    return {
        "model": model.name,
        "parallel": asdict(parallel),
        "parameters": asdict(counts),
        "units": [
            {
                "unit": name,
                "params": unit.params.total,
                "active_params": unit.params.active,
                "forward_gflops_per_microbatch": unit.forward_flops / 1e9,
                "flops_vs_decoder_layer": unit.forward_flops / reference.forward_flops,
                "static_memory_gib": static_bytes(unit.params, parallel, flags).total / GIB,
            }
            for name, unit in units.items()
        ],
        "layout": str(layout),
        "layout_source": layout_source,
        "stages": [
            _stage_row(stage, parallel, flags)
            for stage in stage_sizes(model, parallel, layout.stages)
        ],
    }


def _stage_row(stage: StageSize, parallel: ParallelConfig, flags: MemorySettings) -> dict[str, Any]:
    memory = static_bytes(stage.params, parallel, flags)
    return {
        "pp_rank": stage.pp_rank,
        "units": stage.units,
        "params": stage.params.total,
        "forward_gflops_per_microbatch": stage.forward_flops / 1e9,
        "weights_gib": memory.weights / GIB,
        "gradients_gib": memory.gradients / GIB,
        "optimizer_gib": memory.optimizer / GIB,
        "static_memory_gib": memory.total / GIB,
    }


def print_size(report: dict[str, Any], console: Console) -> None:
    counts = report["parameters"]
    p = report["parallel"]
    console.print(
        f"[bold]{report['model']}[/]: {_billions(counts['total'])} total, "
        f"{_billions(counts['active'])} active parameters "
        f"({'untied output layer counted' if counts['output_layer'] else 'embedding counted once'}"
        + (
            f", MTP apart); MTP layers {_billions(counts['mtp'])}" if counts["mtp"] else "); no MTP"
        ),
        highlight=False,
    )
    console.print(
        "active without embedding and output layer "
        f"{_billions(counts['active_without_embedding_and_output'])} (as GLM and MiniMax count); "
        f"without the input embedding {_billions(counts['active_without_input_embedding'])} "
        "(as gpt-oss counts)",
        highlight=False,
    )
    console.print(
        f"TP={p['tp']} PP={p['pp']} VPP={p['vpp']} CP={p['cp']} EP={p['ep']} ETP={p['etp']} "
        f"DP={p['dp']} micro-batch={p['micro_batch_size']}"
        + (" distributed optimizer" if p["use_distributed_optimizer"] else "")
    )
    units = Table(title="Per unit (one micro-batch, forward)")
    for column in ("unit", "params", "active", "GFLOP fwd", "x t", "static GiB/GPU"):
        units.add_column(column, justify="right")
    for row in report["units"]:
        units.add_row(
            row["unit"],
            _billions(row["params"]),
            _billions(row["active_params"]),
            f"{row['forward_gflops_per_microbatch']:,.0f}",
            f"{row['flops_vs_decoder_layer']:.2f}",
            f"{row['static_memory_gib']:.2f}",
        )
    console.print(units)
    source, _, note = report["layout_source"].partition(NOTE)
    stages = Table(title=f"Per stage of {report['layout']} ({source})", caption=note or None)
    for column in ("PP rank", "units", "params", "GFLOP fwd", "weights", "grads", "optim", "GiB"):
        stages.add_column(column, justify="right")
    for row in report["stages"]:
        stages.add_row(
            str(row["pp_rank"]),
            row["units"],
            _billions(row["params"]),
            f"{row['forward_gflops_per_microbatch']:,.0f}",
            f"{row['weights_gib']:.2f}",
            f"{row['gradients_gib']:.2f}",
            f"{row['optimizer_gib']:.2f}",
            f"{row['static_memory_gib']:.2f}",
        )
    console.print(stages)


def run_size(settings: SizeSettings, console: Console) -> None:
    recipe = settings.recipe()
    if settings.layout:
        layout, source = Layout.parse(settings.layout, recipe.parallel.pp), "given"
    else:
        layout, source = config_layout(recipe, count_fallback=True)
    emit(size_report(recipe, layout, source), settings.as_json, print_size, console)


SIZE = Command("size", "parameters, FLOPs and memory per unit and stage", SizeSettings, run_size)
