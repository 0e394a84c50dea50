"""What the tune found, as one frozen :class:`TuneSummary`, and the numbers the report derives
from it: how well the predictions held, the pick's speedups, the GPU time early stopping saved.

Every renderer (the documents, the plots, the terminal) reads these and nothing else, so they
cannot disagree.
"""

from __future__ import annotations

import math
import shlex
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from ray_layout.ab.decisions import Decision
from ray_layout.ab.vocabulary import ArmRole, ArmStatus, role_label
from ray_layout.model.costs import UnitCosts
from ray_layout.model.layout import Layout
from search.planner import Candidate, LayoutSimulation

BASELINES = (ArmRole.CURRENT, ArmRole.DEFAULT, ArmRole.COUNT_BASED)  # speedups in this order
PICK = "pick"  # the timeline of the pick; the baselines' timelines go by their role


@dataclass(frozen=True)
class ArmOutcome:
    """One layout considered for the A/B, and what became of it."""

    arm: str  # "candidate-1", "candidate-2", ..., "current", "default", "count-based"
    layout: str  # e.g. "Et*5|t*6|t*5|mL"
    roles: tuple[ArmRole, ...]  # a candidate that is also a baseline holds both
    predicted_ms: float  # simulated mean step time under the cost model the search used
    measured_ms: float | None  # mean steady-state step time in the A/B (None: never got there)
    ci_ms: tuple[float, float] | None  # its confidence interval
    iterations: int  # steady iterations measured
    status: ArmStatus
    reason: str  # one line: why it stopped / won / failed
    predicted_memory_gib: tuple[float, ...]  # per PP rank
    measured_memory_gib: tuple[float, ...] | None  # measured max allocated per PP rank
    gpu_seconds: float
    steps_ms: tuple[float, ...] = ()  # per-iteration step times (warm-up included)
    recompute: tuple[str, ...] = ()  # the Megatron recompute flags it ran with (none: empty)

    @property
    def role(self) -> str:
        """The roles as the report and JSON show them: "candidate + count-based rule"."""
        return role_label(self.roles)


@dataclass(frozen=True)
class SearchFacts:
    """What the search did, in the order the report lists it."""

    schedule: str  # the pipeline schedule the job's flags select: 1f1b, interleaved, ...
    method: str  # "enumeration" or "exact search"
    valid_layouts: int
    scored: int
    seconds: float


@dataclass(frozen=True)
class TuneSummary:
    """Everything the tune driver found, as the report shows it."""

    model: str
    config: str  # path of the model config given
    study: str
    store: str  # cost store folder
    backend: str  # "emulated" or "megatron"
    hardware: str
    parallel: Mapping[str, int | None]  # pp, vpp, tp, ep, dp, micro/global batch, micro-batches
    hbm_gib: float | None
    pick: str  # the chosen layout
    flags: tuple[str, ...]  # exact Megatron flags to paste
    pick_source: str  # "A/B test" or "prediction (no A/B)"
    arms: tuple[ArmOutcome, ...]  # every layout considered for the A/B
    decisions: tuple[Decision, ...]  # in the order they were made
    timelines: Mapping[str, LayoutSimulation]  # PICK and each baseline's role
    unit_costs: UnitCosts | None
    fit_warnings: tuple[str, ...]
    search: SearchFacts | None
    gpu_seconds_spent: float  # whole tune: profiling + A/B
    gpu_seconds_full: float  # profiling + every A/B arm run to its end
    phase_seconds: Mapping[str, float]  # wall seconds per phase
    notes: tuple[str, ...] = ()
    recompute: tuple[str, ...] = ()  # the pick's recompute flags (in ``flags`` where new)
    job_recompute: tuple[str, ...] = ()  # the recompute flags the user's job runs today


@dataclass(frozen=True)
class Accuracy:
    """How well the predictions matched the A/B's measurements."""

    errors: Mapping[str, float]  # arm -> predicted / measured - 1, measured arms only
    mean_abs_error: float | None
    max_abs_error: float | None
    worst_arm: str | None  # the arm of the largest absolute error
    spearman: float | None  # rank correlation of predicted and measured (None: < 3, or constant)

    @property
    def measured(self) -> int:
        return len(self.errors)


@dataclass(frozen=True)
class Speedup:
    """The pick's speedup over one baseline (baseline step / pick step)."""

    baseline: ArmRole
    value: float | None
    basis: str | None  # "measured" (both measured in the A/B), "predicted", or None
    pick_ms: float | None
    baseline_ms: float | None
    baseline_layout: str | None
    note: str = ""  # why there is no value


def finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x)


def is_measured(arm: ArmOutcome) -> bool:
    return finite(arm.measured_ms) and arm.measured_ms > 0


def _spearman(x: Sequence[float], y: Sequence[float]) -> float | None:
    if len(x) < 3 or len(set(x)) < 2 or len(set(y)) < 2:
        return None
    from scipy.stats import spearmanr

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rho = float(spearmanr(x, y).statistic)
    return rho if math.isfinite(rho) else None


