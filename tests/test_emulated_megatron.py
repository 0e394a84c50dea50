"""The emulated Megatron: megatron-core's order, a real 4-rank run, Megatron's logs, failures."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import yaml

from launchers.emulated.config import run_config
from launchers.emulated.environment import PROFILE_ENV
from launchers.emulated.hardware import load_profile
from launchers.emulated.log_lines import timer_block
from launchers.emulated.rank_costs import rank_costs
from launchers.emulated.rank_order import held_at_peak, rank_program
from ray_layout.errors import EXIT_BAD_INPUT, EXIT_FAILURE, ConfigError
from ray_layout.measure.logs import parse_log, steady_intervals
from search.cost_model import in_flight_at_peak
from search.schedule import P2PCall, compile_schedule, rank_ops
from search.simulator import simulate, stage_durations
from tests.megatron_oracle import MEGATRON_CPU_WARNINGS, _free_port
from tests.test_schedule import megatron_order

pytestmark = [pytest.mark.filterwarnings(w) for w in MEGATRON_CPU_WARNINGS]

ROOT = Path(__file__).resolve().parents[1]
PROFILES = ROOT / "cluster_configs" / "hardware"
H200 = PROFILES / "h200_emulated.yaml"
MICROBATCHES, ITERATIONS = 8, 4
# configs/handbook_7b_a1b.yaml as pretrain_gpt.py flags (NullTokenizer adds one token to the
# vocabulary), on PP=4 with DP=1 (so EP=1)
HANDBOOK = [
    "--num-layers", "16", "--hidden-size", "2048", "--num-attention-heads", "16",
    "--group-query-attention", "--num-query-groups", "2", "--kv-channels", "128",
    "--swiglu", "--normalization", "RMSNorm", "--position-embedding-type", "rope",
    "--disable-bias-linear", "--seq-length", "4096", "--max-position-embeddings", "4096",
    "--vocab-size", "128255", "--num-experts", "64", "--moe-router-topk", "8",
    "--moe-ffn-hidden-size", "1024", "--moe-layer-freq", "1", "--mtp-num-layers", "1",
    "--pipeline-model-parallel-size", "4", "--expert-model-parallel-size", "1",
    "--micro-batch-size", "2", "--global-batch-size", str(2 * MICROBATCHES),
    "--train-iters", str(ITERATIONS), "--log-interval", "1", "--eval-iters", "0",
    "--timing-log-level", "2", "--timing-log-option", "all", "--log-throughput",
    "--mock-data", "--tokenizer-type", "NullTokenizer", "--bf16", "--use-distributed-optimizer",
]  # fmt: skip


# The order of work


ORDER_CASES = [(1, 1, 3, 1), (2, 1, 1, 2), (2, 1, 4, 2), (4, 1, 3, 4), (4, 1, 8, 4),
               (2, 2, 4, 2), (4, 2, 8, 4), (4, 2, 10, 5), (3, 3, 6, 3), (4, 2, 16, 8)]  # fmt: skip


@pytest.mark.parametrize(("pp", "vpp", "microbatches", "group"), ORDER_CASES)
def test_order_equals_megatron_core(pp, vpp, microbatches, group):
    """Computations in megatron-core's order; the calls that move data equal the simulator's,
    an implementation of its own (the emulator also keeps the interleaved calls that move
    nothing, because Megatron still runs their timers)."""
    simulated = rank_ops(pp, vpp, microbatches, group)
    for rank in range(pp):
        program = rank_program(pp, rank, vpp, microbatches, group)
        computes = [op for op in program if not isinstance(op, P2PCall)]
        assert computes == megatron_order(pp, rank, vpp, microbatches, group)
        moving = [op for op in program if not isinstance(op, P2PCall) or op.transfers]
        assert moving == simulated[rank]


@pytest.mark.parametrize(("pp", "vpp", "microbatches", "group"), ORDER_CASES)
def test_activations_held_at_the_peak_agree_with_the_planner(pp, vpp, microbatches, group):
    """The emulator counts in-flight micro-batches on its own order; the planner's count, on the
    simulator's order, must come out the same."""
    planned = in_flight_at_peak(pp, vpp, microbatches, group)
    for rank in range(pp):
        held = held_at_peak(rank_program(pp, rank, vpp, microbatches, group), vpp)
        assert list(held.values()) == planned[rank].tolist()


# Profiles and command lines


