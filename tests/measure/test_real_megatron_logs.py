"""Real Megatron logs that users published, read in place (sources in their SOURCES.md).

Every expected value below was read off the log by hand, not produced by the parser.
"""

from __future__ import annotations

import pytest

from ray_layout.errors import ConfigError, MeasurementError
from ray_layout.measure.declared import check_log
from ray_layout.measure.log_records import ParsedLog, TimerRecord
from ray_layout.measure.logs import parse_log_file
from ray_layout.measure.observations import observation_from_log
from ray_layout.model.layout import Layout
from ray_layout.model.spec import ParallelConfig, load_recipe_file
from tests.helpers.paths import SHARED_DATA

REAL_LOGS = SHARED_DATA / "real_megatron_logs"
HANDBOOK = load_recipe_file("configs/handbook_7b_a1b.yaml")


def parsed(name: str) -> ParsedLog:
    path = REAL_LOGS / name
    if not path.exists():
        pytest.skip(f"{path} is not on this machine (the shared real-log fixtures)")
    return parse_log_file(path)


def minmax(interval: int, iteration: int | None, timer: str, low: float, high: float):
    return (TimerRecord(interval, iteration, None, timer, low, "min"),
            TimerRecord(interval, iteration, None, timer, high, "max"))  # fmt: skip


def test_megatron_deepspeed_2024_alcf() -> None:
    log = parsed("04_alcf_megatron_deepspeed_2024.log")
    assert log.timers == (
        *minmax(0, None, "model-and-optimizer-setup", 4794.78, 4795.23),
        *minmax(0, None, "train/valid/test-data-iterators-setup", 589.69, 721.20),
    )  # DeepSpeed's own "[Rank 0] time (ms) | fwd: …" lines are not Megatron's timers
    assert [(i.iteration, i.train_iters, i.elapsed_ms) for i in log.iterations] == [
        (1, 317892, 21133.8),
        (2, 317892, 10154.3),
    ]
    assert [dict(i.losses) for i in log.iterations] == [
        {"lm loss": 11.19983},
        {"lm loss": 17.66422},
    ]
    assert [i.global_batch_size for i in log.iterations] == [32, 32]
    assert [(m.rank, m.iteration, m.max_allocated_mb, m.max_reserved_mb) for m in log.memory] == [
        (1, 1, 22332.37255859375, 35824.0),
        (0, 1, 22332.37255859375, 32994.0),
    ]
    assert log.training_intervals == () and log.skipped_lines == 0


def test_ms_swift_mcore_2024_checkpoint_blocks_are_not_training() -> None:
    log = parsed("05_ms_swift_mcore_2024.log")
    assert log.timers == (
        *minmax(0, None, "load-checkpoint", 1267.00, 1267.01),
        *minmax(1, None, "model-and-optimizer-setup", 1538.42, 1540.23),
        # "(8140.10, 8140.19)training ...": print_rank_0's "training ..." glued on
        *minmax(1, None, "train/valid/test-data-iterators-setup", 8140.10, 8140.19),
        *minmax(2, 100, "save-checkpoint", 30421.34, 30421.36),
    )
    assert log.split_lines == 1
    assert [i.iteration for i in log.iterations] == list(range(10, 130, 10))
    assert (log.iterations[0].elapsed_ms, log.iterations[-1].elapsed_ms) == (8195.9, 717.2)
    assert log.iterations[1].grad_norm == 84.046 and log.iterations[0].global_batch_size == 8
    assert [(m.rank, m.iteration, m.max_allocated_mb) for m in log.memory] == [
        (0, 10, 7959.9697265625)
    ]
    assert log.log_interval_hint == 10
    assert log.training_intervals == () and log.skipped_lines == 0


def test_swallow_fork_2024_iteration_line_with_a_fork_segment() -> None:
    log = parsed("07_swallow_fork_2024.log")
    (iteration,) = log.iterations
    assert (iteration.iteration, iteration.train_iters, iteration.consumed_samples) == (
        4,
        25000,
        4096,
    )
    assert (iteration.elapsed_ms, iteration.throughput_tflops) == (270125.4, 449.6)
    assert (iteration.learning_rate, iteration.global_batch_size) == (7.5e-08, 1024)
    assert dict(iteration.losses) == {"lm loss": 2.120380} and iteration.grad_norm == 14.218
    assert (iteration.skipped_iterations, iteration.nan_iterations) == (0, 0)
    assert iteration.unknown_segments == 1 == log.unknown_segments  # "iteration time: 270.125 s …"
    assert log.timers == () and log.memory == () and log.skipped_lines == 0


