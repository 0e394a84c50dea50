"""The tune's refit: closing the loop with the A/B runs, so that the study's next plan starts
from what the live test measured.  Unit costs come from the timers of every run; under combined
1F1B, whose runs time each merged step whole, the A/B arms' steps fit the EP all-to-all time
instead (``measure.a2a_fit``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from ray_layout.ab.live import ArmResult
from ray_layout.ab.stats import ABConfig, steady_steps
from ray_layout.errors import MeasurementError
from ray_layout.measure.a2a_fit import fit_a2a_ms, largest_a2a_ms
from ray_layout.measure.fit import FitResult
from ray_layout.measure.ingest import record_fit
from ray_layout.measure.store import CostStore
from ray_layout.model.layout import Layout
from ray_layout.model.spec import Recipe
from ray_layout.runtime.layout_runs import ProfiledRun
from ray_layout.tuning.phases import Searched, fit
from search.planner import Problem, score_given


@dataclass(frozen=True)
class Refit:
    """The refined fit, or why there is none (said in the report's notes)."""

    result: FitResult | None
    skipped: str | None = None
    fitted: str | None = None  # what the refit fitted, where not every unit cost


def measured_arms(results: Sequence[ArmResult], config: ABConfig) -> list[tuple[Layout, float]]:
    """Each arm that ran without failing to a steady step, with its mean step (ms)."""
    return [
        (r.arm.layout, float(steps.mean()))
        for r in results
        if r.trace.failure is None and len(steps := steady_steps(r.trace, config))
    ]


def refit(
    recipe: Recipe,
    store: CostStore,
    *,
    study: str,
    profiled: Sequence[ProfiledRun],
    results: Sequence[ArmResult],
    gpus_per_node: int,
) -> Refit:
    """Closing the loop: the profiling runs and every A/B run, fitted together; the next plan of
    this study starts from it.  A/B runs the fit cannot use (too short for a steady timer
    interval) leave the first fit standing, and the user is told why."""
    run_ids = [r.ingested.run_id for r in profiled if r.ingested]
    extra = [r.run.ingested.run_id for r in results if r.run and r.run.ingested]
    if not extra:
        return Refit(None)
    try:
        return Refit(
            fit(recipe, store, study=study, run_ids=run_ids + extra, gpus_per_node=gpus_per_node)
        )
    except MeasurementError as exc:
        return Refit(None, f"refit skipped, the first fit stands: {exc}")


def refit_all_to_all(
    recipe: Recipe,
    store: CostStore,
    *,
    study: str,
    first: FitResult,
    searched: Searched,
    results: Sequence[ArmResult],
    config: ABConfig,
) -> Refit:
    """Closing the loop under combined 1F1B, whose A/B runs time each merged step whole: the
    first fit's unit costs stay, and the EP all-to-all time is fitted to the arms' measured
    steps (``measure.a2a_fit``); the next plan of this study starts from it."""
    measured = measured_arms(results, config)
    if not measured:
        return Refit(None)

    problem = Problem.of(recipe, first.costs, searched.spec, searched.options)

    def simulated(a2a: float) -> np.ndarray:
        at = replace(problem, costs=replace(first.costs, a2a_ms=a2a))
        return np.array([score_given(layout, at).mean_ms for layout, _ in measured])

    try:
        largest = largest_a2a_ms(recipe.model, first.costs)
        found = fit_a2a_ms(simulated, [ms for _, ms in measured], largest, first.costs.a2a_ms)
    except MeasurementError as exc:
        return Refit(None, f"refit skipped, the first fit stands: {exc}")
    result = replace(first, costs=replace(first.costs, a2a_ms=found.a2a_ms))
    run_ids = [r.run.ingested.run_id for r in results if r.run and r.run.ingested]
    record_fit(store, study, result, run_ids)
    return Refit(
        result,
        fitted=(
            f"EP all-to-all {found.a2a_ms:.3f} ms per dispatch or combine, fitted to "
            f"{len(measured)} combined 1F1B arms' steps (the prior said {found.prior_ms:.3f} ms)"
        ),
    )
