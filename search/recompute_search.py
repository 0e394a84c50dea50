"""Layout and recomputation chosen together: the fastest pair that fits.

What fits in HBM decides between recompute settings that cost 5% to 35% of a step, and the
layout and the setting interact: block recompute re-runs each chunk's first layers, and a layout
that overflows without recomputation may be the fastest once a cheap module is recomputed.  So
each setting real jobs use (``recompute_options``) is planned under the same HBM limit, the
candidates of all of them are ranked together, and a setting is skipped without planning when
no layout could beat the pick under it (its ideal step, all compute spread evenly with no
bubble, is no faster).  For each layout, no recomputation is the fastest setting; what it costs
comes from ``ray_layout.model.recompute_cost``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from ray_layout.model.fields import ModelSpec
from ray_layout.model.memory_settings import MemorySettings
from search.planner import (
    MapShards,
    Plan,
    Problem,
    baselines,
    ideal_step_ms,
    plan,
    score_given,
)
from search.ranking import Candidate
from search.space import LayoutSpace

JOINT_TIME_S = 24.0  # the whole joint search's budget of exact-search time, split by setting
LEAST_TIME_S = 1.0  # per setting: a second still proves most 1F1B optima
ASKED = "asked (--recompute auto)"


@dataclass(frozen=True)
class SettingPlan:
    """One recompute setting planned (``plan`` None: skipped, as ``floor_ms`` proves no layout
    under it beats the pick)."""

    settings: MemorySettings
    floor_ms: float  # no layout under this setting steps faster (noise-free)
    plan: Plan | None

    @property
    def flags(self) -> tuple[str, ...]:
        return self.settings.recompute_flags()

    @property
    def bound_ms(self) -> float:
        """No layout under this setting that fits steps faster: the plan's proven bound, its
        best candidate where it searched everything (inf where none fits), else the floor."""
        if self.plan is None:
            return self.floor_ms
        best = min((c.noise_free_ms for c in self.plan.candidates), default=math.inf)
        if self.plan.proven_bound_ms is not None:
            return min(self.plan.proven_bound_ms, best)
        return best


@dataclass(frozen=True)
class JointPlan:
    """Every setting tried, and the candidates of all of them, fastest first."""

    tried: tuple[SettingPlan, ...]
    candidates: tuple[Candidate, ...]

    @property
    def bound_ms(self) -> float:
        """No pair of layout and setting that fits steps faster (noise-free)."""
        return min((tried.bound_ms for tried in self.tried), default=math.inf)

    @property
    def pick(self) -> SettingPlan | None:
        """The setting of the fastest candidate (None: nothing fits under any)."""
        if not self.candidates:
            return None
        flags = self.candidates[0].recompute
        return next(t for t in self.tried if t.plan is not None and t.flags == flags)

    @property
    def gap(self) -> float:
        """How far the pick may be from the fastest pair (0: proven optimal)."""
        if not self.candidates:
            return 0.0
        return max(0.0, 1.0 - self.bound_ms / self.candidates[0].noise_free_ms)


def recompute_options(
    model: ModelSpec, job: MemorySettings, stages: int, ep_overlap: bool = False
) -> tuple[MemorySettings, ...]:
    """The settings searched, from the cheapest: none, the job's own, selective recompute of
    ever more modules (the cheap ones first: norms, the experts' activation, MLA's
    up-projections; then core attention; then the MLPs), full recompute of each chunk's first 1
    to ``ceil(layers / stages)`` layers (block), and of every layer (uniform, one per
    checkpoint, as megatron-core requires with MTP); no module megatron-core refuses for the
    job (``MemorySettings.recompute_refusal``: ``moe_act`` needs grouped GEMM, say), and no full
    recompute beside EP all-to-all overlap (``combined.rule_violations``)."""
    plain = job.without_recompute()
    mla, mtp = model.mla is not None, bool(model.mtp_num_layers)

    def accepted(settings: MemorySettings) -> bool:
        return settings.recompute_refusal(mla=mla, mtp=mtp) is None

    def selective(modules: set[str]) -> MemorySettings:
        return replace(
            plain, recompute_granularity="selective", recompute_modules=frozenset(modules)
        )

    moe, dense = any(model.moe_layer_pattern), not all(model.moe_layer_pattern)
    cheap = {"layernorm"} | ({"moe_act"} if moe else set()) | ({"mla_up_proj"} if mla else set())
    attention = cheap | {"core_attn"}
    mlps = attention | ({"mlp"} if dense else set())
    mlps |= {"shared_experts"} if model.moe_shared_expert_intermediate_size else set()
    ladders = [cheap, attention, mlps, mlps | ({"moe"} if moe else set())]
    allowed = {module for ladder in ladders for module in ladder if accepted(selective({module}))}
    selectives = [selective(ladder & allowed) for ladder in ladders if ladder & allowed]
    full = replace(plain, recompute_granularity="full")
    block = [
        replace(full, recompute_method="block", recompute_num_layers=layers)
        for layers in range(1, math.ceil(model.num_layers / stages) + 1)
    ]
    uniform = replace(full, recompute_method="uniform", recompute_num_layers=1)
    fulls = [] if ep_overlap else [*block, uniform]
    runs = [s for s in [*selectives, *fulls] if accepted(s)]
    return tuple(dict.fromkeys([plain, job, *runs]))


def floor_ms(problem: Problem) -> float:
    """No layout of the problem steps faster: its ideal step (``planner.ideal_step_ms``), all
    compute spread evenly over the ranks with no bubble; block recomputation left out, which
    keeps it a floor."""
    space = LayoutSpace.of(
        problem.model,
        problem.parallel,
        allow_empty_stages=problem.spec.allow_empty_stages,
        allow_standalone_mtp=problem.spec.allow_standalone_mtp,
    )
    program, cost_model = problem.schedule(problem.parallel)
    return ideal_step_ms(cost_model, space, program)


def joint_plan(
    problem: Problem,
    progress: Callable[[str], None] | None = None,
    map_shards: MapShards | None = None,
    time_limit_s: float = JOINT_TIME_S,
) -> JointPlan:
    """Every setting of ``recompute_options`` planned under the problem's HBM limit (those no
    layout under which beats the pick so far skipped), their candidates ranked together."""
    stages = problem.parallel.pp * problem.parallel.vpp
    options = recompute_options(problem.model, problem.memory, stages, problem.ep_overlap.on)
    each_s = max(LEAST_TIME_S, time_limit_s / len(options))
    spec = replace(problem.spec, time_limit_s=min(problem.spec.time_limit_s, each_s))
    tried: list[SettingPlan] = []
    candidates: list[Candidate] = []
    best = math.inf
    for settings in options:
        setting = replace(problem, memory=settings, spec=spec)
        floor = floor_ms(setting)
        if floor >= best:
            tried.append(SettingPlan(settings, floor, None))
            continue
        if progress is not None:
            progress(f"recompute {' '.join(settings.recompute_flags()) or 'none'}")
        found = plan(setting, progress, map_shards)
        tried.append(SettingPlan(settings, floor, found))
        candidates += found.candidates
        best = min((c.noise_free_ms for c in candidates), default=math.inf)
    ranked = sorted(candidates, key=lambda c: (c.mean_ms, c.noise_free_ms))
    fastest = {str(c.layout): c for c in reversed(ranked)}  # each layout at its best setting
    kept = [c for c in ranked if fastest[str(c.layout)] is c]
    return JointPlan(tuple(tried), tuple(kept[: problem.options.top]))


def setting_name(flags: Sequence[str]) -> str:
    """A recompute setting in a few words: ``none``, ``selective core_attn,moe_act``,
    ``full uniform 1``, ``full block 2``."""
    words = list(flags)
    if not words:
        return "none"
    if words[1] == "selective":
        return "selective " + ",".join(words[words.index("--recompute-modules") + 1 :])
    return f"full {words[3]} {words[5]}"


def searched_plan(
    problem: Problem,
    mode: str,
    progress: Callable[[str], None] | None = None,
    map_shards: MapShards | None = None,
) -> tuple[Plan, JointPlan | None, str]:
    """The plan ``plan`` and ``tune`` rank from (``mode``: ``--recompute``'s job or auto): the
    job's own setting alone while it fits a layout, else layout x recompute (``joint_plan``,
    merged by ``joint_as_plan``), with why it searched the pair (empty where it did not)."""
    own = None
    if mode == "job":
        own = plan(problem, progress, map_shards)
        if own.candidates or problem.options.hbm_gib is None:
            return own, None, ""
        name = setting_name(problem.memory.recompute_flags())
        limit = problem.options.hbm_gib
        why = f"the job's own recompute setting ({name}) fits no layout in {limit:g} GiB"
    else:
        why = ASKED
    joint = joint_plan(problem, progress, map_shards)
    return joint_as_plan(joint, problem, own), joint, why


def joint_as_plan(joint: JointPlan, problem: Problem, own: Plan | None = None) -> Plan:
    """The joint search as one plan: every setting's candidates ranked together, the baselines
    under the job's own setting (``own``: its plan where it was searched before the joint
    search; scored here where the joint search skipped it), the counts of every search added
    up, the joint bound, and the smallest peak under any setting."""
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
        proven_bound_ms=joint.bound_ms if joint.candidates else None,
        complete=all(p.complete for p in planned),
        ties=(),  # counted per setting's search: they do not follow the merged ranking
        bound_reason="",
        smallest_peak_gib=min(p.smallest_peak_gib for p in searched),
    )


def recompute_price(candidate: Candidate, problem: Problem) -> float:
    """How much longer the candidate's step is than its layout's without recomputation (0 for
    a candidate that recomputes nothing)."""
    if not candidate.recompute:
        return 0.0
    plain = replace(problem, memory=problem.memory.without_recompute())
    return candidate.mean_ms / score_given(candidate.layout, plain).mean_ms - 1.0