def test_shipped_profiles_load():
    h200, a100 = load_profile(H200), load_profile(PROFILES / "a100_emulated.yaml")
    assert (h200.name, h200.hbm_gib) == ("h200_emulated", 139.8)
    assert h200.costs.mtp_standalone_factor == pytest.approx(1.12)  # 1 + mtp_standalone_extra
    forward = h200.costs.forward_ms
    assert forward["m"] == pytest.approx(1.4 * forward["t"])  # the seed study, not FLOP ratios
    assert forward["L"] == pytest.approx(3.8 * forward["t"])
    assert a100.costs.forward_ms["t"] > forward["t"] and a100.hbm_gib < h200.hbm_gib


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"hbm_gib": None}, "hbm_gib must be a finite number"),
        ({"time_scale": 0}, "time_scale must be > 0"),
        ({"mtp_standalone_factor": 1.2}, "not a profile field"),
        ({"forward_ms": {"E": 1.0, "t": 10.0}}, "forward_ms lacks unit(s) L"),
        ({"colour": "blue"}, "unknown key(s) colour"),
    ],
)
def test_bad_profile_is_one_line(tmp_path, change, message):
    raw = yaml.safe_load(H200.read_text()) | change
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({k: v for k, v in raw.items() if v is not None}))
    with pytest.raises(ConfigError, match=re.escape(message)) as info:
        load_profile(path)
    assert "\n" not in str(info.value) and str(path) in str(info.value)


def test_command_line_gives_megatron_default_and_world_dp():
    config = run_config([*HANDBOOK, "--global-batch-size", "32"], world_size=8)
    assert str(config.layout) == "Et*4|t*4|t*4|t*4mL"
    assert (config.parallel.dp, config.num_microbatches) == (2, 8)
    given = run_config([*HANDBOOK, "--pipeline-model-parallel-layout", "Et*5|t*6|t*5|mL"], 4)
    assert str(given.layout) == "Et*5|t*6|t*5|mL" and not given.layout.mtp_standalone


def test_mtp_standalone_rank_pays_extra():
    profile = load_profile(H200)
    config = run_config([*HANDBOOK, "--pipeline-model-parallel-layout", "Et*4|t*6|t*6m|L"], 4)
    forward = profile.costs.forward_ms
    assert rank_costs(config, profile.costs, 2).forward_ms == (
        pytest.approx((6 * forward["t"] + forward["m"]) * 1.12),
    )
    assert rank_costs(config, profile.costs, 1).forward_ms == (pytest.approx(6 * forward["t"]),)


@pytest.mark.parametrize("option", ["all", "max", "minmax"])
def test_timer_blocks_parse_back(option):
    gathered = [{"forward-compute": 0.25, "optimizer": 0.0}, {"forward-compute": 0.75}]
    records = parse_log(timer_block(gathered, option, level=2, normalizer=1e-3) + "\n").timers
    values = sorted((r.timer, r.stat, r.ms) for r in records)
    expected = {
        "all": [("forward-compute", "rank", 250.0), ("forward-compute", "rank", 750.0)],
        "max": [("forward-compute", "max", 750.0)],
        "minmax": [("forward-compute", "max", 750.0), ("forward-compute", "min", 250.0)],
    }
    assert values == expected[option]  # zeros and untimed names are left out, as Megatron does
    assert timer_block(gathered, option, level=1, normalizer=1e-3) is None


# Real runs: four rank processes talking over gloo


@contextmanager
def ranks(argv: Sequence[str], world: int, profile: Path, logs: Path) -> Iterator[list]:
    """Start every rank as a launcher would; kill whatever is left when the block ends."""
    port = _free_port()
    processes: list[subprocess.Popen] = []
    try:
        for rank in range(world):
            env = os.environ | {
                "RANK": str(rank),
                "WORLD_SIZE": str(world),
                "LOCAL_RANK": "0",
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                PROFILE_ENV: str(profile),
            }
            with open(logs / f"{rank}.out", "w") as out, open(logs / f"{rank}.err", "w") as err:
                command = [sys.executable, "-m", "launchers.emulated_megatron", *argv]
                processes.append(subprocess.Popen(command, cwd=ROOT, env=env, stdout=out,
                                                  stderr=err))  # fmt: skip
        yield processes
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()


