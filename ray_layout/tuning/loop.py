"""The tune: one job from a model config to the layout flag to paste.

The recipe, as data flowing (docs/design.md)::

    size ─► profile runs ─► fit ─► search ─► live A/B ─► refit ─► report

Runs as a plain command (it starts an embedded local cluster of simulated GPU nodes) or as a Ray
job (``ray job submit -- python -m ray_layout.tune ...``: it joins ``RAY_ADDRESS``).  Everything
measured goes to the cost store under the study id, so running the same command again resumes:
finished profiling runs and A/B arms are read back, not run again.  Ctrl-C (or SIGTERM, as
``ray job stop`` sends) stops every run, releases its GPUs, and exits 130.
"""

from __future__ import annotations

import threading
from dataclasses import replace

from rich.console import Console

from ray_layout.ab.live import ABOutcome
from ray_layout.measure.fit import FitResult
from ray_layout.measure.store import CostStore
from ray_layout.model.sizing import parameter_count
from ray_layout.model.spec import Recipe
from ray_layout.report.summary import TuneSummary
from ray_layout.report.terminal import print_summary
from ray_layout.report.write import write_report
from ray_layout.runtime.layout_runs import MEGATRON
from ray_layout.tuning.display import Phases
from ray_layout.tuning.phases import (
    LiveRuns,
    Searched,
    ab_test,
    check_cluster_flags,
    choose_arms,
    cluster_cpus,
    cluster_gpus,
    cluster_hbm_gib,
    first_fit,
    profile,
    search,
)
from ray_layout.tuning.refit import refit, refit_all_to_all
from ray_layout.tuning.settings import TuneSettings
from ray_layout.tuning.summarize import profile_gpu_seconds, refit_note, summarize
from search.recompute_search import setting_name

NO_AB = ABOutcome("", (), ())


PROFILED_WITHOUT_EP_OVERLAP = (
    "the profiling runs ran without --overlap-moe-expert-parallel-comm and "
    "--delay-wgrad-compute, to time each unit's forward and backward apart; the plan and the "
    "A/B runs keep them"
)


