"""The tune's refit: closing the loop with the A/B runs, so that the study's next plan starts
from what the live test measured.  Unit costs come from the timers of every run under the job's
own recompute flags (a fit reads a backward's timers under one setting: an arm that ran another,
from the layout x recompute search, is left out, and the note says so); under combined 1F1B,
whose runs time each merged step whole, the A/B arms' steps fit the EP all-to-all time instead
(``measure.a2a_fit``), each arm simulated under its own recomputation."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from ray_layout.ab.live import Arm, ArmResult
from ray_layout.ab.stats import ABConfig, steady_steps
from ray_layout.errors import MeasurementError
from ray_layout.measure.a2a_fit import fit_a2a_ms, largest_a2a_ms
from ray_layout.measure.fit import FitResult
from ray_layout.measure.ingest import record_fit
from ray_layout.measure.store import CostStore
from ray_layout.model.costs import UnitCosts
from ray_layout.model.spec import Recipe
from ray_layout.runtime.layout_runs import ProfiledRun, recompute_recipe
from ray_layout.tuning.phases import Searched, fit
from search.planner import Problem, score_given


@dataclass(frozen=True)
class Refit:
    """The refined fit, or why there is none (said in the report's notes)."""

    result: FitResult | None
    skipped: str | None = None
    fitted: str | None = None  # what the refit fitted, where not every unit cost
    left_out: str | None = None  # the A/B runs it could not fit with the others, and why


def measured_arms(results: Sequence[ArmResult], config: ABConfig) -> list[tuple[Arm, float]]:
    """Each arm that ran without failing to a steady step, with its mean step (ms)."""
    return [
        (r.arm, float(steps.mean()))
        for r in results
        if r.trace.failure is None and len(steps := steady_steps(r.trace, config))
    ]


def arm_problem(recipe: Recipe, arm: Arm, costs: UnitCosts, searched: Searched) -> Problem:
    """What predicts the arm's step: the search's problem under the arm's recomputation."""
    run = recompute_recipe(recipe, arm.recompute_settings)
    return Problem.of(run, costs, searched.spec, searched.options)


def refit(
    recipe: Recipe,
    store: CostStore,
    *,
    study: str,
    profiled: Sequence[ProfiledRun],
    results: Sequence[ArmResult],
    gpus_per_node: int,
) -> Refit:
    """Closing the loop: the profiling runs and every A/B run under the job's own recompute
    flags, fitted together; the next plan of this study starts from it.  A/B runs the fit
    cannot use (too short for a steady timer interval) leave the first fit standing, and the
    user is told why, as of the runs that recomputed otherwise."""
    run_ids = [r.ingested.run_id for r in profiled if r.ingested]
    ran = [r for r in results if r.run and r.run.ingested]
    job = recipe.flags.memory.recompute_flags()
    other = [r.arm.name for r in ran if r.arm.recompute != job]
    left_out = None
    if other:
        left_out = (
            f"{', '.join(other)} left out of the refit: they ran another recompute setting "
            "than the profiling runs, and a fit reads every backward under one"
        )
    extra = [r.run.ingested.run_id for r in ran if r.arm.recompute == job]
    if not extra:
        return Refit(None, left_out=left_out)
    try:
        found = fit(
            recipe, store, study=study, run_ids=run_ids + extra, gpus_per_node=gpus_per_node
        )
    except MeasurementError as exc:
        return Refit(None, f"refit skipped, the first fit stands: {exc}", left_out=left_out)
    return Refit(found, left_out=left_out)


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

    problems = [(a.layout, arm_problem(recipe, a, first.costs, searched)) for a, _ in measured]

    def simulated(a2a: float) -> np.ndarray:
        costs = replace(first.costs, a2a_ms=a2a)
        return np.array(
            [score_given(layout, replace(at, costs=costs)).mean_ms for layout, at in problems]
        )

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
