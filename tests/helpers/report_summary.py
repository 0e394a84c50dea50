"""Tune summaries for the report's tests: small arms with round numbers, and the realistic
handbook summary (PP=4, example costs) with its variants: no A/B, a config with a current layout;
and readers of what the report wrote (Markdown tables, well-formed HTML)."""

from __future__ import annotations

import dataclasses
import math
import re
from html.parser import HTMLParser

import numpy as np

from ray_layout.ab.decisions import Decision
from ray_layout.ab.vocabulary import ABAction, ArmRole, ArmStatus
from ray_layout.model.costs import load_costs
from ray_layout.model.layout import Layout
from ray_layout.model.loading import load_recipe
from ray_layout.report.summary import ArmOutcome, SearchFacts, TuneSummary
from search.planner import PlanOptions, Problem, SearchSpec, simulate_given

HANDBOOK = "configs/handbook_7b_a1b.yaml"
COSTS = "configs/costs/handbook_h200_example.json"
PICK = "Et*5|t*6|t*5|mL"
DEFAULT = "Et*4|t*4|t*4|t*4mL"
COUNT = "Et*4|t*5|t*5|t*2mL"
HBM = 131.0


def arm(name, predicted, measured, layout=None, status=None, **kw):
    """A small arm with round numbers, for the arithmetic tests."""
    return ArmOutcome(
        arm=name,
        layout=layout or f"Et*{len(name)}|L",
        roles=(ArmRole.CANDIDATE,),
        predicted_ms=predicted,
        measured_ms=measured,
        ci_ms=None if measured is None else (measured - 1.0, measured + 1.0),
        iterations=0 if measured is None else 30,
        status=status or (ArmStatus.NOT_RUN if measured is None else ArmStatus.LOST),
        reason="",
        predicted_memory_gib=(),
        measured_memory_gib=None,
        gpu_seconds=0.0,
        **kw,
    )


def steps(measured: float, steady: int, seed: int) -> tuple[float, ...]:
    """Three warm-up spikes, then ``steady`` steps whose mean is ``measured``."""
    rng = np.random.default_rng(seed)
    warm_up = [measured * 3.0, measured * 1.4, measured * 1.05]
    noise = rng.normal(0.0, 0.004 * measured, steady)
    noise -= noise.mean()  # the steady mean is exactly the measured mean
    return tuple(round(x, 3) for x in warm_up + list(measured + noise))


def handbook_summary() -> TuneSummary:
    """The handbook recipe on PP=4 with the example costs: five arms, four decisions, every
    section of the report filled."""
    recipe = load_recipe(HANDBOOK)
    costs = load_costs(COSTS)
    spec, options = SearchSpec(num_microbatches=32), PlanOptions(hbm_gib=HBM)

    def simulate(layout: str):
        return simulate_given(Layout.parse(layout, 4), Problem.of(recipe, costs, spec, options))

    sims = {
        name: simulate(layout)
        for name, layout in [
            ("pick", PICK),
            ("Megatron default", DEFAULT),
            ("count-based rule", COUNT),
        ]
    }
    # (arm, layout, role, measured, steady iterations, status, reason)
    table = [
        (
            "candidate-1",
            PICK,
            ArmRole.CANDIDATE,
            6310.0,
            40,
            ArmStatus.WON,
            "fastest; every rival stopped",
        ),
        (
            "candidate-2",
            "Et*5|t*5|t*6|mL",
            ArmRole.CANDIDATE,
            6420.0,
            24,
            ArmStatus.STOPPED,
            "slower than candidate-1, p = 0.003 < 0.01",
        ),
        (
            "candidate-3",
            "Et*4|t*6|t*6|mL",
            ArmRole.CANDIDATE,
            None,
            0,
            ArmStatus.FAILED,
            "rank 2 ran out of memory (CUDA OOM)",
        ),
        (
            "default",
            DEFAULT,
            ArmRole.DEFAULT,
            9400.0,
            12,
            ArmStatus.STOPPED,
            "slower than candidate-1 at look 1",
        ),
        (
            "count-based",
            COUNT,
            ArmRole.COUNT_BASED,
            7450.0,
            16,
            ArmStatus.STOPPED,
            "slower than candidate-1 at look 2",
        ),
    ]
    arms = []
    for index, (name, layout, role, measured, steady, status, reason) in enumerate(table):
        sim = simulate(layout)
        arms.append(
            ArmOutcome(
                arm=name,
                layout=layout,
                roles=(role,),
                predicted_ms=sim.candidate.mean_ms,
                measured_ms=measured,
                ci_ms=None if measured is None else (measured - 15.0, measured + 15.0),
                iterations=steady,
                status=status,
                reason=reason,
                predicted_memory_gib=sim.candidate.memory_gib,
                measured_memory_gib=None
                if measured is None
                else tuple(round(m * 1.03, 2) for m in sim.candidate.memory_gib),
                gpu_seconds=8 * (steady + 3) * (measured or 0.0) / 1000,
                steps_ms=() if measured is None else steps(measured, steady, index),
            )
        )
    decisions = (
        Decision(
            "default",
            DEFAULT,
            1,
            ABAction.STOP,
            "slower than candidate-1",
            -9.1,
            1.2e-6,
            "candidate-1",
            12,
            9400.0,
        ),
        Decision(
            "count-based",
            COUNT,
            2,
            ABAction.STOP,
            "slower than candidate-1",
            -5.2,
            4.0e-4,
            "candidate-1",
            16,
            7450.0,
        ),
        Decision(
            "candidate-2",
            "Et*5|t*5|t*6|mL",
            3,
            ABAction.STOP,
            "slower than candidate-1",
            -3.1,
            0.003,
            "candidate-1",
            24,
            6420.0,
        ),
        Decision(
            "candidate-1",
            PICK,
            4,
            ABAction.WIN,
            "every rival stopped",
            math.nan,
            math.nan,
            None,
            40,
            6310.0,
        ),
    )
    return TuneSummary(
        model="handbook_7b_a1b",
        config=HANDBOOK,
        study="h200-study",
        store="costs_store",
        backend="emulated",
        hardware="8x H200 (emulated)",
        parallel={
            "pp": 4,
            "vpp": 1,
            "tp": 1,
            "ep": 2,
            "dp": 2,
            "micro_batch_size": 2,
            "global_batch_size": 128,
            "num_microbatches": 32,
        },
        hbm_gib=HBM,
        pick=PICK,
        flags=("--pipeline-model-parallel-size", "4", "--pipeline-model-parallel-layout", PICK),
        pick_source="A/B test",
        arms=tuple(arms),
        decisions=decisions,
        timelines=sims,
        unit_costs=costs,
        fit_warnings=("unit m: residual 4.1% above the 3% target",),
        search=SearchFacts(
            schedule="1f1b", method="enumeration", valid_layouts=816, scored=680, seconds=0.08
        ),
        gpu_seconds_spent=1200.0,
        gpu_seconds_full=2000.0,
        phase_seconds={
            "size": 0.2,
            "profile": 310.0,
            "fit": 1.5,
            "search": 0.1,
            "ab": 540.0,
            "report": 2.0,
        },
        notes=("emulated backend: step times are the emulator's, not a GPU's",),
    )