def run_tune(
    recipe: Recipe,
    settings: TuneSettings,
    config_path: str,
    console: Console,
    cancel: threading.Event,
) -> TuneSummary:
    """Size, profile, fit, search, A/B, refit and report (the module docstring)."""
    phases = Phases(console)
    store = CostStore(settings.store)
    model, parallel = recipe.model, recipe.parallel
    with phases.phase("size", f"{model.name} on PP={parallel.pp} VPP={parallel.vpp}"):
        phases.say(_size_line(recipe, settings.study))
        # said once and kept in the report: the runs keep these flags, unmodelled
        unmodelled = [f"not simulated: {note}" for note in recipe.flags.unsimulated]
        for note in unmodelled:
            phases.say(note)
        cluster_flags = None
        if settings.backend.name == MEGATRON:  # read once; the user's flags before any GPU
            cluster_flags = check_cluster_flags([recipe.megatron_args], settings, store, phases)
        if settings.options.hbm_gib is None:  # never assumed: a layout must fit the cluster's GPUs
            hbm_gib, where = cluster_hbm_gib(settings.backend)
            settings = replace(settings, options=replace(settings.options, hbm_gib=hbm_gib))
            phases.say(f"GPU memory {hbm_gib:,.1f} GiB, from {where} (--hbm-gb sets it)")
    with phases.phase("profile", f"profiling runs on the {settings.backend.name} backend"):
        live = LiveRuns(recipe, settings, store, phases, cancel)
        profiled = profile(live, cluster_flags=cluster_flags)
    with phases.phase("fit", "per-unit costs from every rank's timers"):
        first = first_fit(recipe, store, settings, profiled)
        for line in _fit_lines(first):
            phases.say(line)
    with phases.phase("search", "simulate every layout Megatron accepts"):
        searched = search(recipe, first.costs, settings, cpus=cluster_cpus(), progress=phases.say)
        if searched.recompute:
            phases.say(searched.recompute)
        phases.say(_search_line(searched))
    arms = choose_arms(searched.found, settings.options.ab_top)
    ab = NO_AB
    if settings.options.ab_top > 0:
        with phases.phase("A/B", "the top layouts and the baselines, live, early-stopped"):
            ab = ab_test(live, arms, cluster_gpus=cluster_gpus())
    notes = list(unmodelled)
    if searched.recompute:
        notes.append(searched.recompute)
    combined = recipe.flags.ep_overlap.on
    if combined:
        notes.append(PROFILED_WITHOUT_EP_OVERLAP)
    with phases.phase("refit", "A/B runs added to the cost model"):
        if combined:  # merged steps: only their step times fit
            refined = refit_all_to_all(
                recipe,
                store,
                study=settings.study,
                first=first,
                searched=searched,
                results=ab.results,
                config=settings.options.ab,
            )
        else:
            refined = refit(
                recipe,
                store,
                study=settings.study,
                profiled=profiled,
                results=ab.results,
                gpus_per_node=settings.gpus_per_node,
            )
        if (note := refit_note(recipe, refined, ab, searched, settings.options.ab)) is not None:
            notes.append(note)
            phases.say(note)
    if ab.results and ab.winner is None:
        notes.append("no arm won the A/B test (every arm failed?): the pick is the prediction")
    with phases.phase("report", f"to {settings.report_dir}"):
        profile_seconds = profile_gpu_seconds(store, settings.study, profiled)
        summary = summarize(
            recipe,
            settings=settings,
            config_path=config_path,
            searched=searched,
            first=first,
            arms=arms,
            ab=ab,
            profile_seconds=profile_seconds,
            notes=notes,
            phase_seconds=phases.seconds,
        )
        files = write_report(summary, settings.report_dir)
    print_summary(summary, console, files)
    return summary


def _size_line(recipe: Recipe, study: str) -> str:
    model, parallel = recipe.model, recipe.parallel
    count = parameter_count(model)
    return (
        f"{count.total / 1e9:.2f}B parameters ({count.active / 1e9:.2f}B active, "
        f"MTP {count.mtp / 1e9:.2f}B); {parallel.world_size} GPUs per run "
        f"(TP {parallel.tp} x EP {parallel.ep} x DP {parallel.dp} x PP {parallel.pp}), "
        f"{parallel.num_microbatches_or_none} micro-batches; study {study}"
    )


def _fit_lines(first: FitResult) -> list[str]:
    costs = first.costs
    lines = [
        f"{unit}: forward {costs.forward_ms[unit]:.2f} ms, "
        f"backward {costs.backward_ms[unit]:.2f} ms"
        for unit in costs.forward_ms
    ]
    lines.append(
        f"p2p per transfer {costs.p2p_intra_node_ms:.2f} ms in a node, "
        f"{costs.p2p_inter_node_ms:.2f} ms across (latency {first.p2p_latency_ms:.2f} ms "
        f"and a fixed step tail of {costs.tail_fixed_ms:.2f} ms fitted to the measured steps)"
    )
    lines += [
        f"{name}: simulated step {error:+.1%} off the measured"
        for name, error in first.step_errors.items()
    ]
    lines += [f"warning: {warning}" for warning in first.warnings]
    return lines


def _search_line(searched: Searched) -> str:
    found, best = searched.found, searched.found.candidates[0]
    where = f" on {searched.spec.shards} Ray tasks" if searched.spec.shards > 1 else ""
    recompute = f" with {setting_name(best.recompute)}" if searched.recompute else ""
    return (
        f"{found.scored:,} layouts simulated ({found.schedule}, {found.method}){where} in "
        f"{searched.seconds:.1f} s; "
        f"best {best.layout}{recompute} at {best.mean_ms:,.1f} ms"
    )
