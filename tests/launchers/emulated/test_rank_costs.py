"""What an emulated rank costs: its chunks' compute from the profile's unit costs (the MTP
rank's extra when MTP stands alone), a step tail by its parameters, the micro-batches it holds."""

from __future__ import annotations

import pytest

from launchers.emulated.config import run_config
from launchers.emulated.hardware import load_profile
from launchers.emulated.rank_costs import rank_costs
from launchers.emulated.rank_order import pipeline_programs
from search.cost_model import in_flight_at_peak
from search.pipeline_ops import ScheduleShape
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
