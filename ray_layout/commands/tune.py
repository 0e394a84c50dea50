"""``python -m ray_layout.tune``: the tune command, from flags to the driver's settings.

Every setting is checked here, before any cluster is started or joined; the driver
(``ray_layout.tuning.loop``) then runs size, profile, fit, search, A/B, refit and report.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path

from rich.console import Console

from launchers.megatron_core.gpt_build import check_runs_on_cpu
from ray_layout.commands.common import (
    Command,
    ModelSettings,
    command_line,
    command_parser,
    json_flag,
)
from ray_layout.commands.profile import BackendFlags, log_dir_flag
from ray_layout.commands.searching import check_sampled_work, check_search_size, microbatch_count
from ray_layout.commands.tuned_script import comment_line, write_script_flag, write_tuned_script
from ray_layout.errors import EXIT_INTERRUPTED, ConfigError
from ray_layout.model.fields import MAX_PARALLEL_SIZE
from ray_layout.model.layout import Layout
from ray_layout.model.spec import Recipe
from ray_layout.options.checks import MAX_TASKS, between, folder_or_new, plain_name, reachable
from ray_layout.options.flag_fields import option
from ray_layout.report.summary import TuneSummary, speedups
from ray_layout.runtime.layout_runs import MEGATRON_CORE
from ray_layout.runtime.local import connected
from ray_layout.tuning.loop import run_tune
from ray_layout.tuning.settings import TuneOptions, TuneSettings, study_id

DESCRIPTION = (
    "Measure, search and A/B-test pipeline layouts on a Ray cluster; report the "
    "--pipeline-model-parallel-layout to use."
)


@dataclass(frozen=True, kw_only=True)
class TuneFlags(ModelSettings):
    """The tune command's flags: where the tune runs and keeps what it measures, and its options
    (a section: each field of ``TuneOptions`` is a flag); :func:`tune_settings` makes them the
    driver's settings."""

    runner: BackendFlags = field(default_factory=BackendFlags)
    store: str = option("ray_layout_store", help="the cost store folder", checks=[folder_or_new])
    study: str | None = option(
        None,
        help="study id (default: from the model, sizes and backend); the same id resumes",
        checks=[plain_name],
    )
    report_dir: str | None = option(
        None, help="default: ray_layout_report/<study>", checks=[folder_or_new]
    )
    log_dir: str | None = log_dir_flag()
    ray_address: str | None = option(
        None,
        help="a running cluster (default: $RAY_ADDRESS, else an "
        "embedded local cluster of simulated GPU nodes)",
        checks=[reachable],
    )
    nodes: int = option(3, help="embedded cluster: nodes", checks=[between(1, MAX_TASKS)])
    gpus_per_node: int | None = option(
        None,
        help="GPUs a run takes per node (default: the cluster's, 4 embedded)",
        checks=[between(1, MAX_PARALLEL_SIZE)],
    )
    options: TuneOptions = field(default_factory=TuneOptions)
    as_json: bool = json_flag("print the summary as JSON at the end")
    write_script: str | None = write_script_flag()


def tune_settings(flags: TuneFlags, recipe: Recipe, gpus_per_node: int) -> TuneSettings:
    """The driver's settings: the flags' options, with the study id and report folder filled in."""
    backend = flags.runner.to_backend()
    study = flags.study or study_id(recipe, backend)
    return TuneSettings(
        backend=backend,
        store=Path(flags.store),
        study=study,
        log_dir=Path(flags.log_dir) if flags.log_dir else None,
        report_dir=Path(flags.report_dir or Path("ray_layout_report") / study),
        gpus_per_node=gpus_per_node,
        options=flags.options,
    )


def _checked_recipe(flags: TuneFlags) -> Recipe:
    recipe = flags.recipe()
    microbatches = recipe.parallel.num_microbatches_or_none
    if microbatches is None:
        raise ConfigError("the number of micro-batches is unknown: give --global-batch-size")
    microbatch_count(recipe, microbatches)
    check_search_size(recipe)
    check_sampled_work(recipe, microbatches, flags.options.samples)
    return recipe


def tune_on_cluster(
    flags: TuneFlags, console: Console, cancel: threading.Event
) -> tuple[TuneSummary, Recipe, TuneSettings]:
    """The tune on the cluster the flags name (or a simulated one): its summary, the recipe and
    the settings it ran with (GPUs per node from the cluster)."""
    recipe = _checked_recipe(flags)
    settings = tune_settings(flags, recipe, flags.gpus_per_node or 0)  # before any cluster
    if settings.backend.name == MEGATRON_CORE:
        check_runs_on_cpu(recipe.flags)
    with connected(flags.ray_address, flags.nodes, flags.gpus_per_node) as (per_node, where):
        console.print(f"[bold]cluster[/bold]: {where}", highlight=False)
        settings = replace(settings, gpus_per_node=per_node)
        summary = run_tune(recipe, settings, flags.config, console, cancel)
    return summary, recipe, settings


def run(flags: TuneFlags, console: Console, cancel: threading.Event) -> None:
    summary, recipe, settings = tune_on_cluster(flags, console, cancel)
    if flags.write_script:
        found = speedups(summary)
        role = next((r for r in found if found[r].value), None)
        layout = Layout.parse(summary.pick, recipe.parallel.pp)
        value, basis = (found[role].value, found[role].basis or "") if role else (None, "")
        comment = comment_line(f"tune, study {summary.study}", layout, value, str(role), basis)
        write_tuned_script(flags, flags.write_script, layout, comment)
        console.print(f"wrote {flags.write_script}", highlight=False)
        if summary.recompute != summary.job_recompute:  # the script gets the split alone
            pick = " ".join(summary.recompute) or "no recomputation"
            console.print(
                f"{flags.write_script} keeps your job's recompute flags: change them to {pick}",
                highlight=False,
                markup=False,
                soft_wrap=True,  # the flags stay on one line
            )
    if flags.as_json:
        report_dir = str(settings.report_dir)
        print(
            json.dumps(
                {
                    "pick": str(summary.pick),
                    "flags": list(summary.flags),
                    "recompute": list(summary.recompute),
                    "study": summary.study,
                    "report_dir": report_dir,
                }
            )
        )


def build_parser() -> argparse.ArgumentParser:
    return command_parser(TuneFlags, "python -m ray_layout.tune", DESCRIPTION)


STOPPED = (
    "every run was stopped and its GPUs released; what was measured is in the store; run the "
    "same command again to resume"
)


def main(argv: Sequence[str] | None = None) -> int:
    """The tune's exit status: ``ray job stop`` (SIGTERM) and Ctrl-C end it in one line, 130."""
    words = sys.argv[1:] if argv is None else argv
    cancel = threading.Event()
    command = Command("tune", DESCRIPTION, TuneFlags, partial(run, cancel=cancel), STOPPED)
    status = command_line(build_parser(), words, lambda args: command)
    if status == EXIT_INTERRUPTED:
        cancel.set()
    return status