def no_ab(summary: TuneSummary) -> TuneSummary:
    """The same tune without an A/B: predictions only."""
    arms = tuple(
        dataclasses.replace(
            a,
            measured_ms=None,
            ci_ms=None,
            iterations=0,
            status=ArmStatus.NOT_RUN,
            reason="no A/B asked",
            measured_memory_gib=None,
            gpu_seconds=0.0,
            steps_ms=(),
        )
        for a in summary.arms
    )
    return dataclasses.replace(
        summary,
        arms=arms,
        decisions=(),
        pick_source="prediction (no A/B)",
        gpu_seconds_spent=400.0,
        gpu_seconds_full=400.0,
    )


CURRENT = "Et*3|t*5|t*5|t*3mL"  # what the config runs today: 7,572 ms measured, 1.20x the pick's


def with_current(summary: TuneSummary) -> TuneSummary:
    """The tune of a config whose split gives ``CURRENT``: one more arm, and its timeline."""
    problem = Problem.of(
        load_recipe(HANDBOOK), summary.unit_costs, SearchSpec(32), PlanOptions(hbm_gib=HBM)
    )
    sim = simulate_given(Layout.parse(CURRENT, 4), problem)
    current = dataclasses.replace(
        summary.arms[3],
        arm="current",
        layout=CURRENT,
        roles=(ArmRole.CURRENT,),
        predicted_ms=sim.candidate.mean_ms,
        measured_ms=7572.0,
        ci_ms=(7557.0, 7587.0),
        steps_ms=steps(7572.0, 12, 9),
    )
    return dataclasses.replace(
        summary,
        arms=(*summary.arms[:3], current, *summary.arms[3:]),
        timelines={**summary.timelines, ArmRole.CURRENT.value: sim},
    )


def markdown_tables(text: str) -> list[list[list[str]]]:
    """Every Markdown table: rows of cells, split on pipes without a backslash before them."""
    tables, current = [], []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            current.append([c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]])
        elif current:
            tables.append(current)
            current = []
    return tables


class HtmlChecker(HTMLParser):
    """Tags left open or closed out of order, tag counts and image sources of a page."""

    VOID = frozenset({"meta", "img", "br", "hr", "link", "input"})

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []
        self.problems: list[str] = []
        self.counts: dict[str, int] = {}
        self.images: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.counts[tag] = self.counts.get(tag, 0) + 1
        if tag == "img":
            self.images.append(dict(attrs)["src"])
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        if not self.stack or self.stack[-1] != tag:
            self.problems.append(f"</{tag}> closes {self.stack[-1:] or 'nothing'}")
        else:
            self.stack.pop()
