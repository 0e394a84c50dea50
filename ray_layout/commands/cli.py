"""``python -m ray_layout``: size a model, list its layouts, validate a layout string.

Each command is a plain function from parsed arguments to printed output; the pure work lives in
``model``, ``sizing``, ``layout``, ``baselines`` and ``search.space``.  Bad input raises
``ConfigError``/``LayoutError``, which :func:`main` turns into one line on stderr and exit 2.
"""

from __future__ import annotations

import argparse
import itertools
import json
import shlex
import shutil
import sys
from collections.abc import Sequence
from dataclasses import asdict, replace
from typing import Any

from rich.console import Console
from rich.table import Table

from ray_layout.commands.common import OneLineErrorParser, add_parallel_flags, recipe_from_args
from ray_layout.errors import EXIT_BAD_INPUT, ConfigError, LayoutError
from ray_layout.measure.fit import fit_costs, observation_from_log, profile_design
from ray_layout.measure.ingest import (
    LoggedRun,
    ingest,
    microbatches_of,
    observations_from_store,
    parse_run_argument,
    record_fit,
)
from ray_layout.measure.logs import parse_log_file
from ray_layout.measure.store import CostStore
from ray_layout.model.baselines import count_based, megatron_default
from ray_layout.model.costs import UnitCosts, costs_from_flops, load_costs, save_costs
from ray_layout.model.layout import Layout, check_interleaving, placement_problems, pretty, validate
from ray_layout.model.loading import load_recipe
from ray_layout.model.sizing import (
    DECODER,
    StageSize,
    parameter_count,
    stage_sizes,
    static_memory,
    unit_sizes,
)
from ray_layout.model.spec import Recipe
from ray_layout.report.plots import draw_timeline
from search.planner import Candidate, Plan, PlanOptions, SearchSpec, plan, simulate_given
from search.schedule import compile_schedule
from search.space import LayoutSpace

GIB = 2**30
FLOPS_TFLOPS = 400.0  # achieved bf16 TFLOP/s per GPU assumed by --costs flops


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
    recipe = recipe_from_args(args)
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


def _costs_from_args(args: argparse.Namespace, recipe: Recipe) -> UnitCosts:
    if args.costs == "flops":
        print(
            "warning: --costs flops derives unit costs from FLOPs at "
            f"{FLOPS_TFLOPS:.0f} TFLOP/s per GPU; measured costs differ (the MTP and output "
            "layers most), so profile and fit before trusting a pick",
            file=sys.stderr,
        )
        return costs_from_flops(recipe.model, recipe.parallel, FLOPS_TFLOPS)
    return load_costs(args.costs)


def _search_from_args(args: argparse.Namespace, recipe: Recipe) -> tuple[SearchSpec, PlanOptions]:
    parallel = recipe.parallel
    microbatches = (
        args.micro_batches if args.micro_batches is not None else parallel.num_microbatches_or_none
    )
    if microbatches is None:
        raise ConfigError(
            "the number of micro-batches is unknown: give --micro-batches, or "
            "--global-batch-size (micro-batches = global / (micro-batch size x DP))"
        )
    if microbatches < 1:
        raise ConfigError(f"--micro-batches must be >= 1, got {microbatches}")
    if args.hbm_gb is not None and args.hbm_gb <= 0:
        raise ConfigError(f"--hbm-gb must be positive, got {args.hbm_gb}")
    check_interleaving(parallel.pp, parallel.vpp)
    spec = SearchSpec(
        num_microbatches=microbatches,
        group_size=args.group_size,
        allow_standalone_mtp=getattr(args, "allow_standalone_mtp", False),
        allow_empty_stages=getattr(args, "allow_empty_stages", False),
        shards=getattr(args, "shards", 1),
    )
    try:
        compile_schedule(parallel.pp, parallel.vpp, microbatches, args.group_size)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    options = PlanOptions(
        top=getattr(args, "top", 10), samples=args.samples, seed=args.seed, hbm_gib=args.hbm_gb
    )
    return spec, options


