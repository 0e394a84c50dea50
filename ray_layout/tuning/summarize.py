"""From what the phases found to the report's :class:`TuneSummary`: each arm's outcome, the GPU
time, the notes the user must read (a refit that could not run, an A/B without a winner, a pick
that recomputes otherwise than the job)."""

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
from ray_layout.tuning.refit import Refit, arm_problem, measured_arms
from ray_layout.tuning.settings import TuneSettings
from search.planner import LayoutSimulation, Problem, score_given, simulate_given

TIMELINE_BASELINES = (BaselineName.CURRENT, BaselineName.DEFAULT)  # drawn beside the pick


def paste_flags(layout: Layout, recompute: Sequence[str] = ()) -> tuple[str, ...]:
    """What to add to the training command: the layout carries the VPP (Megatron derives the
    virtual stages from it), then the recompute flags where the pick's are not the job's."""
    return (
        "--pipeline-model-parallel-size",
        str(layout.pp),
        "--pipeline-model-parallel-layout",
        str(layout),
        *recompute,
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
                recompute=r.arm.recompute,
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
            recompute=a.recompute,
        )
        for a in arms
    )


def refit_note(
    recipe: Recipe, refined: Refit, ab: ABOutcome, searched: Searched, config: ABConfig
) -> str | None:
    """How far the refined model's predictions are from what the A/B measured (each arm under
    its own recomputation), or why there was no refit, and the runs it left out (None: no A/B
    run to refit with)."""
    said = [refined.skipped] if refined.skipped is not None else []
    if refined.result is not None and refined.skipped is None:
        costs = refined.result.costs
        errors = [
            abs(score_given(arm.layout, arm_problem(recipe, arm, costs, searched)).mean_ms / ms - 1)
            for arm, ms in measured_arms(ab.results, config)
        ]
        if errors:
            worst, mean = 100 * max(errors), 100 * sum(errors) / len(errors)
            fitted = f" ({refined.fitted})" if refined.fitted else ""
            said.append(
                f"refit with the A/B runs{fitted}: the refined cost model is within "
                f"{worst:.1f}% of every measured arm (mean {mean:.1f}%); the next plan of this "
                "study uses it"
            )
        else:
            said.append("refit: no arm measured")
    if refined.left_out is not None:
        said.append(refined.left_out)
    return "; ".join(said) or None


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
    recipe: Recipe, pick: Arm, searched: Searched, costs: UnitCosts
) -> dict[str, LayoutSimulation]:
    """The simulated steps the report draws: the pick's (under its recomputation), then the
    config's current layout's (where it has one) and Megatron's default split's, under the
    job's own flags, keyed by their role."""
    problem = Problem.of(recipe, costs, searched.spec, searched.options)
    shown = {PICK: simulate_given(pick.layout, arm_problem(recipe, pick, costs, searched))}
    for b in searched.found.baselines:
        if b.name in TIMELINE_BASELINES and b.candidate is not None:
            shown[ArmRole.of(b.name).value] = simulate_given(b.candidate.layout, problem)
    return shown


def recompute_note(job: Sequence[str], pick: Sequence[str]) -> str | None:
    """What the user must change besides pasting the flags, where the pick recomputes otherwise
    than the job (None: it does not)."""
    if tuple(job) == tuple(pick):
        return None
    if not job:
        return f"the pick recomputes ({' '.join(pick)}): the flags to paste carry it"
    instead = f"and paste {' '.join(pick)}" if pick else "to run without recomputation"
    return (
        f"the pick recomputes otherwise than your job: take out your recompute flags "
        f"({' '.join(job)}) {instead}"
    )


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
    A/B's winner, else the best prediction, with the recomputation it ran."""
    winner = ab.winner
    arm = winner.arm if winner else arms[0]
    pick, job = arm.layout, recipe.flags.memory.recompute_flags()
    changed = recompute_note(job, arm.recompute)
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
        flags=paste_flags(pick, arm.recompute if changed else ()),
        pick_source="A/B test" if winner else "prediction (no A/B)",
        arms=outcomes(ab, settings.options.ab) if ab.results else predicted_only(arms),
        decisions=ab.decisions,
        timelines=timelines(recipe, arm, searched, first.costs),
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
        notes=(*notes, *([changed] if changed else [])),
        recompute=arm.recompute,
        job_recompute=job,
    )
