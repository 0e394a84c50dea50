"""A profiling run as the fit sees it: per steady interval and PP rank, peers averaged, from a
log or from records."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import pytest

from ray_layout.errors import ConfigError, MeasurementError
from ray_layout.measure.log_format import timers_max
from ray_layout.measure.log_records import MemoryRecord, TimerRecord
from ray_layout.measure.logs import parse_log
from ray_layout.measure.observations import (
    STEP_WARMUP,
    RunObservation,
    observation_from_log,
    observation_from_records,
)
from ray_layout.model.layout import Layout
from ray_layout.model.spec import ParallelConfig
from tests.helpers.measure_runs import HANDBOOK, KEPT, MICROBATCHES, TRUTH
from tests.helpers.synthetic_runs import synthetic_log

PP2_DP2 = ParallelConfig(pp=2, dp=2)  # ranks 0, 1 on stage 0; ranks 2, 3 on stage 1
LAYOUT = Layout.parse("Et*8|t*8mL", 2)


def timers(*rows: tuple[int, int, str, float]) -> list[TimerRecord]:
    """Per-rank records from (interval, rank, timer, ms)."""
    return [TimerRecord(i, i, rank, timer, ms, "rank") for i, rank, timer, ms in rows]


def observed(
    records: Sequence[TimerRecord], memory: Sequence[MemoryRecord] = (), warmup: int = 0
) -> RunObservation:
    """The records as a 4-micro-batch run of LAYOUT on PP2_DP2."""
    return observation_from_records("run", records, memory, LAYOUT, PP2_DP2, 4, warmup)


def test_max_timer_option_is_refused_with_a_hint():
    log = "\n".join([timers_max({"forward-compute": 10.0})] * 4) + "\n"
    with pytest.raises(MeasurementError, match="timing-log-option all"):
        observation_from_log(
            "run", parse_log(log), Layout.parse("Et*8|t*8mL", 2), HANDBOOK.parallel, 8
        )


def test_every_ranks_max_allocated_line_counts():
    """A stage's peak is the largest any of its ranks (TP/CP/DP peers) reported."""
    layout = Layout.parse(KEPT[0], HANDBOOK.parallel.pp)
    parsed = parse_log(
        synthetic_log(HANDBOOK.model, HANDBOOK.parallel, layout, TRUTH, MICROBATCHES)
    )
    first = parsed.memory[0]
    peer = replace(first, rank=first.rank + 1, max_allocated_mb=first.max_allocated_mb + 100.0)
    run = observation_from_records(
        "run", parsed.timers, [*parsed.memory, peer], layout, HANDBOOK.parallel, MICROBATCHES
    )
    stage = first.rank // (HANDBOOK.parallel.world_size // HANDBOOK.parallel.pp)
    assert run.max_allocated_mb[stage] == pytest.approx(first.max_allocated_mb + 100.0)
    assert np.isfinite(run.max_allocated_mb).all()


def test_step_ms_is_the_mean_after_the_warmup_iterations():
    layout = Layout.parse(KEPT[0], HANDBOOK.parallel.pp)
    parsed = parse_log(
        synthetic_log(HANDBOOK.model, HANDBOOK.parallel, layout, TRUTH, MICROBATCHES)
    )

    def step_ms(steps):
        return observation_from_records(
            "run",
            parsed.timers,
            parsed.memory,
            layout,
            HANDBOOK.parallel,
            MICROBATCHES,
            steps_ms=steps,
        ).step_ms

    assert STEP_WARMUP == 3
    assert step_ms([900.0, 500.0, 400.0, 100.0, 110.0, 120.0]) == pytest.approx(110.0)
    assert step_ms([900.0, 500.0, 400.0, 130.0]) == pytest.approx(130.0)
    assert step_ms([900.0, 500.0, 400.0]) is None
    assert step_ms([]) is None
    logged = observation_from_log("run", parsed, layout, HANDBOOK.parallel, MICROBATCHES)
    printed = [record.elapsed_ms for record in parsed.iterations]
    assert len(printed) == 6 and logged.step_ms == pytest.approx(np.mean(printed[3:]))


