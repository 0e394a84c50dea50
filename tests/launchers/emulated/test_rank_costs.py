"""What an emulated rank costs: its chunks' compute from the profile's unit costs (the MTP
rank's extra when MTP stands alone), a step tail by its parameters, the micro-batches it holds."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from launchers.emulated.config import run_config
from launchers.emulated.hardware import load_profile
from launchers.emulated.rank_costs import rank_costs
from launchers.emulated.rank_order import pipeline_programs
from search.cost_model import build_cost_model, in_flight_at_peak
from search.evaluate import stage_times
from search.pipeline_ops import ScheduleShape
from search.space import LayoutSpace
from tests.helpers.launchers_emulated import H200, HANDBOOK
from tests.helpers.megatron_oracle import MEGATRON_CPU_WARNINGS

pytestmark = [pytest.mark.filterwarnings(w) for w in MEGATRON_CPU_WARNINGS]
COSTS = load_profile(H200).costs


def test_mtp_standalone_rank_pays_extra():
    profile = load_profile(H200)
    config = run_config([*HANDBOOK, "--pipeline-model-parallel-layout", "Et*4|t*6|t*6m|L"], 4)
    forward = profile.costs.forward_ms
    assert rank_costs(config, profile.costs, 2).forward_ms == (
        pytest.approx((6 * forward["t"] + forward["m"]) * 1.12),
    )
    assert rank_costs(config, profile.costs, 1).forward_ms == (pytest.approx(6 * forward["t"]),)


def test_each_chunk_costs_its_units():
    """Et*2|t*2|... on PP 4, VPP 2: rank 0's chunks are E + 2t and 2t; the last rank's second
    chunk holds m and L as well."""
    layout = "Et*2|t*2|t*2|t*2|t*2|t*2|t*2|t*2mL"
    config = run_config([*HANDBOOK, "--pipeline-model-parallel-layout", layout], 4)
    f, b = COSTS.forward_ms, COSTS.backward_ms
    first, last = rank_costs(config, COSTS, 0), rank_costs(config, COSTS, 3)
    assert first.forward_ms == pytest.approx((f["E"] + 2 * f["t"], 2 * f["t"]))
    assert last.backward_ms == pytest.approx((2 * b["t"], 2 * b["t"] + b["m"] + b["L"]))


def test_the_step_tail_follows_the_parameters_held():
    config = run_config(HANDBOOK, 4)
    tails = [rank_costs(config, COSTS, rank) for rank in range(4)]
    ratio = COSTS.grad_sync_ms_per_gparam / COSTS.optimizer_ms_per_gparam
    assert all(t.grad_sync_ms == pytest.approx(ratio * t.optimizer_ms) for t in tails)
    # the middle ranks hold four decoder layers alike; the last adds MTP and the output layer
    assert tails[1].grad_sync_ms == pytest.approx(tails[2].grad_sync_ms)
    assert tails[3].grad_sync_ms > tails[1].grad_sync_ms


@pytest.mark.parametrize("layout", ["Et*4|t*4|t*4|t*4mL", "Et*2|t*2|t*2|t*2|t*2|t*2|t*2|t*2mL"])
def test_held_micro_batches_are_the_planners_in_flight_count(layout):
    config = run_config([*HANDBOOK, "--pipeline-model-parallel-layout", layout], 4)
    p = config.parallel
    shape = ScheduleShape(p.pp, p.vpp, config.num_microbatches, config.group_size)
    planned = in_flight_at_peak(shape)
    programs = pipeline_programs(shape)
    for rank in range(4):
        given = rank_costs(config, COSTS, rank, programs)
        assert given.held_microbatches == planned[rank].sum()
        assert given == rank_costs(config, COSTS, rank)  # the programs computed here agree


FULL = ["--recompute-granularity", "full", "--recompute-method"]
SELECTIVE = ["--recompute-granularity", "selective", "--recompute-modules"]
RECOMPUTE = {
    "none": [],
    "selective": [*SELECTIVE, "core_attn", "moe_act", "--moe-grouped-gemm"],
    "full uniform 1": [*FULL, "uniform", "--recompute-num-layers", "1"],
    **{f"full block {n}": [*FULL, "block", "--recompute-num-layers", str(n)] for n in (1, 2, 3)},
}
# the handbook's first two layers dense, as DeepSeek's first_k_dense_replace: each chunk's first
# layers then differ in kind, which block recompute has to follow
FIRST_DENSE = list(HANDBOOK)
FIRST_DENSE[FIRST_DENSE.index("--moe-layer-freq") + 1] = "([0]*2+[1]*14)"
MIXED_COSTS = replace(
    COSTS,
    **{
        name: {
            **{u: ms for u, ms in getattr(COSTS, name).items() if u != "t"},
            "t_dense": getattr(COSTS, name)["t"] * 0.6,
            "t_moe": getattr(COSTS, name)["t"],
        }
        for name in ("forward_ms", "backward_ms")
    },
)


def random_layouts(argv: list[str], vpp: int, count: int, seed: int) -> list[str]:
    """``count`` layouts drawn from the planner's space of PP 4 x ``vpp``."""
    config = run_config(argv, 4)
    space = LayoutSpace.of(config.model, replace(config.parallel, vpp=vpp))
    cuts = np.concatenate(list(space.cut_blocks()))
    drawn = np.random.default_rng(seed).choice(len(cuts), size=count, replace=False)
    return [space.layout_string(cuts[i]) for i in drawn]


@pytest.mark.parametrize("setting", list(RECOMPUTE))
@pytest.mark.parametrize(
    ("argv", "costs"), [(HANDBOOK, COSTS), (FIRST_DENSE, MIXED_COSTS)], ids=["moe", "first-dense"]
)
def test_each_chunk_computes_what_the_simulator_prices(setting, argv, costs):
    """The emulated ranks and the planner's simulator are two implementations of one rule: a
    backward re-runs the recomputed forward (whole layers, each chunk's first layers under
    block, the selected modules' share); per chunk they agree on random layouts."""
    flags = RECOMPUTE[setting]
    layouts = [*random_layouts(argv, 1, 6, seed=1), *random_layouts(argv, 2, 6, seed=2)]
    for layout in layouts:
        config = run_config([*argv, *flags, "--pipeline-model-parallel-layout", layout], 4)
        model = build_cost_model(
            config.model,
            config.parallel,
            costs,
            config.num_microbatches,
            config.group_size,
            config.memory,
        )
        space, cuts = LayoutSpace.holding(config.layout)
        counts = space.unit_counts(cuts[None], model.units, model.moe_pattern)
        forward, backward = (ms[0] for ms in stage_times(model, counts))
        for rank in range(4):
            emulated = rank_costs(config, costs, rank)
            assert emulated.forward_ms == pytest.approx(tuple(forward[rank::4])), layout
            assert emulated.backward_ms == pytest.approx(tuple(backward[rank::4])), layout


def test_a_recomputing_backward_is_longer_by_the_forward_it_re_runs():
    """Full uniform re-runs every layer: a chunk's backward grows by its forward, less E and L."""
    layout = ["--pipeline-model-parallel-layout", "Et*4|t*4|t*4|t*4mL"]
    plain = run_config([*HANDBOOK, *layout], 4)
    full = run_config([*HANDBOOK, *RECOMPUTE["full uniform 1"], *layout], 4)
    f = COSTS.forward_ms
    assert rank_costs(full, COSTS, 3).backward_ms == pytest.approx(
        (rank_costs(plain, COSTS, 3).backward_ms[0] + 4 * f["t"] + f["m"],)
    )