def _candidate_row(c: Candidate) -> dict[str, Any]:
    return {
        "layout": c.layout,
        "mean_ms": c.mean_ms,
        "p90_ms": c.p90_ms,
        "noise_free_ms": c.noise_free_ms,
        "bottleneck_rank": c.bottleneck_rank,
        "near_bottleneck": c.near_bottleneck,
        "memory_gib": list(c.memory_gib),
        "fits": c.fits,
        "mtp_standalone": c.mtp_standalone,
    }


def plan_report(recipe: Recipe, result: Plan, spec: SearchSpec) -> dict[str, Any]:
    rows = []
    for c in result.candidates:
        row = _candidate_row(c)
        row["speedup_vs_default"] = result.speedup(c, "Megatron default")
        row["speedup_vs_count_based"] = result.speedup(c, "count-based rule")
        rows.append(row)
    return {
        "model": recipe.model.name,
        "pp": recipe.parallel.pp,
        "vpp": recipe.parallel.vpp,
        "micro_batches": spec.num_microbatches,
        "method": result.method,
        "valid_layouts": result.valid_layouts,
        "space_size": result.space_size,
        "scored": result.scored,
        "monte_carlo": result.sampled,
        "rejected_memory": result.rejected_memory,
        "proven_bound_ms": result.proven_bound_ms,
        "search_complete": result.complete,
        "search_nodes": result.nodes,
        "candidates": rows,
        "baselines": [
            {"name": b.name, "reason": b.reason}
            | (_candidate_row(b.candidate) if b.candidate else {})
            for b in result.baselines
        ],
    }


def _speedup(value: float | None) -> str:
    return f"{value:.2f}x" if value else "-"


def print_plan(report: dict[str, Any], console: Console) -> None:
    table = Table(
        title=f"{report['model']}: PP={report['pp']} VPP={report['vpp']}, "
        f"{report['micro_batches']} micro-batches"
    )
    for column in ("#", "layout", "mean ms", "p90 ms", "bottleneck", "near", "GiB/stage",
                   "vs default", "vs count"):  # fmt: skip
        table.add_column(column, justify="left" if column == "layout" else "right", no_wrap=True)

    def add(label: str, row: dict[str, Any], vs_default: str, vs_count: str) -> None:
        table.add_row(
            label,
            row["layout"] + (" (MTP standalone)" if row["mtp_standalone"] else ""),
            f"{row['mean_ms']:,.1f}",
            f"{row['p90_ms']:,.1f}",
            f"rank {row['bottleneck_rank']}",
            str(row["near_bottleneck"]),
            " ".join(f"{m:.0f}" for m in row["memory_gib"]) + ("" if row["fits"] else " OOM"),
            vs_default,
            vs_count,
        )

    for index, row in enumerate(report["candidates"], 1):
        add(str(index), row, _speedup(row["speedup_vs_default"]),
            _speedup(row["speedup_vs_count_based"]))  # fmt: skip
    table.add_section()
    for base in report["baselines"]:
        if "layout" in base:
            add(base["name"], base, "", "")
    console.print(table)
    for base in report["baselines"]:
        if "layout" not in base:
            console.print(f"{base['name']}: none ({base['reason']})", highlight=False)
    searched = (
        f"{report['scored']:,} layouts simulated by {report['method']}"
        f" of {report['space_size']:,} in the space ({report['valid_layouts']:,} valid), "
        f"{report['monte_carlo']:,} with Monte Carlo jitter"
    )
    if report["rejected_memory"]:
        searched += f", {report['rejected_memory']:,} over the HBM limit"
    if report["proven_bound_ms"] is not None:
        bound = report["proven_bound_ms"]
        searched += f" ({report['search_nodes']:,} search nodes); "
        if report["search_complete"]:
            searched += f"proven: every layout not listed takes >= {bound:,.1f} ms"
        else:
            searched += f"node budget spent: no layout is faster than {bound:,.1f} ms"
            if report["candidates"]:
                gap = 1 - bound / report["candidates"][0]["noise_free_ms"]
                searched += f", so the pick is within {max(gap, 0):.1%} of the optimum"
    console.print(searched, highlight=False)
    if report["candidates"]:
        best = report["candidates"][0]["layout"]
        flags = f'--pipeline-model-parallel-layout "{best}"'
        console.print(f"flag to paste: {flags}", highlight=False, markup=False)
    else:
        console.print("no layout fits: raise --hbm-gb or add parallelism", highlight=False)


