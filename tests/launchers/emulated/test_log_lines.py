"""What an emulated rank prints, read back by the tuner's own log parser: timer blocks by level
and option, iteration lines with Megatron's loss names, memory lines of the allocator's peak."""

from __future__ import annotations

import pytest

from launchers.emulated.config import run_config
from launchers.emulated.hardware import load_profile
from launchers.emulated.log_lines import (
    TIMERS_TO_LOG,
    Timers,
    iteration_report,
    memory_report,
    timer_block,
)
from launchers.emulated.rank_costs import RESERVED_SLACK, rank_costs
from ray_layout.measure.log_records import LEVEL1_TIMERS, LEVEL2_TIMERS
from ray_layout.measure.logs import parse_log
from tests.helpers.launchers_emulated import H200, HANDBOOK
from tests.helpers.megatron_oracle import MEGATRON_CPU_WARNINGS

pytestmark = [pytest.mark.filterwarnings(w) for w in MEGATRON_CPU_WARNINGS]


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


def test_timers_accumulate_the_clocks_time_per_name_even_through_an_error():
    now = [10.0]
    timers = Timers(lambda: now[0])
    for seconds in (0.5, 0.25):
        with timers("forward-compute"):
            now[0] += seconds
    with pytest.raises(RuntimeError), timers("backward-compute"):
        now[0] += 2.0
        raise RuntimeError("a peer left")
    assert dict(timers.seconds) == {"forward-compute": 0.75, "backward-compute": 2.0}


def test_a_level_1_block_shows_the_level_1_timers_only_in_megatrons_order():
    assert sorted(TIMERS_TO_LOG) == sorted({*LEVEL1_TIMERS, *LEVEL2_TIMERS})
    gathered = [{name: 0.001 * (i + 1) for i, name in enumerate(TIMERS_TO_LOG)}]
    one = {r.timer for r in parse_log(timer_block(gathered, "max", 1, 1e-3) + "\n").timers}
    assert one == set(LEVEL1_TIMERS)
    two = [r.timer for r in parse_log(timer_block(gathered, "max", 2, 1e-3) + "\n").timers]
    assert two == list(TIMERS_TO_LOG)


def test_iteration_lines_parse_back_with_megatrons_loss_names():
    config = run_config(HANDBOOK, 4)
    lines = [iteration_report(config, i, 6250.0 + i, world_size=4) for i in (1, 2)]
    parsed = parse_log("\n".join(lines) + "\n")
    assert parsed.skipped_lines == 0
    first, second = parsed.iterations
    assert (first.iteration, first.train_iters, first.elapsed_ms) == (1, 4, 6251.0)
    assert (second.consumed_samples, second.global_batch_size) == (32, 16)
    assert first.losses.keys() == {"lm loss", "mtp_1 loss"}
    assert second.losses["lm loss"] < first.losses["lm loss"]  # falling, as training would
    assert first.throughput_tflops is not None and first.throughput_tflops > 0
    quiet = run_config([*HANDBOOK[: HANDBOOK.index("--log-throughput")], "--mock-data"], 4)
    assert (
        parse_log(iteration_report(quiet, 1, 10.0, 4) + "\n").iterations[0].throughput_tflops
        is None
    )


def test_memory_lines_are_the_allocators_peak_without_the_overhead():
    config = run_config(HANDBOOK, 4)
    memory = rank_costs(config, load_profile(H200).costs, 3).memory
    (record,) = parse_log(memory_report(3, 2, memory) + "\n").memory
    assert (record.rank, record.iteration) == (3, 2)
    peak_mb = (memory.total - memory.overhead) / 2**20
    assert record.max_allocated_mb == pytest.approx(peak_mb, abs=0.01)
    static = memory.weights + memory.gradients + memory.optimizer
    assert record.allocated_mb == pytest.approx(static / 2**20, abs=0.01)
    assert record.max_reserved_mb == pytest.approx(peak_mb * RESERVED_SLACK, abs=0.01)
