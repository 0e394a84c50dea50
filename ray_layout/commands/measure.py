"""Measuring, without a cluster: ``profile-layouts`` (the runs to make), ``ingest`` (store the
logs of runs made elsewhere) and ``fit`` (unit costs from the runs)."""

from __future__ import annotations

import shlex
from dataclasses import asdict, dataclass, replace
from functools import partial
from typing import Any

from rich.console import Console
from rich.table import Table

from ray_layout.commands.common import Command, ModelSettings, emit, json_flag
from ray_layout.commands.searching import (
    check_search_size,
    hbm_flag,
    microbatch_count,
    microbatches_flag,
    tflops_flag,
    unit_costs,
)
from ray_layout.errors import ConfigError
from ray_layout.measure.design import profile_design
from ray_layout.measure.fit import fit_costs
from ray_layout.measure.ingest import (
    LoggedRun,
    ingest,
    observations_from_store,
    observations_of_logged_runs,
    parse_run_argument,
    record_fit,
)
from ray_layout.measure.log_records import FIT_NEEDS, MIN_PROFILE_ITERATIONS
from ray_layout.measure.store import CostStore
from ray_layout.model.costs import costs_from_flops, save_costs
from ray_layout.model.fields import MAX_PARALLEL_SIZE
from ray_layout.model.spec import Recipe
from ray_layout.options.checks import (
    MAX_ITERATIONS,
    MAX_PROFILE_RUNS,
    at_least,
    between,
    costs_file,
    folder_or_new,
    new_file,
    plain_name,
)
from ray_layout.options.flag_fields import option

RUN_METAVAR = "LAYOUT=PATH"
STORE_CHECKS = [folder_or_new]
LOG_MICROBATCHES = "default: from the log"


@dataclass(frozen=True, kw_only=True)
class ProfileLayoutsSettings(ModelSettings):
    costs: str | None = option(
        None, help="a guess to rank runs by speed (default: FLOPs)", checks=[costs_file]
    )
    micro_batches: int | None = microbatches_flag(None)
    hbm_gb: float | None = hbm_flag()
    standalone_mtp: bool = option(
        False, help="also measure m and L apart (needs an MTP-standalone run)"
    )
    runs: int = option(2, help="at least this many runs", checks=[between(1, MAX_PROFILE_RUNS)])
    train_iters: int = option(
        20, checks=[at_least(MIN_PROFILE_ITERATIONS, FIT_NEEDS), between(1, MAX_ITERATIONS)]
    )
    tflops: float = tflops_flag()
    as_json: bool = json_flag()


def run_profile_layouts(settings: ProfileLayoutsSettings, console: Console) -> None:
    recipe = settings.recipe()
    check_search_size(recipe)
    guess = (
        unit_costs(settings.costs, recipe, True, settings.tflops)  # it only orders the runs
        if settings.costs
        else costs_from_flops(recipe.model, recipe.parallel, settings.tflops)
    )
    one_chunk = replace(recipe, parallel=replace(recipe.parallel, vpp=1))
    design = profile_design(
        recipe.model,
        recipe.parallel,
        microbatch_count(one_chunk, settings.micro_batches),
        guess,
        hbm_gib=settings.hbm_gb,
        standalone_mtp=settings.standalone_mtp,
        runs=settings.runs,
        settings=recipe.flags.memory,
    )
    runs = [
        {
            "layout": str(layout),
            "predicted_ms": ms,
            "peak_memory_gib": gib,
            "megatron_flags": design.megatron_flags(layout, settings.train_iters),
        }
        for layout, ms, gib in zip(
            design.layouts, design.predicted_ms, design.peak_memory_gib, strict=True
        )
    ]
    report = {
        "units": list(design.columns),
        "rank": design.rank,
        "condition_number": design.condition,
        "worst_relative_error": design.worst_relative_error,
        "runs": runs,
        "unidentified": list(design.unidentified),
    }
    emit(report, settings.as_json, _print_profile_layouts, console)


