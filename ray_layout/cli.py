"""``python -m ray_layout``: size a model, list its layouts, validate a layout string.

Each command is a plain function from parsed arguments to printed output; the pure work lives in
``model``, ``sizing``, ``layout``, ``baselines`` and ``search.space``.  Bad input raises
``ConfigError``/``LayoutError``, which :func:`main` turns into one line on stderr and exit 2.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict, replace
from typing import Any

from rich.console import Console
from rich.table import Table

from ray_layout.baselines import count_based, megatron_default
from ray_layout.layout import Layout, LayoutError, placement_problems, pretty, validate
from ray_layout.loading import load_recipe
from ray_layout.model import ConfigError, Recipe, with_parallel
from ray_layout.sizing import (
    DECODER,
    StageSize,
    parameter_count,
    stage_sizes,
    static_memory,
    unit_sizes,
)
from search.space import LayoutSpace

EXIT_BAD_INPUT = 2
GIB = 2**30


def check_interleaving(pp: int, vpp: int, overlap_p2p_comm: bool = False) -> None:
    """``arguments.py:validate_args``: interleaving needs PP > 2, or PP > 1 with p2p overlap."""
    if vpp > 1 and pp <= (1 if overlap_p2p_comm else 2):
        raise LayoutError(
            f"Megatron's interleaved schedule (VPP={vpp}) needs PP > 2"
            + ("" if overlap_p2p_comm else " (PP > 1 with --overlap-p2p-communication)")
            + f", got PP={pp}"
        )


def _billions(count: float) -> str:
    return f"{count / 1e9:.2f}B" if count >= 1e8 else f"{count / 1e6:.2f}M"


def _default_or_count_layout(recipe: Recipe) -> tuple[Layout, str]:
    """Megatron's default split, or the count-based rule where Megatron has none."""
    m, p = recipe.model, recipe.parallel
    try:
        return megatron_default(m.num_layers, m.mtp_num_layers, p.pp, p.vpp), "Megatron default"
    except LayoutError as exc:
        if p.vpp > 1:
            raise
        layout = count_based(m.num_layers, m.mtp_num_layers, p.pp)
        return layout, f"count-based rule; {exc}"


def _recipe_from_args(args: argparse.Namespace) -> Recipe:
    recipe = load_recipe(args.config)
    overrides = {
        "tp": args.tp,
        "pp": args.pp,
        "vpp": args.vpp,
        "cp": args.cp,
        "ep": args.ep,
        "etp": args.etp,
        "dp": args.dp,
        "micro_batch_size": args.micro_batch_size,
        "global_batch_size": args.global_batch_size,
    }
    if args.seq_length is not None:
        if args.seq_length < 1:
            raise ConfigError(f"--seq-length must be >= 1, got {args.seq_length}")
        recipe = replace(recipe, model=replace(recipe.model, seq_length=args.seq_length))
    return with_parallel(recipe, **overrides)


def size_report(recipe: Recipe, layout: Layout, layout_source: str) -> dict[str, Any]:
    """Everything ``size`` prints, as plain data (the ``--json`` output)."""
    model, parallel = recipe.model, recipe.parallel
    validate(layout, model.num_layers, model.mtp_num_layers)
    counts = parameter_count(model)
    units = unit_sizes(model, parallel.micro_batch_size, parallel.tp)
    reference = units.get(DECODER) or units.get("t_moe")
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
                "static_memory_gib": static_memory(unit.params, parallel).total / GIB,
            }
            for name, unit in units.items()
        ],
        "layout": str(layout),
        "layout_source": layout_source,
        "stages": [_stage_row(stage) for stage in stage_sizes(model, parallel, layout.stages)],
    }