def test_megatron_bridge_2025_evaluate_blocks_are_not_training() -> None:
    log = parsed("08_megatron_bridge_2025.log")
    assert log.timers == (
        *minmax(0, None, "model-and-optimizer-setup", 8274.77, 8274.90),
        *minmax(0, None, "train/valid/test-data-iterators-setup", 67.42, 80.35),
        *minmax(1, 10, "evaluate", 57313.42, 57314.02),
        *minmax(2, 10, "evaluate", 56212.02, 56212.65),
    )
    assert log.training_intervals == ()
    (iteration,) = log.iterations
    assert (iteration.iteration, iteration.train_iters, iteration.elapsed_ms) == (10, 10, 4647.8)
    assert iteration.global_batch_size == 512 and dict(iteration.losses) == {"lm loss": 9.763827}
    assert [(m.rank, m.iteration, m.max_allocated_mb) for m in log.memory] == [
        (0, 10, 12003.60400390625)
    ]
    assert log.skipped_lines == 0  # the config dump's "key: value" lines are nobody's record


def test_slurm_2026_memory_lines_of_two_ranks_on_one_line() -> None:
    log = parsed("09a_slurm_aws_2026_iter.log")
    assert sorted(m.rank for m in log.memory) == [*range(20), 24, 27]
    assert log.split_lines == 4  # ranks 9+8, 7+6, 18+16, 27+24
    by_rank = {m.rank: m for m in log.memory}
    assert (by_rank[8].max_allocated_mb, by_rank[8].max_reserved_mb) == (44566.31, 44816.00)
    assert (by_rank[0].max_allocated_mb, by_rank[24].max_reserved_mb) == (47104.31, 44752.00)
    (iteration,) = log.iterations
    assert (iteration.iteration, iteration.elapsed_ms, iteration.global_batch_size) == (
        1,
        776938.3,
        512,
    )
    assert log.timers == () and log.skipped_lines == 0


def test_slurm_2026_timers_behind_the_python_logging_prefix() -> None:
    log = parsed("09b_slurm_aws_2026_timers.log")
    assert log.timers == (
        *minmax(0, None, "model-and-optimizer-setup", 1020.90, 1022.97),
        *minmax(0, None, "train/valid/test-data-iterators-setup", 190.27, 292.00),
    )
    assert [m.rank for m in log.memory] == [2, 5, 4, 10, 11, 12, 3, 14, 15, 17, 0, 1, 13, 19, 9, 8]
    assert log.split_lines == 1 and log.iterations == () and log.skipped_lines == 0


def test_alcf_key_value_fork_2025() -> None:
    log = parsed("10_alcf_keyvalue_fork_2025.log")
    assert [(i.iteration, i.train_iters, i.elapsed_ms) for i in log.iterations] == [
        (136004, 136100, 3415.3),
        (136005, 136100, 3420.2),
        (136006, 136100, 6863.2),
        (136007, 136100, 3402.7),
        (136008, 136100, 5334.1),
        (136009, 136100, 3394.8),
        (136010, 136100, 3401.5),
    ]
    first = log.iterations[0]
    assert (first.consumed_samples, first.learning_rate, first.global_batch_size) == (
        835608576,
        2.0127e-05,
        6144,
    )
    assert dict(first.losses) == {"lm loss": 12.316531}
    assert (first.loss_scale, first.grad_norm) == (1.0, 1020.352)
    assert log.training_intervals == tuple(range(7))
    assert log.timers[:4] == (
        *minmax(0, 136004, "forward-backward", 3198.27, 3199.53),
        *minmax(0, 136004, "optimizer", 158.53, 166.36),
    )
    assert log.timers[-4:] == (
        *minmax(6, 136010, "forward-backward", 3196.98, 3200.27),
        *minmax(6, 136010, "optimizer", 141.42, 145.17),
    )
    assert log.skipped_lines == 0


def test_a_fit_from_minmax_timers_says_what_they_cannot_identify() -> None:
    log = parsed("10_alcf_keyvalue_fork_2025.log")
    with pytest.raises(MeasurementError) as error:
        observation_from_log("alcf", log, Layout.parse("Et*12L", 1), ParallelConfig(), 1)
    message = str(error.value)
    assert "\n" not in message and "no unit cost can be told apart" in message
    assert "--timing-log-option all" in message and "no steady timer interval" not in message


@pytest.mark.parametrize("name", sorted(path.name for path in REAL_LOGS.glob("*.log")))
def test_no_real_log_is_stored_under_the_handbook_config(name) -> None:
    """None of these runs is the handbook's: each is refused by what it states (another model's
    arguments, ranks outside the world) or because no fit could use it (no per-rank timers)."""
    log = parsed(name)
    layout = Layout.parse("Et*4|t*4|t*4|t*4mL", 4)
    with pytest.raises((ConfigError, MeasurementError), match=rf"^{name}: "):
        check_log(log, layout, HANDBOOK.parallel, None, name, model=HANDBOOK.model)