def test_peers_are_averaged_per_stage_and_interval() -> None:
    """Megatron's rank order puts PP outermost: rank // (world / PP) is the stage."""
    run = observed(
        timers(
            (0, 0, "forward-compute", 10.0),
            (0, 1, "forward-compute", 20.0),
            (0, 2, "forward-compute", 7.0),  # rank 3 printed no value: not a zero
            (0, 3, "backward-compute", 9.0),
            (1, 0, "forward-compute", 11.0),
            (1, 2, "forward-recv", 2.0),
        )
    )
    assert run.forward_ms.tolist() == [[15.0, 7.0], [11.0, 0.0]]
    assert run.backward_ms.tolist() == [[0.0, 9.0], [0.0, 0.0]]
    assert {name: table.tolist() for name, table in run.timers.items()} == {
        "forward-recv": [[0.0, 0.0], [0.0, 2.0]]
    }
    assert (run.name, run.layout, run.num_microbatches, run.parallel) == ("run", LAYOUT, 4, PP2_DP2)


def test_the_first_intervals_with_forward_compute_are_dropped() -> None:
    """Start-up blocks without forward-compute are no training interval, so they are not what
    the warm-up drops."""
    records = timers(
        (0, 0, "model-and-optimizer-setup", 4000.0),
        (1, 0, "forward-compute", 1.0),
        (2, 0, "forward-compute", 2.0),
        (3, 0, "forward-compute", 3.0),
    )
    assert observed(records, warmup=2).forward_ms[:, 0].tolist() == [3.0]
    assert "model-and-optimizer-setup" not in observed(records, warmup=2).timers


def test_no_backward_compute_is_zero_backward() -> None:
    run = observed(timers((0, 0, "forward-compute", 1.0), (1, 3, "forward-compute", 2.0)))
    assert run.backward_ms.shape == (2, 2) and not run.backward_ms.any()


def test_memory_is_each_stages_largest_peak_and_nan_where_no_rank_printed() -> None:
    def peak(rank: int, mb: float) -> MemoryRecord:
        return MemoryRecord(rank, 1, mb / 2, mb, mb, mb)

    records = timers((0, 0, "forward-compute", 1.0))
    run = observed(records, [peak(0, 100.0), peak(1, 300.0), peak(0, 200.0), peak(9, 1e6)])
    assert run.max_allocated_mb[0] == 300.0 and np.isnan(run.max_allocated_mb[1])


def test_a_rank_outside_the_world_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"^run: rank 4 is outside a world of 4 \(TP·CP·DP·PP\)"):
        observed(timers((0, 4, "forward-compute", 1.0)))


def test_no_forward_compute_says_what_was_found() -> None:
    with pytest.raises(MeasurementError, match=r"found forward-backward, optimizer\); profile"):
        observed(timers((0, 0, "optimizer", 1.0), (0, 1, "forward-backward", 2.0)))
    with pytest.raises(MeasurementError, match=r"\(found no per-rank timers\)"):
        observed([])


def test_too_few_intervals_say_how_many_there_were() -> None:
    records = timers((0, 0, "forward-compute", 1.0), (1, 0, "forward-compute", 1.0))
    with pytest.raises(MeasurementError) as error:
        observed(records, warmup=2)
    assert str(error.value) == (
        "run: no steady timer interval (found 2 with forward-compute, the first 2 dropped); "
        "run more iterations with --log-interval 1"
    )


def test_an_interleaved_run_without_the_combined_calls_timer_overlapped_its_p2p():
    """Only the blocking interleaved schedule times send_forward_backward_recv_forward_backward."""
    interleaved = Layout.parse("Ett|tt|tt|tt|tt|tt|tt|ttmL", 4)
    timers = {"forward-send-forward-recv": np.ones((1, 4))}
    run = RunObservation("run", interleaved, 8, np.ones((1, 4)), np.ones((1, 4)), timers)
    assert run.overlapped_p2p
    blocking = {**timers, "forward-backward-send-forward-backward-recv": np.ones((1, 4))}
    assert not replace(run, timers=blocking).overlapped_p2p
    assert not replace(run, layout=Layout.parse("Et*4|t*4|t*4|t*4mL", 4)).overlapped_p2p