def _stage_row(stage: StageSize) -> dict[str, Any]:
    return {
        "pp_rank": stage.pp_rank,
        "units": stage.units,
        "params": stage.params.total,
        "forward_gflops_per_microbatch": stage.forward_flops / 1e9,
        "weights_gib": stage.memory.weights / GIB,
        "gradients_gib": stage.memory.gradients / GIB,
        "optimizer_gib": stage.memory.optimizer / GIB,
        "static_memory_gib": stage.memory.total / GIB,
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
    source, _, note = report["layout_source"].partition("; ")
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


def cmd_size(args: argparse.Namespace, console: Console) -> None:
    recipe = _recipe_from_args(args)
    if args.layout:
        layout, source = Layout.parse(args.layout, recipe.parallel.pp), "given"
    else:
        layout, source = _default_or_count_layout(recipe)
    report = size_report(recipe, layout, source)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_size(report, console)


def cmd_layouts(args: argparse.Namespace, console: Console) -> None:
    model = load_recipe(args.config).model
    check_interleaving(args.pp, args.vpp)
    space = LayoutSpace(
        model.num_layers,
        model.mtp_num_layers,
        args.pp,
        args.vpp,
        allow_empty_stages=args.allow_empty_stages,
        allow_standalone_mtp=args.allow_standalone_mtp,
    )
    counted = space.count()
    listed = [] if args.count else [str(layout) for layout in itertools.islice(space, args.limit)]
    if args.json:
        payload = {
            "valid": counted.valid,
            "mtp_standalone": counted.standalone,
            "in_space": counted.total,
            "layouts": listed,
        }
        print(json.dumps(payload, indent=2))
        return
    standalone_note = (
        "kept"
        if args.allow_standalone_mtp
        else f"left out, {counted.total:,} remain; --allow-standalone-mtp keeps them"
    )
    console.print(
        f"{counted.valid:,} valid layouts for {model.num_layers} decoder + "
        f"{model.mtp_num_layers} MTP layers on PP={args.pp} VPP={args.vpp}"
        f"{' (empty stages allowed)' if args.allow_empty_stages else ', every stage non-empty'}; "
        f"{counted.standalone:,} of them MTP-standalone ({standalone_note})",
        highlight=False,
    )
    for text in listed:
        console.print(text, highlight=False, markup=False)
    if listed and counted.total > len(listed):
        console.print(f"... {counted.total - len(listed):,} more (--limit N)")


def cmd_validate(args: argparse.Namespace, console: Console) -> None:
    layout = Layout.parse(args.layout, args.pp)
    check_interleaving(args.pp, layout.vpp, args.overlap_p2p_comm)
    standalone = validate(layout, args.num_layers, args.mtp_layers)
    warnings = placement_problems(layout)
    if args.json:
        payload = {
            "valid": True,
            "layout": str(layout),
            "stages": list(layout.stages),
            "pp": layout.pp,
            "vpp": layout.vpp,
            "mtp_standalone": standalone,
            "warnings": warnings,
        }
        print(json.dumps(payload, indent=2))
        return
    console.print(
        f"valid: Megatron accepts {args.layout!r} for {args.num_layers} decoder + "
        f"{args.mtp_layers} MTP layers on PP={layout.pp} (VPP={layout.vpp})",
        highlight=False,
    )
    console.print(f"compact form: {layout}", highlight=False, markup=False)
    console.print(pretty(layout), highlight=False, markup=False)
    if standalone:
        console.print("MTP standalone: MTP sits on a rank before the last (measured ~12% slower)")
    for warning in warnings:
        console.print(f"warning: {warning}")


def _add_parallel_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("parallel sizes (override the config's)")
    for flag in ("tp", "pp", "vpp", "cp", "ep", "etp", "dp"):
        group.add_argument(f"--{flag}", type=int, help=f"{flag.upper()} size")
    group.add_argument("--micro-batch-size", type=int)
    group.add_argument("--global-batch-size", type=int)
    parser.add_argument("--seq-length", type=int, help="training sequence length override")


class OneLineErrorParser(argparse.ArgumentParser):
    """Usage mistakes end in one line naming the problem (and exit 2), like every other error."""

    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"error: {self.prog}: {message} (see --help)", file=sys.stderr)
        raise SystemExit(EXIT_BAD_INPUT)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrorParser(
        prog="python -m ray_layout",
        description="Plan Megatron-LM pipeline layouts for MoE + MTP models.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    config_help = "model config: project YAML/JSON, HF config.json, or Megatron launch script"

    size = commands.add_parser("size", help="parameters, FLOPs and memory per unit and stage")
    size.add_argument("config", help=config_help)
    _add_parallel_flags(size)
    size.add_argument("--layout", help="size this layout instead of Megatron's default")
    size.add_argument("--json", action="store_true", help="print JSON")
    size.set_defaults(run=cmd_size)

    layouts = commands.add_parser("layouts", help="count or list every valid layout")
    layouts.add_argument("config", help=config_help)
    layouts.add_argument("--pp", type=int, required=True)
    layouts.add_argument("--vpp", type=int, default=1)
    layouts.add_argument("--count", action="store_true", help="only count (no enumeration)")
    layouts.add_argument("--allow-empty-stages", action="store_true")
    layouts.add_argument("--allow-standalone-mtp", action="store_true")
    layouts.add_argument("--limit", type=int, default=50, help="list at most N (default 50)")
    layouts.add_argument("--json", action="store_true", help="print JSON")
    layouts.set_defaults(run=cmd_layouts)

    check = commands.add_parser("validate", help="check a layout string with Megatron's rules")
    check.add_argument("layout", help="e.g. 'Et*5|t*6|t*5|mL'")
    check.add_argument("--pp", type=int, required=True)
    check.add_argument("--num-layers", type=int, required=True)
    check.add_argument("--mtp-layers", type=int, default=0)
    check.add_argument("--overlap-p2p-comm", action="store_true")
    check.add_argument("--json", action="store_true", help="print JSON")
    check.set_defaults(run=cmd_validate)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    console = Console()
    try:
        args.run(args, console)
    except (ConfigError, LayoutError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return 0
