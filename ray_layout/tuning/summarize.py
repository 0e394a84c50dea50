"""From what the phases found to the report's :class:`TuneSummary`: each arm's outcome, the GPU
time, the notes the user must read (a refit that could not run, an A/B without a winner)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace

from ray_layout.ab.cost import gpu_seconds
from ray_layout.ab.live import ABOutcome, Arm
from ray_layout.ab.stats import ABConfig, arm_stats, steady_steps
from ray_layout.ab.vocabulary import ArmRole, ArmStatus
from ray_layout.measure.fit import FitResult
from ray_layout.measure.store import CostStore
from ray_layout.model.baselines import BaselineName
from ray_layout.model.costs import UnitCosts
from ray_layout.model.layout import Layout
from ray_layout.model.spec import Recipe
from ray_layout.report.summary import PICK, ArmOutcome, SearchFacts, TuneSummary
from ray_layout.runtime.layout_runs import ProfiledRun
from ray_layout.tuning.phases import Searched
from ray_layout.tuning.refit import Refit, measured_arms
from ray_layout.tuning.settings import TuneSettings
from search.planner import LayoutSimulation, Problem, score_given, simulate_given

TIMELINE_BASELINES = (BaselineName.CURRENT, BaselineName.DEFAULT)  # drawn beside the pick


def paste_flags(layout: Layout) -> tuple[str, ...]:
    """What to add to the training command: the layout carries the VPP (Megatron derives the
    virtual stages from it)."""
    return (
        "--pipeline-model-parallel-size",
        str(layout.pp),
        "--pipeline-model-parallel-layout",
        str(layout),
    )


def outcomes(ab: ABOutcome, config: ABConfig) -> tuple[ArmOutcome, ...]:
    """What the report shows of each arm that was in the A/B."""
    last = ab.last_decisions
    rows = []
    for r in ab.results:
        values = steady_steps(r.trace, config)
        stats = arm_stats(values, config) if len(values) else None
        decision = last.get(r.arm.name)
        if r.run is None:
            status, reason = ArmStatus.NOT_RUN, "the test ended before its turn"
        elif r.trace.failure:
            status, reason = ArmStatus.FAILED, decision.reason if decision else r.trace.failure
        elif decision is None:
            status, reason = ArmStatus.FINISHED, "no decision"
        else:
            status, reason = decision.action.status, decision.reason
        measured = stats.mean_ms if stats and math.isfinite(stats.mean_ms) else None
        ci = None
        if stats and math.isfinite(stats.ci_low_ms):
            ci = (stats.ci_low_ms, stats.ci_high_ms)
        rows.append(
            ArmOutcome(
                arm=r.arm.name,
                layout=str(r.arm.layout),
                roles=r.arm.roles,
                predicted_ms=r.arm.predicted_ms,
                measured_ms=measured,
                ci_ms=ci,
                iterations=len(values),
                status=status,
                reason=reason,
                predicted_memory_gib=tuple(r.arm.predicted_memory_gib),
                measured_memory_gib=r.memory_gib,
                gpu_seconds=gpu_seconds([r.cost])[0],
                steps_ms=tuple(r.trace.steps_ms),
            )
        )
    return tuple(rows)


def predicted_only(arms: Sequence[Arm]) -> tuple[ArmOutcome, ...]:
    """The arms of a tune without an A/B: predictions only."""
    return tuple(
        ArmOutcome(
            arm=a.name,
            layout=str(a.layout),
            roles=a.roles,
            predicted_ms=a.predicted_ms,
            measured_ms=None,
            ci_ms=None,
            iterations=0,
            status=ArmStatus.NOT_RUN,
            reason="--ab-top 0: no A/B test",
            predicted_memory_gib=a.predicted_memory_gib,
            measured_memory_gib=None,
            gpu_seconds=0.0,
        )
        for a in arms
    )


def refit_note(
    recipe: Recipe, refined: Refit, ab: ABOutcome, searched: Searched, config: ABConfig
) -> str | None:
    """How far the refined model's predictions are from what the A/B measured, or why there was
    no refit (None: no A/B run to refit with)."""
    if refined.skipped is not None:
        return refined.skipped
    if refined.result is None:
        return None
    problem = Problem.of(recipe, refined.result.costs, searched.spec, searched.options)
    errors = [
        abs(score_given(layout, problem).mean_ms / measured - 1)
        for layout, measured in measured_arms(ab.results, config)
    ]
    if not errors:
        return "refit: no arm measured"
    worst, mean = 100 * max(errors), 100 * sum(errors) / len(errors)
    fitted = f" ({refined.fitted})" if refined.fitted else ""
    return (
        f"refit with the A/B runs{fitted}: the refined cost model is within {worst:.1f}% of "
        f"every measured arm (mean {mean:.1f}%); the next plan of this study uses it"
    )


def profile_gpu_seconds(store: CostStore, study: str, profiled: Sequence[ProfiledRun]) -> float:
    """GPU-seconds of the profiling runs, from their attempt rows."""
    runs = store.read("runs", study=study)
    seconds = 0.0
    for run in profiled:
        row = runs[runs.run_id == run.result.run_id]
        if len(row):
            wall = float(row.finished_at.iloc[-1] - row.started_at.iloc[-1])
            seconds += wall * len(run.result.returncodes)  # one GPU per rank
    return seconds


def timelines(
    recipe: Recipe, pick: Layout, searched: Searched, costs: UnitCosts
) -> dict[str, LayoutSimulation]:
    """The simulated steps the report draws: the pick's, then the config's current layout's (where
    it has one) and Megatron's default split's, keyed by their role."""
    shown = {PICK: pick}
    for b in searched.found.baselines:
        if b.name in TIMELINE_BASELINES and b.candidate is not None:
            shown[ArmRole.of(b.name).value] = b.candidate.layout
    problem = Problem.of(recipe, costs, searched.spec, searched.options)
    return {name: simulate_given(layout, problem) for name, layout in shown.items()}


def summarize(
    recipe: Recipe,
    *,
    settings: TuneSettings,
    config_path: str,
    searched: Searched,
    first: FitResult,
    arms: Sequence[Arm],
    ab: ABOutcome,
    profile_seconds: float,
    notes: Sequence[str],
    phase_seconds: Mapping[str, float],
) -> TuneSummary:
    """Everything the report shows, costs from the first fit (the search's); the pick is the
    A/B's winner, else the best prediction."""
    winner = ab.winner
    pick = winner.arm.layout if winner else arms[0].layout
    parallel = recipe.parallel
    spent, full = gpu_seconds([r.cost for r in ab.results]) if ab.results else (0.0, 0.0)
    return TuneSummary(
        model=recipe.model.name,
        config=config_path,
        study=settings.study,
        store=str(settings.store),
        backend=settings.backend.name,
        hardware=settings.backend.hardware,
        parallel=replace(parallel, vpp=pick.vpp).as_row(),
        hbm_gib=settings.options.hbm_gib,
        pick=str(pick),
        flags=paste_flags(pick),
        pick_source="A/B test" if winner else "prediction (no A/B)",
        arms=outcomes(ab, settings.options.ab) if ab.results else predicted_only(arms),
        decisions=ab.decisions,
        timelines=timelines(recipe, pick, searched, first.costs),
        unit_costs=first.costs,
        fit_warnings=tuple(first.warnings),
        search=SearchFacts(
            schedule=searched.found.schedule,
            method=searched.found.method,
            valid_layouts=searched.found.valid_layouts,
            scored=searched.found.scored,
            seconds=round(searched.seconds, 3),
        ),
        gpu_seconds_spent=profile_seconds + spent,
        gpu_seconds_full=profile_seconds + full,
        phase_seconds=dict(phase_seconds),
        notes=tuple(notes),
    )