def _sweep_vpp(args: argparse.Namespace, recipe: Recipe, costs: UnitCosts, console: Console):
    """Plan once per VPP and compare the picks (the micro-batch count stays the same)."""
    rows = []
    for text in args.sweep_vpp.split(","):
        if not text.strip().isdigit() or int(text) < 1:
            raise ConfigError(f"--sweep-vpp takes positive integers like 1,2,4, got {text!r}")
        run = replace(recipe, parallel=replace(recipe.parallel, vpp=int(text)))
        try:
            spec, options = _search_from_args(args, run)
        except (ConfigError, LayoutError) as exc:
            rows.append({"vpp": int(text), "skipped": str(exc)})
            continue
        result = plan(run.model, run.parallel, costs, spec, options)
        report = plan_report(run, result, spec)
        best = report["candidates"][0] if report["candidates"] else None
        rows.append({"vpp": int(text), "best": best, "method": report["method"]})
    if args.json:
        print(json.dumps({"sweep": rows}, indent=2))
        return
    table = Table(title=f"{recipe.model.name}: PP={recipe.parallel.pp}, VPP sweep")
    for column in ("VPP", "best layout", "mean ms", "vs default", "vs count"):
        table.add_column(column, justify="left" if column == "best layout" else "right")
    for row in rows:
        best = row.get("best")
        if best is None:
            table.add_row(str(row["vpp"]), row.get("skipped", "no layout fits"), "", "", "")
            continue
        table.add_row(str(row["vpp"]), best["layout"], f"{best['mean_ms']:,.1f}",
                      _speedup(best["speedup_vs_default"]),
                      _speedup(best["speedup_vs_count_based"]))  # fmt: skip
    console.print(table)


def cmd_plan(args: argparse.Namespace, console: Console) -> None:
    recipe = recipe_from_args(args)
    costs = _costs_from_args(args, recipe)
    if args.sweep_vpp:
        _sweep_vpp(args, recipe, costs, console)
        return
    spec, options = _search_from_args(args, recipe)
    if spec.shards > 1:
        _start_ray(args.ray_address, spec.shards)
    result = plan(recipe.model, recipe.parallel, costs, spec, options)
    report = plan_report(recipe, result, spec)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_plan(report, console)


def _start_ray(address: str | None, shards: int) -> None:
    import ray

    if not ray.is_initialized():
        if address:
            ray.init(address=address, logging_level="ERROR")
        else:
            ray.init(num_cpus=shards, include_dashboard=False, logging_level="ERROR",
                     object_store_memory=200 * 2**20)  # fmt: skip


