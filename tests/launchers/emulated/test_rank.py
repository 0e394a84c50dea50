"""One emulated rank: its place in the tp-cp-dp-pp grid, the same noise for its TP peers, a
compute refused before its input arrives, and a whole one-rank run in this process (gloo over
loopback) whose logs keep the scheduled costs and Megatron's first-interval quirk."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch.distributed as dist

from launchers.emulated.config import run_config
from launchers.emulated.hardware import load_profile
from launchers.emulated.rank import EmulatedRank
from launchers.emulated.rank_costs import rank_costs
from ray_layout.measure.logs import parse_log
from search.pipeline_ops import BACKWARD, FORWARD, Compute
from tests.helpers.launchers_emulated import H200, HANDBOOK
from tests.helpers.megatron_oracle import MEGATRON_CPU_WARNINGS, _free_port

pytestmark = [pytest.mark.filterwarnings(w) for w in MEGATRON_CPU_WARNINGS]
PROFILE = load_profile(H200)


def test_a_rank_finds_its_stage_data_parallel_index_and_neighbours():
    """16 ranks, TP 2 x DP 2 x PP 4 (PP outermost): rank 6 is stage 1, DP rank 1; its pipeline
    neighbours are 4 ranks on, wrapping round."""
    config = run_config([*HANDBOOK, "--tensor-model-parallel-size", "2"], 16)
    rank = EmulatedRank(config, PROFILE, 6, 16)
    assert (rank.pp_rank, rank.dp_rank, rank.prev_rank, rank.next_rank) == (1, 1, 2, 10)
    last = EmulatedRank(config, PROFILE, 13, 16)
    assert (last.pp_rank, last.dp_rank, last.next_rank) == (3, 0, 1)
    peer = EmulatedRank(config, PROFILE, 7, 16)  # rank 6's TP peer
    assert peer.rng.random(4).tolist() == rank.rng.random(4).tolist()
    other = EmulatedRank(config, PROFILE, 4, 16)  # stage 1, DP rank 0
    assert other.rng.random() != EmulatedRank(config, PROFILE, 6, 16).rng.random()


def test_a_compute_before_its_input_arrived_is_an_error():
    config = run_config(HANDBOOK, 4)
    rank = EmulatedRank(config, replace(PROFILE, time_scale=1e-3), 1, 4)
    rank.costs = rank_costs(config, PROFILE.costs, 1)
    arrived: dict[str, set[tuple[int, int]]] = {FORWARD: set(), BACKWARD: set()}
    with pytest.raises(
        RuntimeError, match="PP rank 1: F0 of chunk 0 before its input from stage 0"
    ):
        rank._compute(Compute(FORWARD, 0, 0), arrived)
    with pytest.raises(RuntimeError, match="B0 of chunk 0 before its input from stage 2 arrived"):
        rank._compute(Compute(BACKWARD, 0, 0), arrived)
    arrived[FORWARD].add((0, 0))
    rank._compute(Compute(FORWARD, 0, 0), arrived)
    assert rank.timers.seconds["forward-compute"] > 0


def test_one_rank_trains_and_logs_its_scheduled_costs(monkeypatch, capsys):
    """PP 1 on a world of one, no jitter: each step is its micro-batches' compute and its tail
    exactly; the timer block after iteration 2 still holds iteration 1 (Megatron's quirk)."""
    if dist.is_initialized():
        pytest.fail("a process group is already open; this test needs its own")
    extra = [
        "--pipeline-model-parallel-size",
        "1",
        "--global-batch-size",
        "4",
        "--train-iters",
        "3",
    ]
    config = run_config([*HANDBOOK, *extra], 1)
    profile = replace(PROFILE, jitter_cv=0.0, time_scale=0.01)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(_free_port()))
    rank = EmulatedRank(config, profile, 0, 1)
    try:
        rank.connect(node=0)
        rank.train()
    finally:
        dist.destroy_process_group()
    out, err = capsys.readouterr()
    assert err.startswith("emulator: rank 0: ") and err.count("\n") == 1
    parsed = parse_log(out)
    assert parsed.skipped_lines == 0
    costs = rank.costs
    forward, backward = 2 * costs.forward_ms[0], 2 * costs.backward_ms[0]  # two micro-batches
    step = forward + backward + costs.grad_sync_ms + costs.optimizer_ms
    assert [r.iteration for r in parsed.iterations] == [1, 2, 3]
    assert [r.elapsed_ms for r in parsed.iterations] == pytest.approx([step] * 3, rel=1e-3)
    assert [(m.rank, m.iteration) for m in parsed.memory] == [(0, 1), (0, 2)]
    compute = {r.interval: r.ms for r in parsed.timers if r.timer == "forward-compute"}
    assert compute == pytest.approx({0: forward, 1: 2 * forward, 2: forward}, rel=1e-3)
    names = {r.timer for r in parsed.timers}
    assert {"backward-compute", "all-grads-sync", "optimizer"} <= names
    assert not {"forward-recv", "backward-send"} & names  # one stage: no p2p
