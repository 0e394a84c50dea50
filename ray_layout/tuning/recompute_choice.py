"""Which recomputation the tune searches: the job's own setting alone (``--recompute job``), or
layout and recompute setting together (``search.recompute_search``), asked for with
``--recompute auto`` or taken when the job's own setting fits no layout under the HBM limit, as
an A/B of layouts that cannot run would measure nothing.  The arms are then ranked from the
pairs, and the baselines stay what the user runs today: their layouts under the job's own
flags."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from ray_layout.errors import ConfigError
from search.planner import MapShards, Plan, Problem, baselines, plan
from search.recompute_search import JointPlan, joint_plan


def setting_name(flags: tuple[str, ...]) -> str:
    """A recompute setting as one readable phrase: its flags, or ``no recomputation``."""
    return " ".join(flags) or "no recomputation"


def recompute_search(
    problem: Problem,
    mode: str,
    progress: Callable[[str], None] | None = None,
    map_shards: MapShards | None = None,
) -> tuple[Plan, str]:
    """The plan the tune chooses its arms from (``mode``: ``--recompute``'s job or auto), and
    why it searched layout x recompute (empty where it searched the job's own setting alone); a
    one-line :class:`ConfigError` where no layout fits under any setting."""
    own = None
    if mode == "job":
        own = plan(problem, progress, map_shards)
        if own.candidates:
            return own, ""
        flags = setting_name(problem.memory.recompute_flags())
        why = f"the job's own recompute setting ({flags}) fits no layout in {_hbm(problem)}"
    else:
        why = "asked (--recompute auto)"
    joint = joint_plan(problem, progress, map_shards)
    if not joint.candidates:
        smallest = min(t.plan.smallest_peak_gib for t in joint.tried if t.plan is not None)
        raise ConfigError(
            f"no layout fits in {_hbm(problem)} under any recompute setting (the smallest peak "
            f"of any layout scored is {smallest:,.1f} GiB): more EP or TP, or a smaller "
            "micro-batch lowers it"
        )
    return joint_as_plan(joint, problem, own), f"{why}: searched layout x recompute"


def joint_as_plan(joint: JointPlan, problem: Problem, own: Plan | None = None) -> Plan:
    """The joint search as one plan: every setting's candidates ranked together, the
    baselines under the job's own setting (``own``: its plan where the tune searched it before
    the joint search), and the counts of every search added up."""
    planned = [t.plan for t in joint.tried if t.plan is not None]
    searched = [*planned, *([own] if own is not None else [])]
    if own is None:
        job = [t.plan for t in joint.tried if t.settings == problem.memory]
        own = next((found for found in job if found is not None), None)
    base = own or replace(planned[0], baselines=baselines(problem))
    return replace(
        base,
        candidates=joint.candidates,
        scored=sum(p.scored for p in searched),
        sampled=sum(p.sampled for p in searched),
        rejected_memory=sum(p.rejected_memory for p in searched),
        proven_bound_ms=joint.bound_ms,
        complete=all(p.complete for p in planned),
        ties=(),  # counted per setting's search: they do not follow the merged ranking
        bound_reason="",
    )


def _hbm(problem: Problem) -> str:
    return f"{problem.options.hbm_gib:g} GiB"
