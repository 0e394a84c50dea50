"""Small cost models with round numbers, for tests of the evaluator, planner and exact search."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ray_layout.model.costs import load_costs
from ray_layout.model.loading import load_recipe
from ray_layout.model.sizing import GIB
from ray_layout.model.spec import with_parallel
from ray_layout.model.split import PipelineSplit
from search.combined import merge_savings
from search.cost_model import CostModel, in_flight_at_peak
from search.evaluate import _standalone_rank, hidden_ms, stage_times, tail_ms
from search.exact import ExactResult, exact_search
from search.pipeline_ops import ScheduleShape
from search.planner import Plan, PlanOptions, Problem, SearchSpec, plan
from search.schedule import Program, compile_schedule
from search.simulator import simulate
from search.space import LayoutSpace
from search.ties import prediction_key

UNITS = ("E", "t", "m", "L")


def toy_cost_model(
    pp: int,
    vpp: int = 1,
    microbatches: int = 8,
    layers: int = 16,
    forward=(1.0, 10.0, 14.0, 38.0),
    jitter: float = 0.0,
    p2p: float = 0.4,
    tail_ms_per_gparam: float = 5.0,
    block_layers: int = 0,
) -> CostModel:
    """The handbook's shape with hand-chosen unit costs (m = 1.4 t, L = 3.8 t); under
    ``block_layers`` each chunk's first layers re-run their forward in their backward."""
    forward = np.array(forward, dtype=float)
    return CostModel(
        units=UNITS,
        moe_pattern=(True,) * layers,
        forward_ms=forward,
        backward_ms=2 * forward,
        jitter_cv=np.full(len(UNITS), jitter),
        static_bytes=np.array([3.0, 3.5, 3.6, 3.0]) * GIB,
        activation_bytes=np.array([0.1, 0.5, 0.6, 0.3]) * GIB,
        tail_params=np.array([0.13, 0.2, 0.21, 0.13]),
        p2p_ms=np.full(pp, p2p),
        tail_ms_per_gparam=tail_ms_per_gparam,
        logits_bytes=4 * GIB,
        standalone_copy_bytes=3 * GIB,
        standalone_copy_params=0.13,
        overhead_bytes=3 * GIB,
        mtp_standalone_factor=1.12,
        in_flight=in_flight_at_peak(ScheduleShape(pp, vpp, microbatches)),
        block_layers=block_layers,
        block_recompute_ms=forward * np.array([0, 1, 0, 0]) if block_layers else None,
    )


def plain_steps(space: LayoutSpace, program: Program, cost_model: CostModel):
    """(cuts, noise-free steps) of every layout of ``space`` by the plain simulator: the oracle
    the planner's fast paths are checked against."""
    cuts = np.concatenate(list(space.cut_blocks()))
    counts = space.unit_counts(cuts, cost_model.units, cost_model.moe_pattern)
    forward, backward = stage_times(cost_model, counts)
    tail = tail_ms(cost_model, counts, program.shape.pp)
    hidden = hidden_ms(program, cost_model, counts)
    step = simulate(
        program, forward.T, backward.T, cost_model.p2p_ms, tail.T, hidden_ms=hidden
    ).step
    standalone = _standalone_rank(counts, cost_model, program.shape.pp).any(axis=1)
    return cuts, step * np.where(standalone, cost_model.mtp_standalone_factor, 1.0)


def optimal_set(space: LayoutSpace, cuts: np.ndarray, steps: np.ndarray) -> set[str]:
    """The layouts whose step equals the best one's (to the tie resolution)."""
    keys = prediction_key(steps)
    return {space.layout_string(row) for row in cuts[keys == keys.min()]}


def distinct(steps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct predictions, best first, and how many layouts make each."""
    return np.unique(prediction_key(steps), return_counts=True)


def check_exact_top_two(case) -> ExactResult:
    """The exact search's best two predictions, their layout counts and its pick, against the
    plain simulator's enumeration of a toy ``case``."""
    space, program, cost_model, cuts, steps = case
    values, counts = distinct(steps)
    found = exact_search(space, program, cost_model=cost_model, top=2)
    assert [c.step_ms for c in found.classes] == values[:2].tolist()
    assert [c.count for c in found.classes] == counts[:2].tolist()
    assert space.layout_string(found.classes[0].cuts) in optimal_set(space, cuts, steps)
    return found


def toy_case(layers, mtp, pp, vpp, microbatches, unit, p2p, tail, p2p_overlap=False, block=0):
    """(space, program, model, cuts, plain steps) of a random small space, None if it is empty;
    ``p2p_overlap``: the interleaved schedule with overlapped p2p; ``block``: block recompute
    of each chunk's first layers."""
    space = LayoutSpace(layers, mtp, pp, vpp)
    if space.count().total == 0:
        return None
    program = compile_schedule(ScheduleShape(pp, vpp, microbatches, p2p_overlap=p2p_overlap))
    model = toy_cost_model(pp, vpp, microbatches, layers=layers, forward=unit, p2p=p2p,
                           tail_ms_per_gparam=tail, block_layers=block)  # fmt: skip
    return (space, program, model, *plain_steps(space, program, model))


def combined_toy_case(layers, mtp, pp, vpp, microbatches, unit, a2a, p2p_overlap):
    """``toy_case`` under combined 1F1B: MoE layers (t) whose forward and backward each carry
    two all-to-alls of ``a2a`` ms, 40% of their compute attention, the weight gradient
    delayed."""
    space = LayoutSpace(layers, mtp, pp, vpp)
    if space.count().total == 0:
        return None
    program = compile_schedule(
        ScheduleShape(pp, vpp, microbatches, p2p_overlap=p2p_overlap, combined=True)
    )
    model = toy_cost_model(pp, vpp, microbatches, layers=layers, forward=unit, p2p=0.5)
    merge = merge_savings(
        model.units, model.forward_ms, model.backward_ms, {"t": 0.4}, a2a, ["t"], True
    )
    model = replace(model, merge=merge)
    return (space, program, model, *plain_steps(space, program, model))


def handbook_example_plan(top: int, split: PipelineSplit | None = None) -> Plan:
    """The handbook recipe on PP 4 planned with the example costs, 32 micro-batches, 131 GiB;
    ``split``: as a launch script stating it would load."""
    recipe = with_parallel(load_recipe("configs/handbook_7b_a1b.yaml"), pp=4)
    recipe = replace(recipe, split=split or recipe.split)
    costs = load_costs("configs/costs/handbook_h200_example.json")
    options = PlanOptions(top=top, hbm_gib=131)
    return plan(Problem.of(recipe, costs, SearchSpec(32), options))
