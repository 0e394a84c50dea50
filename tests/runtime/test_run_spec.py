"""A run as the cluster shell takes it: what a spec refuses before any GPU is taken, and the ids
and log paths of its attempts."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ray_layout.errors import ConfigError
from ray_layout.model.spec import ParallelConfig
from ray_layout.runtime.policy import RunPolicy
from ray_layout.runtime.run_spec import (
    LABEL_COLUMNS,
    RunSpec,
    attempt_id,
    attempt_number,
    log_paths,
)

RUN_IDS = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,30}", fullmatch=True)


def test_run_spec_rejects_what_would_fail_late(tmp_path):
    good = {"parallel": ParallelConfig(), "gpus_per_node": 4, "log_dir": tmp_path}
    with pytest.raises(ConfigError, match="run id must be"):
        RunSpec("a/b", "s", ["python"], **good)
    with pytest.raises(ConfigError, match="study must be"):
        RunSpec("a", "", ["python"], **good)
    with pytest.raises(ConfigError, match="non-empty list"):
        RunSpec("a", "s", [], **good)
    with pytest.raises(ConfigError, match=r"source of the runs table, not nonsense, status$"):
        RunSpec("a", "s", ["python"], labels={"status": "x", "nonsense": 1, "model": "m"}, **good)


def test_attempt_ids_read_back():
    ids = [attempt_id("profile-ab12-retry", n) for n in (1, 2, 3)]
    assert ids == ["profile-ab12-retry", "profile-ab12-retry-retry1", "profile-ab12-retry-retry2"]
    assert [attempt_number("profile-ab12-retry", i) for i in ids] == [1, 2, 3]


@given(RUN_IDS, st.integers(1, 1000))
def test_every_attempt_id_reads_back(run_id: str, attempt: int) -> None:
    """Whatever the run id holds (``-retry`` included), an attempt's id names that attempt."""
    assert attempt_number(run_id, attempt_id(run_id, attempt)) == attempt


@pytest.mark.parametrize(
    "changes",
    [{"gpus_per_node": 0}, {"cpus_per_rank": 0.0}, {"command": ["python", 3]}],
)
def test_a_spec_that_cannot_be_placed_or_launched_is_refused(changes: dict[str, object]) -> None:
    """One line, naming the field that is wrong."""
    fields = {"command": ["python"], "parallel": ParallelConfig(), "gpus_per_node": 4} | changes
    with pytest.raises(ConfigError) as error:
        RunSpec("a", "s", **fields)  # type: ignore[arg-type]
    assert "\n" not in str(error.value)
    assert str(error.value).startswith(next(iter(changes)))


def test_a_spec_takes_the_label_columns_and_the_default_policy() -> None:
    labels = dict.fromkeys(LABEL_COLUMNS, "x")
    spec = RunSpec("a", "s", ["python"], ParallelConfig(), 4, labels=labels)
    assert spec.policy == RunPolicy() and spec.labels == labels and spec.log_dir is None


def test_every_ranks_log_of_an_attempt_is_in_its_own_folder(tmp_path: Path) -> None:
    spec = RunSpec("run", "s", ["python"], ParallelConfig(pp=2, dp=2), 4, log_dir=tmp_path)
    assert log_paths(spec, "run-retry1") == [
        tmp_path / "run-retry1" / f"rank-{rank}.log" for rank in range(4)
    ]
    nowhere = RunSpec("run", "s", ["python"], ParallelConfig(pp=2, dp=2), 4)
    assert log_paths(nowhere, "run") == []
