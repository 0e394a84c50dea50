"""The memory benchmark (benchmarks/bench_memory.py): the real logs it reads in place, where
they are, and the numbers docs/memory.md states."""

from __future__ import annotations

import pytest

from benchmarks.bench_memory import (
    LOGS,
    calibrated_errors,
    emulated_cases,
    prior_mb,
    real_cases,
    zoo_peak_gib,
)


def test_the_real_logs_are_read_in_place_with_their_stated_configs():
    if not (LOGS / "08_megatron_bridge_2025.log").exists():
        pytest.skip(f"the real Megatron logs are not under {LOGS}")
    cases, skipped = real_cases()
    assert not skipped
    measured = {case.name.split(" ")[0]: case.measured_mb[0] for case in cases}
    assert measured == {
        "05_ms_swift_mcore_2024.log": pytest.approx(7959.97),
        "08_megatron_bridge_2025.log": pytest.approx(12003.60),
    }
    # 08 runs the native fused cross entropy (its arguments dump), which search.memory reads
    errors = [prior_mb(case)[0] / case.measured_mb[0] - 1 for case in cases]
    assert errors == [pytest.approx(-0.064, abs=0.002), pytest.approx(-0.054, abs=0.002)]


def test_the_calibration_predicts_held_out_emulated_runs_and_the_zoo_recipe_fits():
    assert max(abs(error) for _, error in calibrated_errors(emulated_cases())) < 0.03
    assert zoo_peak_gib() <= 80.0