def cmd_simulate(args: argparse.Namespace, console: Console) -> None:
    recipe = recipe_from_args(args)
    layout = Layout.parse(args.layout, recipe.parallel.pp)
    validate(layout, recipe.model.num_layers, recipe.model.mtp_num_layers)
    recipe = replace(recipe, parallel=replace(recipe.parallel, vpp=layout.vpp))
    costs = _costs_from_args(args, recipe)
    spec, options = _search_from_args(args, recipe)
    result = simulate_given(layout, recipe.model, recipe.parallel, costs, spec, options)
    if args.timeline:
        draw_timeline(result.events, result.tail_ms, args.timeline,
                      f"{layout}  ({spec.num_microbatches} micro-batches)")  # fmt: skip
    report = _candidate_row(result.candidate) | {
        "busy_ms": list(result.busy_ms),
        "idle_ms": list(result.idle_ms),
        "tail_ms": list(result.tail_ms),
        "bubble_fraction": result.bubble_fraction,
        "timeline": str(args.timeline) if args.timeline else None,
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return
    console.print(
        f"{layout}: mean {report['mean_ms']:,.1f} ms, p90 {report['p90_ms']:,.1f} ms, "
        f"noise-free {report['noise_free_ms']:,.1f} ms; bubble {report['bubble_fraction']:.1%}",
        highlight=False,
    )
    table = Table()
    for column in ("PP rank", "units", "busy ms", "idle ms", "tail ms", "GiB"):
        table.add_column(column, justify="right")
    for rank in range(layout.pp):
        table.add_row(
            str(rank),
            "|".join(layout.rank_chunks(rank)),
            f"{report['busy_ms'][rank]:,.1f}",
            f"{report['idle_ms'][rank]:,.1f}",
            f"{report['tail_ms'][rank]:,.1f}",
            f"{report['memory_gib'][rank]:.1f}",
        )
    console.print(table)
    if args.timeline:
        console.print(f"timeline written to {args.timeline}", highlight=False)


def cmd_profile_layouts(args: argparse.Namespace, console: Console) -> None:
    recipe = recipe_from_args(args)
    guess = _costs_from_args(args, recipe) if args.costs else costs_from_flops(
        recipe.model, recipe.parallel, FLOPS_TFLOPS)  # fmt: skip
    spec, _ = _search_from_args(args, replace(recipe, parallel=replace(recipe.parallel, vpp=1)))
    design = profile_design(
        recipe.model, recipe.parallel, spec.num_microbatches, guess, hbm_gib=args.hbm_gb,
        standalone_mtp=args.standalone_mtp, runs=args.runs,
    )  # fmt: skip
    runs = [
        {
            "layout": str(layout),
            "predicted_ms": ms,
            "peak_memory_gib": gib,
            "megatron_flags": design.megatron_flags(layout, args.train_iters),
        }
        for layout, ms, gib in zip(
            design.layouts, design.predicted_ms, design.peak_memory_gib, strict=True
        )
    ]
    report = {"units": list(design.columns), "rank": design.rank,
              "condition_number": design.condition, "runs": runs}  # fmt: skip
    if args.json:
        print(json.dumps(report, indent=2))
        return
    console.print(
        f"{len(runs)} profiling runs identify {', '.join(design.columns)}: design rank "
        f"{design.rank} of {len(design.columns)}, condition number {design.condition:.2f}",
        highlight=False,
    )
    for index, run in enumerate(runs, 1):
        console.print(
            f"run {index}: {run['layout']}  (predicted step {run['predicted_ms']:,.0f} ms with "
            f"the guessed costs, peak {run['peak_memory_gib']:.1f} GiB)",
            highlight=False, markup=False,
        )  # fmt: skip
        console.print("    " + shlex.join(run["megatron_flags"]), highlight=False, markup=False)
    if "m+L" in design.columns:
        console.print("m and L stay together in these runs; --standalone-mtp measures them apart")


def _logged_runs(args: argparse.Namespace, recipe: Recipe) -> list[LoggedRun]:
    return [
        LoggedRun(layout, path, replace(recipe.parallel, vpp=layout.vpp), args.micro_batches)
        for layout, path in (parse_run_argument(text, recipe.parallel.pp) for text in args.run)
    ]


def cmd_ingest(args: argparse.Namespace, console: Console) -> None:
    recipe = recipe_from_args(args)
    results = ingest(CostStore(args.store), recipe.model, _logged_runs(args, recipe), args.study)
    if args.json:
        print(json.dumps([asdict(r) for r in results], indent=2))
        return
    for result, text in zip(results, args.run, strict=True):
        state = "stored" if result.stored else "already in the store, not counted twice"
        skipped = (
            f", {result.skipped_lines} malformed lines skipped" if result.skipped_lines else ""
        )
        console.print(f"{text}: {result.run_id} {state} ({result.timer_rows} timer rows{skipped})",
                      highlight=False, markup=False)  # fmt: skip


def cmd_fit(args: argparse.Namespace, console: Console) -> None:
    recipe = recipe_from_args(args)
    if bool(args.run) == bool(args.store):
        raise ConfigError("give the runs either as --run LAYOUT=PATH or from --store DIR")
    if args.store:
        store = CostStore(args.store)
        observations = observations_from_store(store, args.study, recipe.model, recipe.parallel)
    else:
        observations = []
        for run in _logged_runs(args, recipe):
            try:
                parsed = parse_log_file(run.path)
            except OSError as exc:
                raise ConfigError(f"{run.path}: cannot read ({exc.strerror})") from None
            microbatches = microbatches_of(parsed, run.parallel, run.num_microbatches)
            observations.append(observation_from_log(str(run.path), parsed, run.layout,
                                                     run.parallel, microbatches))  # fmt: skip
    result = fit_costs(recipe.model, recipe.parallel, observations,
                       gpus_per_node=args.gpus_per_node)  # fmt: skip
    save_costs(result.costs, args.output)
    if args.store:
        record_fit(store, args.study, result, [o.name for o in observations])
    report = {
        "output": str(args.output),
        "units": list(result.columns),
        "forward_ms": dict(result.costs.forward_ms),
        "backward_ms": dict(result.costs.backward_ms),
        "jitter_cv": dict(result.costs.jitter_cv),
        "residuals": result.residuals,
        "warnings": list(result.warnings),
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return
    table = Table(title=f"unit costs per micro-batch, fitted from {len(observations)} runs")
    for column in ("unit", "forward ms", "backward ms", "jitter CV"):
        table.add_column(column, justify="right")
    for unit in result.costs.forward_ms:
        table.add_row(unit, f"{result.costs.forward_ms[unit]:.3f}",
                      f"{result.costs.backward_ms[unit]:.3f}",
                      f"{result.costs.jitter_cv.get(unit, 0.0):.3f}")  # fmt: skip
    console.print(table)
    for name, errors in result.residuals.items():
        console.print(f"{name}: residual per PP rank " + " ".join(f"{e:+.1%}" for e in errors),
                      highlight=False, markup=False)  # fmt: skip
    for warning in result.warnings:
        console.print(f"warning: {warning}", highlight=False, markup=False)
    console.print(f"wrote {args.output}", highlight=False)


def cmd_profile(args: argparse.Namespace, console: Console) -> None:
    from pathlib import Path

    from launchers.megatron import ProfileSettings
    from ray_layout.runtime.cluster import connected
    from ray_layout.runtime.profiling import Backend, LayoutRun, RunOptions, run_layouts

    recipe = recipe_from_args(args)
    backend = Backend(
        args.backend,
        megatron_path=Path(args.megatron_path) if args.megatron_path else None,
        hardware_profile=Path(args.hardware) if args.hardware else None,
    )
    if args.layout:
        layouts = [Layout.parse(text, recipe.parallel.pp) for text in args.layout]
        for layout in layouts:
            validate(layout, recipe.model.num_layers, recipe.model.mtp_num_layers)
    else:
        microbatches = recipe.parallel.num_microbatches_or_none or 8
        guess = costs_from_flops(recipe.model, recipe.parallel, FLOPS_TFLOPS)
        layouts = list(profile_design(recipe.model, recipe.parallel, microbatches, guess).layouts)
    options = RunOptions(
        gpus_per_node=args.gpus_per_node, settings=ProfileSettings(train_iters=args.train_iters),
        timeout_s=args.timeout_s, heartbeat_s=args.heartbeat_s,
    )  # fmt: skip
    with connected(args.ray_address, 3, args.gpus_per_node) as (gpus_per_node, _):
        options = replace(options, gpus_per_node=gpus_per_node)
        store, to_run = CostStore(args.store), [LayoutRun(layout) for layout in layouts]
        runs = run_layouts(recipe, to_run, backend, store, args.study, Path(args.log_dir), options)
    rows = [
        {"layout": str(run.layout), "status": run.result.status,
         "failure_class": run.result.failure_class, "error": run.result.error,
         "attempts": run.result.attempts, "run_id": run.ingested.run_id if run.ingested else None}
        for run in runs
    ]  # fmt: skip
    if args.json:
        print(json.dumps(rows, indent=2, default=str))
    else:
        for row in rows:
            detail = row["run_id"] or f"{row['failure_class']}: {row['error']}"
            console.print(f"{row['layout']}: {row['status']} ({detail})", highlight=False,
                          markup=False)  # fmt: skip
        fit = f"python -m ray_layout fit {args.config} --store {args.store} --study {args.study}"
        console.print(f"next: {fit} -o costs.json", highlight=False, markup=False)
    if any(row["status"] != "finished" for row in rows):
        raise SystemExit(1)


def _add_search_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--costs", required=True, help="COSTS.json (docs/costs.md), or 'flops' to derive from FLOPs"
    )
    parser.add_argument(
        "--micro-batches",
        type=int,
        help="micro-batches per step (default: global / (micro-batch x DP))",
    )
    parser.add_argument(
        "--group-size",
        type=int,
        help="micro-batch group size of the interleaved schedule (default PP)",
    )
    parser.add_argument("--hbm-gb", type=float, help="GPU memory limit in GiB")
    parser.add_argument("--samples", type=int, default=256, help="Monte Carlo samples")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print JSON")  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrorParser(
        prog="python -m ray_layout",
        description="Plan Megatron-LM pipeline layouts for MoE + MTP models.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    config_help = "model config: project YAML/JSON, HF config.json, or Megatron launch script"

    size = commands.add_parser("size", help="parameters, FLOPs and memory per unit and stage")
    size.add_argument("config", help=config_help)
    add_parallel_flags(size)
    size.add_argument("--layout", help="size this layout instead of Megatron's default")
    size.add_argument("--json", action="store_true", help="print JSON")
    size.set_defaults(handler=cmd_size)

    layouts = commands.add_parser("layouts", help="count or list every valid layout")
    layouts.add_argument("config", help=config_help)
    layouts.add_argument("--pp", type=int, required=True)
    layouts.add_argument("--vpp", type=int, default=1)
    layouts.add_argument("--count", action="store_true", help="only count (no enumeration)")
    layouts.add_argument("--allow-empty-stages", action="store_true")
    layouts.add_argument("--allow-standalone-mtp", action="store_true")
    layouts.add_argument("--limit", type=int, default=50, help="list at most N (default 50)")
    layouts.add_argument("--json", action="store_true", help="print JSON")
    layouts.set_defaults(handler=cmd_layouts)

    check = commands.add_parser("validate", help="check a layout string with Megatron's rules")
    check.add_argument("layout", help="e.g. 'Et*5|t*6|t*5|mL'")
    check.add_argument("--pp", type=int, required=True)
    check.add_argument("--num-layers", type=int, required=True)
    check.add_argument("--mtp-layers", type=int, default=0)
    check.add_argument("--overlap-p2p-comm", action="store_true")
    check.add_argument("--json", action="store_true", help="print JSON")
    check.set_defaults(handler=cmd_validate)

    planner = commands.add_parser("plan", help="rank every valid layout by simulated step time")
    planner.add_argument("config", help=config_help)
    add_parallel_flags(planner)
    _add_search_flags(planner)
    planner.add_argument("--top", type=int, default=10, help="how many layouts to show")
    planner.add_argument("--allow-empty-stages", action="store_true")
    planner.add_argument("--allow-standalone-mtp", action="store_true")
    planner.add_argument("--shards", type=int, default=1, help="Ray tasks for the search")
    planner.add_argument("--ray-address", help="Ray cluster to shard on (default: start one)")
    planner.add_argument("--sweep-vpp", help="plan for each VPP in a list such as 1,2,4")
    planner.set_defaults(handler=cmd_plan)

    profile = commands.add_parser(
        "profile-layouts", help="the fewest profiling runs that identify every unit's cost"
    )
    profile.add_argument("config", help=config_help)
    add_parallel_flags(profile)
    profile.add_argument("--costs", help="a guess to rank runs by speed (default: FLOPs)")
    profile.add_argument("--micro-batches", type=int)
    profile.add_argument("--group-size", type=int, help=argparse.SUPPRESS)
    profile.add_argument("--hbm-gb", type=float, help="GPU memory limit in GiB")
    profile.add_argument(
        "--standalone-mtp",
        action="store_true",
        help="also measure m and L apart (needs an MTP-standalone run)",
    )
    profile.add_argument("--runs", type=int, default=2, help="at least this many runs")
    profile.add_argument("--train-iters", type=int, default=20)
    profile.add_argument("--samples", type=int, default=1, help=argparse.SUPPRESS)
    profile.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    profile.add_argument("--json", action="store_true", help="print JSON")
    profile.set_defaults(handler=cmd_profile_layouts)

    ingester = commands.add_parser("ingest", help="store Megatron logs of runs made elsewhere")
    ingester.add_argument("config", help=config_help)
    add_parallel_flags(ingester)
    ingester.add_argument(
        "--run",
        action="append",
        required=True,
        metavar="LAYOUT=PATH",
        help="a run's layout and its log (repeat for several runs)",
    )
    ingester.add_argument("--store", required=True, help="the cost store folder")
    ingester.add_argument("--study", default="default", help="study id (default: default)")
    ingester.add_argument("--micro-batches", type=int, help="default: from the log")
    ingester.add_argument("--json", action="store_true", help="print JSON")
    ingester.set_defaults(handler=cmd_ingest)

    fitter = commands.add_parser("fit", help="fit per-unit costs from profiling runs")
    fitter.add_argument("config", help=config_help)
    add_parallel_flags(fitter)
    fitter.add_argument("--store", help="fit the runs of a study in this cost store")
    fitter.add_argument("--study", default="default")
    fitter.add_argument(
        "--run",
        action="append",
        default=[],
        metavar="LAYOUT=PATH",
        help="or fit raw log files directly",
    )
    fitter.add_argument("--micro-batches", type=int, help="default: from the log")
    fitter.add_argument(
        "--gpus-per-node", type=int, default=8, help="GPUs per node in the runs (which links cross)"
    )
    fitter.add_argument("-o", "--output", required=True, help="COSTS.json to write")
    fitter.add_argument("--json", action="store_true", help="print JSON")
    fitter.set_defaults(handler=cmd_fit)

    runner = commands.add_parser(
        "profile", help="run profiling runs on Ray (emulated or Megatron-LM) into the store"
    )
    runner.add_argument("config", help=config_help)
    add_parallel_flags(runner)
    runner.add_argument("--layout", action="append", help="default: what profile-layouts picks")
    runner.add_argument("--backend", choices=("emulated", "megatron"), default="emulated")
    runner.add_argument(
        "--hardware",
        default="cluster_configs/hardware/h200_emulated.yaml",
        help="the emulated backend's hardware profile",
    )
    runner.add_argument("--megatron-path", help="a Megatron-LM checkout (megatron backend)")
    runner.add_argument("--store", required=True)
    runner.add_argument("--study", default="default")
    runner.add_argument("--log-dir", default="ray_layout_logs")
    runner.add_argument("--ray-address", help="a running cluster (default: simulate 3 nodes)")
    runner.add_argument("--gpus-per-node", type=int, default=4)
    runner.add_argument("--train-iters", type=int, default=8)
    runner.add_argument("--timeout-s", type=float, default=1800.0)
    runner.add_argument("--heartbeat-s", type=float, default=600.0)
    runner.add_argument("--json", action="store_true", help="print JSON")
    runner.set_defaults(handler=cmd_profile)

    sim = commands.add_parser("simulate", help="simulate one layout's step in detail")
    sim.add_argument("config", help=config_help)
    sim.add_argument("layout", help="e.g. 'Et*5|t*6|t*5|mL'")
    add_parallel_flags(sim)
    _add_search_flags(sim)
    sim.add_argument("--timeline", help="write a Gantt chart (PNG, SVG or PDF)")
    sim.set_defaults(handler=cmd_simulate)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    console = Console(width=max(shutil.get_terminal_size().columns, 120))
    try:
        args.handler(args, console)
    except (ConfigError, LayoutError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return 0