def prediction_accuracy(arms: Iterable[ArmOutcome]) -> Accuracy:
    """Relative error of every measured arm, their mean and largest absolute value, and the
    Spearman rank correlation of predicted against measured step time."""
    measured = [a for a in arms if is_measured(a) and finite(a.predicted_ms)]
    errors = {a.arm: a.predicted_ms / a.measured_ms - 1 for a in measured}
    if not errors:
        return Accuracy(MappingProxyType({}), None, None, None, None)
    worst = max(errors, key=lambda arm: abs(errors[arm]))
    return Accuracy(
        errors=MappingProxyType(errors),
        mean_abs_error=sum(abs(e) for e in errors.values()) / len(errors),
        max_abs_error=abs(errors[worst]),
        worst_arm=worst,
        spearman=_spearman([a.predicted_ms for a in measured], [a.measured_ms for a in measured]),
    )


def pick_arm(summary: TuneSummary) -> ArmOutcome | None:
    """The arm that ran the pick: the winner if it holds the pick, else a candidate, else any."""
    holding = [a for a in summary.arms if a.layout == summary.pick]
    for wanted in (lambda a: a.status is ArmStatus.WON, lambda a: ArmRole.CANDIDATE in a.roles):
        for arm in holding:
            if wanted(arm):
                return arm
    return holding[0] if holding else None


def baseline_arm(summary: TuneSummary, role: ArmRole) -> ArmOutcome | None:
    """The arm of a baseline (an arm may be a candidate and a baseline at once)."""
    return next((arm for arm in summary.arms if role in arm.roles), None)


def simulated(summary: TuneSummary, name: str) -> Candidate | None:
    """The scored candidate of a simulated timeline (``None`` where there is none)."""
    timeline = summary.timelines.get(name)
    return timeline.candidate if timeline is not None else None


def predicted_ms(arm: ArmOutcome | None, summary: TuneSummary, name: str) -> float | None:
    """The arm's prediction, else that of the timeline ``name``."""
    if arm is not None and finite(arm.predicted_ms):
        return arm.predicted_ms
    candidate = simulated(summary, name)
    return candidate.mean_ms if candidate is not None and finite(candidate.mean_ms) else None


def has_current(summary: TuneSummary) -> bool:
    """Whether the config runs a layout of its own (an arm or a timeline holds it)."""
    current = ArmRole.CURRENT
    return baseline_arm(summary, current) is not None or current in summary.timelines


def speedups(summary: TuneSummary) -> dict[ArmRole, Speedup]:
    """The pick's speedup over the config's current layout (only where it has one), Megatron's
    default and the count-based rule, in that order, keyed by baseline: measured when the A/B
    measured both the pick and the baseline, else predicted."""
    pick = pick_arm(summary)
    found = {}
    for role in BASELINES:
        if role is ArmRole.CURRENT and not has_current(summary):
            continue
        base = baseline_arm(summary, role)
        scored = simulated(summary, role)
        layout = base.layout if base is not None else scored.layout if scored else None
        if pick is not None and base is not None and is_measured(pick) and is_measured(base):
            found[role] = Speedup(
                role,
                base.measured_ms / pick.measured_ms,
                "measured",
                pick.measured_ms,
                base.measured_ms,
                layout,
            )
            continue
        pick_ms = predicted_ms(pick, summary, PICK)
        base_ms = predicted_ms(base, summary, role)
        if pick_ms is None or base_ms is None or pick_ms <= 0:
            why = "no prediction of the pick" if pick_ms is None else f"no {role} layout scored"
            found[role] = Speedup(role, None, None, pick_ms, base_ms, layout, why)
        else:
            found[role] = Speedup(role, base_ms / pick_ms, "predicted", pick_ms, base_ms, layout)
    return found


def paste_line(summary: TuneSummary) -> str:
    """The flags as one shell line (quoted where the shell needs it, as ``|`` and ``*`` do)."""
    if summary.flags:
        return shlex.join(summary.flags)
    return shlex.join(("--pipeline-model-parallel-layout", summary.pick))


def pick_layout(summary: TuneSummary) -> Layout | None:
    """The pick as a layout (None when the run's PP is not given)."""
    pp = summary.parallel.get("pp")
    return Layout.parse(summary.pick, pp) if pp else None


def pick_shape(summary: TuneSummary) -> tuple[int | None, int | None]:
    """(PP, VPP) of the pick: VPP from the layout's stages per rank where the PP is known, else
    the run's."""
    layout = pick_layout(summary)
    if layout is not None:
        return layout.pp, layout.vpp
    return summary.parallel.get("pp"), summary.parallel.get("vpp")


def gpu_saving(summary: TuneSummary) -> float | None:
    """The share of GPU-seconds early stopping saved: 1 - spent / full (None: full unknown)."""
    return saved_share(summary.gpu_seconds_spent, summary.gpu_seconds_full)


def saved_share(spent: float, full: float) -> float | None:
    """1 - spent / full, the share of ``full`` not spent (None: full unknown)."""
    if not finite(full) or full <= 0:
        return None
    return 1 - spent / full
