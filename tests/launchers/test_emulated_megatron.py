"""The emulated Megatron end to end (``python -m launchers.emulated_megatron``): four real rank
processes print Megatron's logs and keep the simulator's step, bad input exits 2 with one line,
and a rank out of memory fails the job without hanging it."""

from __future__ import annotations

import os
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
from launchers.emulated.rank_costs import rank_costs
from ray_layout.errors import EXIT_BAD_INPUT, EXIT_FAILURE
from ray_layout.measure.log_records import steady_intervals
from ray_layout.measure.logs import parse_log
from search.pipeline_ops import ScheduleShape
from search.schedule import compile_schedule
from search.simulator import simulate, stage_durations
from tests.helpers.launchers_emulated import H200, HANDBOOK, ITERATIONS, MICROBATCHES
from tests.helpers.megatron_oracle import MEGATRON_CPU_WARNINGS, _free_port
from tests.helpers.paths import ROOT

# every test here starts emulated ranks: end to end (``ranks`` is no fixture that conftest sees)
pytestmark = [pytest.mark.slow, *(pytest.mark.filterwarnings(w) for w in MEGATRON_CPU_WARNINGS)]


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
        compile_schedule(ScheduleShape(4, 1, MICROBATCHES)),
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


@pytest.mark.parametrize("p2p_overlap", [True, False])
def test_an_interleaved_job_keeps_the_simulators_step_with_its_p2p_mode(tmp_path, p2p_overlap):
    """VPP 2 on PP 4, no jitter, transfers of 4 ms (a third of a layer's forward): Megatron's
    default overlapped p2p (the order traced from megatron-core's schedule) and the blocking
    one each run within 2% of the simulator's step on the emulator's own profile."""
    raw = yaml.safe_load(H200.read_text()) | {"jitter_cv": 0.0, "p2p_intra_node_ms": 4.0}
    profile = tmp_path / "p2p.yaml"
    profile.write_text(yaml.safe_dump(raw))
    layout = ["--pipeline-model-parallel-layout", "Ett|tt|tt|tt|tt|tt|tt|ttmL"]
    argv = [*HANDBOOK, *layout, *([] if p2p_overlap else ["--no-overlap-p2p-communication"])]
    with ranks(argv, 4, profile, tmp_path) as processes:
        codes = wait_all(processes, timeout=150)
    assert codes == [0, 0, 0, 0], [(tmp_path / f"{r}.err").read_text() for r in range(4)]
    config = run_config(argv, 4)
    assert config.p2p_overlap is p2p_overlap
    costs = load_profile(profile).costs
    per_rank = [rank_costs(config, costs, rank) for rank in range(4)]
    forward = [per_rank[s % 4].forward_ms[s // 4] for s in range(8)]
    backward = [per_rank[s % 4].backward_ms[s // 4] for s in range(8)]
    predicted = simulate(
        compile_schedule(ScheduleShape(4, 2, MICROBATCHES, 4, p2p_overlap=p2p_overlap)),
        stage_durations(forward),
        stage_durations(backward),
        np.full(4, costs.p2p_intra_node_ms),
        tail_ms=np.array([rank.grad_sync_ms + rank.optimizer_ms for rank in per_rank]),
    ).step[0]
    parsed = parse_log((tmp_path / "3.out").read_text())
    measured = float(np.median([r.elapsed_ms for r in parsed.iterations[2:]]))
    assert abs(measured / predicted - 1) < 0.02, (measured, predicted)


def test_a_combined_1f1b_job_keeps_the_simulators_step(tmp_path):
    """EP all-to-all overlap on PP 2, VPP 2, EP 2 (four ranks, DP 2): megatron-core's combined
    1F1B order traced, each merged step hiding what the two-stream model says (dispatch and
    combine 1.5 ms each), within 2% of the simulator's step on the emulator's own profile."""
    raw = yaml.safe_load(H200.read_text()) | {"jitter_cv": 0.0, "a2a_ms": 1.5}
    profile = tmp_path / "a2a.yaml"
    profile.write_text(yaml.safe_dump(raw))
    sizes = {"--pipeline-model-parallel-size": "2", "--expert-model-parallel-size": "2",
             "--global-batch-size": str(2 * 2 * MICROBATCHES)}  # fmt: skip
    after = zip(["", *HANDBOOK], HANDBOOK, strict=False)
    argv = [sizes.get(previous, word) for previous, word in after]
    argv += ["--pipeline-model-parallel-layout", "Et*4|t*4|t*4|t*4mL"]
    argv += ["--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute"]
    with ranks(argv, 4, profile, tmp_path) as processes:
        codes = wait_all(processes, timeout=150)
    assert codes == [0, 0, 0, 0], [(tmp_path / f"{r}.err").read_text() for r in range(4)]
    config = run_config(argv, 4)
    assert config.ep_overlap.on and config.parallel.ep == 2
    costs = load_profile(profile).costs
    per_rank = [rank_costs(config, costs, rank) for rank in range(2)]
    forward = [per_rank[s % 2].forward_ms[s // 2] for s in range(4)]
    backward = [per_rank[s % 2].backward_ms[s // 2] for s in range(4)]
    hidden = np.array([[value] for rank in per_rank for row in rank.hidden_ms for value in row])
    assert (hidden > 0).all()
    predicted = simulate(
        compile_schedule(ScheduleShape(2, 2, MICROBATCHES, 2, p2p_overlap=True, combined=True)),
        stage_durations(forward),
        stage_durations(backward),
        np.full(2, costs.p2p_intra_node_ms),
        tail_ms=np.array([rank.grad_sync_ms + rank.optimizer_ms for rank in per_rank]),
        hidden_ms=hidden,
    ).step[0]
    parsed = parse_log((tmp_path / "3.out").read_text())
    measured = float(np.median([r.elapsed_ms for r in parsed.iterations[2:]]))
    assert abs(measured / predicted - 1) < 0.02, (measured, predicted)