def _print_profile_layouts(report: dict[str, Any], console: Console) -> None:
    units, runs = report["units"], report["runs"]
    console.print(
        f"{len(runs)} profiling runs identify {', '.join(units)}: design rank "
        f"{report['rank']} of {len(units)}, condition number {report['condition_number']:.2f}; "
        f"the least pinned-down unit's standard error is {report['worst_relative_error']:.2f} "
        "times the timers' jitter per micro-batch and interval",
        highlight=False,
    )
    for index, run in enumerate(runs, 1):
        console.print(
            f"run {index}: {run['layout']}  (predicted step {run['predicted_ms']:,.0f} ms with "
            f"the guessed costs, peak {run['peak_memory_gib']:.1f} GiB)",
            highlight=False,
            markup=False,
        )
        console.print("    " + shlex.join(run["megatron_flags"]), highlight=False, markup=False)
    for line in report["unidentified"]:
        console.print(line, highlight=False, markup=False)


@dataclass(frozen=True, kw_only=True)
class IngestSettings(ModelSettings):
    run: tuple[str, ...] = option(
        metavar=RUN_METAVAR, help="a run's layout and its log (repeat for several runs)"
    )
    store: str = option(help="the cost store folder", checks=STORE_CHECKS)
    study: str = option("default", help="study id (default: default)", checks=[plain_name])
    micro_batches: int | None = microbatches_flag(LOG_MICROBATCHES)
    as_json: bool = json_flag()


def _logged_runs(
    texts: tuple[str, ...], micro_batches: int | None, settings: ModelSettings, recipe: Recipe
) -> list[LoggedRun]:
    """The ``--run LAYOUT=PATH`` runs; a log may not contradict a size given as a flag."""
    given = frozenset(settings.parallel.sizes_given())
    return [
        LoggedRun(layout, path, replace(recipe.parallel, vpp=layout.vpp), micro_batches, given)
        for layout, path in (parse_run_argument(text, recipe.parallel.pp) for text in texts)
    ]


def run_ingest(settings: IngestSettings, console: Console) -> None:
    recipe = settings.recipe()
    runs = _logged_runs(settings.run, settings.micro_batches, settings, recipe)
    results = ingest(CostStore(settings.store), recipe.model, runs, settings.study)

    def show(report: list[dict[str, Any]], console: Console) -> None:
        for result, text in zip(report, settings.run, strict=True):
            state = "stored" if result["stored"] else "already in the store, not counted twice"
            skipped = result["skipped_lines"]
            note = f", {skipped} malformed lines skipped" if skipped else ""
            console.print(
                f"{text}: {result['run_id']} {state} ({result['timer_rows']} timer rows{note})",
                highlight=False,
                markup=False,
            )
            for line in [*result["skipped_examples"], *result["notes"]]:
                console.print(f"    {line}", highlight=False, markup=False)

    emit([asdict(r) for r in results], settings.as_json, show, console)


@dataclass(frozen=True, kw_only=True)
class FitSettings(ModelSettings):
    store: str | None = option(
        None, help="fit the runs of a study in this cost store", checks=STORE_CHECKS
    )
    study: str = option("default", checks=[plain_name])
    run: tuple[str, ...] = option((), metavar=RUN_METAVAR, help="or fit raw log files directly")
    micro_batches: int | None = microbatches_flag(LOG_MICROBATCHES)
    gpus_per_node: int = option(
        8,
        help="GPUs per node in the runs (which links cross)",
        checks=[between(1, MAX_PARALLEL_SIZE)],
    )
    output: str = option(names=["-o", "--output"], help="COSTS.json to write", checks=[new_file()])
    accept_residuals: bool = option(
        False, help="write the costs even where they miss a stage's timers by over the bound"
    )
    as_json: bool = json_flag()

    def __post_init__(self) -> None:
        super().__post_init__()
        if bool(self.run) == bool(self.store):
            raise ConfigError("give the runs either as --run LAYOUT=PATH or from --store DIR")