def wait_all(processes: Sequence[subprocess.Popen], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    try:
        return [p.wait(timeout=max(deadline - time.monotonic(), 0.1)) for p in processes]
    except subprocess.TimeoutExpired:
        pytest.fail(f"ranks still running after {timeout} s")


def test_four_ranks_print_megatrons_logs(tmp_path):
    with ranks(HANDBOOK, 4, H200, tmp_path) as processes:
        codes = wait_all(processes, timeout=150)
    errors = [(tmp_path / f"{rank}.err").read_text() for rank in range(4)]
    assert codes == [0, 0, 0, 0], errors
    parsed = parse_log((tmp_path / "3.out").read_text())
    assert parsed.skipped_lines == 0
    assert [r.iteration for r in parsed.iterations] == list(range(1, ITERATIONS + 1))
    assert parsed.iterations[0].losses.keys() == {"lm loss", "mtp_1 loss"}
    for rank in range(4):  # DP rank 0 everywhere: each rank prints its own memory lines
        memory = parse_log((tmp_path / f"{rank}.out").read_text()).memory
        assert [(m.rank, m.iteration) for m in memory] == [(rank, 1), (rank, 2)]
        assert memory[0].max_allocated_mb > memory[0].allocated_mb > 0

    costs = load_profile(H200).costs
    f, b = costs.forward_ms, costs.backward_ms
    stage_forward = [f["E"] + 4 * f["t"], 4 * f["t"], 4 * f["t"], 4 * f["t"] + f["m"] + f["L"]]
    stage_backward = [b["E"] + 4 * b["t"], 4 * b["t"], 4 * b["t"], 4 * b["t"] + b["m"] + b["L"]]
    steady = steady_intervals(parsed, warmup=2)  # the first two carry iteration 1
    assert len(steady) == ITERATIONS - 2
    for interval in steady:
        timers = {(r.timer, r.rank): r.ms for r in parsed.timers if r.interval == interval}
        for rank in range(4):
            # timers read the scheduled clock: the costs within the jitter however loaded the
            # machine (3% per op, about 1% over 8 micro-batches)
            expected = MICROBATCHES * stage_forward[rank]
            assert 0.95 * expected < timers["forward-compute", rank] < 1.05 * expected
            expected = MICROBATCHES * stage_backward[rank]
            assert 0.95 * expected < timers["backward-compute", rank] < 1.05 * expected
            assert ("all-grads-sync", rank) in timers and ("optimizer", rank) in timers
        assert {r for t, r in timers if t == "forward-recv"} == {1, 2, 3}  # waits are real
        assert {r for t, r in timers if t == "backward-recv"} == {0, 1, 2}

    # The simulator, an independent implementation, predicts the same step (the ranks' own
    # step tails included); real overhead is kept out by the deadlines, the jitter stays.
    config = run_config(HANDBOOK, 4)
    tails = [rank_costs(config, costs, rank) for rank in range(4)]
    predicted = simulate(
        compile_schedule(4, 1, MICROBATCHES),
        stage_durations(stage_forward),
        stage_durations(stage_backward),
        np.full(4, costs.p2p_intra_node_ms),
        tail_ms=np.array([tail.grad_sync_ms + tail.optimizer_ms for tail in tails]),
    ).step[0]
    step_ms = [r.elapsed_ms for r in parsed.iterations[2:]]
    assert 0.97 * predicted < min(step_ms) and max(step_ms) < 1.05 * predicted


def test_unknown_flag_exits_2_with_one_line():
    env = os.environ | {"RANK": "0", "WORLD_SIZE": "1", PROFILE_ENV: str(H200)}
    result = subprocess.run(
        [sys.executable, "-m", "launchers.emulated_megatron", *HANDBOOK, "--no-such-flag", "3"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == EXIT_BAD_INPUT
    assert (
        result.stderr.count("\n") == 1 and "unknown Megatron flag --no-such-flag" in result.stderr
    )
    assert result.stdout == ""


def test_out_of_memory_rank_exits_1_and_the_others_do_not_hang(tmp_path):
    """HBM between the last rank's peak and the others': only the last rank runs out."""
    profile = load_profile(H200)
    config = run_config(HANDBOOK, 4)
    peaks = [rank_costs(config, profile.costs, r).memory.total_gib for r in range(4)]
    assert peaks[3] > max(peaks[:3])
    raw = yaml.safe_load(H200.read_text()) | {"hbm_gib": (peaks[3] + max(peaks[:3])) / 2}
    small = tmp_path / "small.yaml"
    small.write_text(yaml.safe_dump(raw))
    with ranks(HANDBOOK, 4, small, tmp_path) as processes:
        codes = wait_all(processes, timeout=120)
    assert codes[3] == EXIT_FAILURE
    lines = (tmp_path / "3.err").read_text().splitlines()
    message = next(line for line in lines if line.startswith("torch.OutOfMemoryError"))
    assert message.startswith("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate ")
    assert "GPU 0 has a total capacity of" in message
    assert codes[:3] == [EXIT_FAILURE] * 3  # they fail on gloo, as a real job would, never -6
    assert "(after 1 iterations)" not in (tmp_path / "3.out").read_text()