def run_fit(settings: FitSettings, console: Console) -> None:
    recipe = settings.recipe()
    notes: tuple[str, ...] = ()
    if settings.store:
        store = CostStore(settings.store)
        observations = observations_from_store(store, settings.study, recipe.model, recipe.parallel)
        notes = store.notes()  # rows stored twice, read once
    else:
        runs = _logged_runs(settings.run, settings.micro_batches, settings, recipe)
        observations, notes = observations_of_logged_runs(runs, recipe.model)
    result = fit_costs(
        recipe.model,
        recipe.parallel,
        observations,
        gpus_per_node=settings.gpus_per_node,
        accept_residuals=settings.accept_residuals,
        explicit=frozenset(settings.parallel.sizes_given()),
        memory=recipe.flags.memory,
    )
    save_costs(result.costs, settings.output)
    if settings.store:
        record_fit(store, settings.study, result, [o.name for o in observations])
    report = {
        "output": settings.output,
        "units": list(result.columns),
        "forward_ms": dict(result.costs.forward_ms),
        "backward_ms": dict(result.costs.backward_ms),
        "recompute_ms": dict(result.recompute_ms),
        "jitter_cv": dict(result.costs.jitter_cv),
        "residuals": result.residuals,
        "warnings": list(result.warnings),
        "suggested_layouts": dict(result.suggested_layouts),
        "notes": list(notes),
        "memory_allocated_gib": result.memory.allocated_gib,
        "memory": [asdict(stage) for stage in result.memory.stages],
    }
    emit(report, settings.as_json, partial(_print_fit, runs=len(observations)), console)


def _print_fit(report: dict[str, Any], console: Console, runs: int) -> None:
    """The unit costs; where the runs recomputed, what their backward re-ran beside the backward
    without it that the costs keep."""
    table = Table(title=f"unit costs per micro-batch, fitted from {runs} runs")
    forward, backward, jitter = report["forward_ms"], report["backward_ms"], report["jitter_cv"]
    recomputed = report["recompute_ms"]
    columns = ("unit", "forward ms", "backward ms", *(("recomputed ms",) if recomputed else ()))
    for column in (*columns, "jitter CV"):
        table.add_column(column, justify="right")
    for unit in forward:
        redone = (f"{recomputed.get(unit, 0.0):.3f}",) if recomputed else ()
        jitter_cv = f"{jitter.get(unit, 0.0):.3f}"
        table.add_row(unit, f"{forward[unit]:.3f}", f"{backward[unit]:.3f}", *redone, jitter_cv)
    console.print(table)
    if recomputed:
        console.print(
            "backward ms is without recomputation (a plan adds its job's); the runs' backward "
            "also re-ran recomputed ms",
            highlight=False,
        )
    for name, errors in report["residuals"].items():
        console.print(
            f"{name}: residual per PP rank " + " ".join(f"{e:+.1%}" for e in errors),
            highlight=False,
            markup=False,
        )
    _print_memory(report, console)
    for warning in report["warnings"]:
        console.print(f"warning: {warning}", highlight=False, markup=False)
    for name, layout in report["suggested_layouts"].items():
        console.print(f"{name}: its timers suggest layout {layout}", highlight=False, markup=False)
    for note in report["notes"]:
        console.print(f"note: {note}", highlight=False, markup=False)
    console.print(f"wrote {report['output']}", highlight=False)


def _print_memory(report: dict[str, Any], console: Console) -> None:
    """Each rank's measured max allocated against the prior and the calibrated prediction."""
    if not report["memory"]:
        return
    fixed = report["memory_allocated_gib"]
    table = Table(title=f"peak allocated per PP rank (fitted fixed allocation {fixed:.2f} GiB)")
    for column in ("run", "PP rank", "measured GiB", "prior GiB", "prior error", "fitted GiB",
                   "fitted error"):  # fmt: skip
        table.add_column(column, justify="left" if column == "run" else "right")
    for row in report["memory"]:
        measured, prior, fitted = row["measured_gib"], row["prior_gib"], row["fitted_gib"]
        table.add_row(
            row["run"],
            str(row["pp_rank"]),
            f"{measured:.2f}",
            f"{prior:.2f}",
            f"{prior / measured - 1:+.1%}",
            f"{fitted:.2f}",
            f"{fitted / measured - 1:+.1%}",
        )
    console.print(table)


PROFILE_LAYOUTS = Command(
    "profile-layouts",
    "the fewest profiling runs that identify every unit's cost",
    ProfileLayoutsSettings,
    run_profile_layouts,
)
INGEST = Command("ingest", "store Megatron logs of runs made elsewhere", IngestSettings, run_ingest)
FIT = Command("fit", "fit per-unit costs from profiling runs", FitSettings, run_fit)
