"""The world a log states about itself: every wording of rank 0's start-up line this tool
knows, the last one when a restart appended its own."""

from __future__ import annotations

import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ray_layout.measure.log_world import SIZE_NAMES, LogWorld, parse_world
from tests.helpers.paths import SHARED_DATA

REAL_LOGS = SHARED_DATA / "real_megatron_logs"
HANDBOOK_LINE = (
    "using world size: 8, data-parallel size: 2, context-parallel size: 1, hierarchical "
    "context-parallel sizes: None, tensor-model-parallel size: 1, pipeline-model-parallel size: 4"
)


@pytest.mark.skipif(not REAL_LOGS.is_dir(), reason="real logs not present")
def test_a_real_log_states_its_world():
    world = parse_world((REAL_LOGS / "05_ms_swift_mcore_2024.log").read_text())
    assert (world.world_size, dict(world.sizes), world.line) == (
        2,
        {"dp": 2, "cp": 1, "tp": 1, "pp": 1},
        8,
    )


@pytest.mark.parametrize(
    ("line", "sizes"),
    [
        (
            "using world size: 8, data-parallel-size: 8, tensor-model-parallel size: 1, "
            "pipeline-model-parallel size: 1 ",
            {"dp": 8, "tp": 1, "pp": 1},
        ),
        (
            "[rank0]: using world size: 16, data-parallel size: 1, context-parallel size: 1, "
            "hierarchical context-parallel sizes: Nonetensor-model-parallel size: 4, "
            "encoder-tensor-model-parallel size: 0, pipeline-model-parallel size: 4, "
            "encoder-pipeline-model-parallel size: 0",
            {"dp": 1, "cp": 1, "tp": 4, "pp": 4},
        ),
    ],
)
def test_world_lines_of_older_megatron_and_forks(line, sizes):
    assert dict(parse_world(f"start\n{line}\n").sizes) == sizes


def test_a_log_without_a_world_line_states_none() -> None:
    assert parse_world("") is None
    assert parse_world("world size is 8\nusing world size 8\n") is None


def test_the_last_world_stated_is_the_one_and_its_line_is_kept() -> None:
    """A restart appended to the same log states its own world: that one counts, and the lines
    of the earlier ones are kept (the log checks refuse a log of several starts)."""
    text = f"{HANDBOOK_LINE}\ntraining ...\n\n{HANDBOOK_LINE.replace('size: 8', 'size: 16')}\n"
    world = parse_world(text)
    assert world == LogWorld(16, {"dp": 2, "cp": 1, "tp": 1, "pp": 4}, 4, earlier=(1,))
    assert world.describe() == "a world of 16 (DP 2, CP 1, TP 1, PP 4)"


def test_expert_sizes_a_fork_prints_are_read_and_encoder_sizes_are_not() -> None:
    line = (
        "using world size: 32, data-parallel size: 4, tensor-model-parallel size: 2, "
        "encoder-tensor-model-parallel size: 8, pipeline-model-parallel size: 4, "
        "expert-model-parallel size: 4, expert-tensor-parallel size: 1"
    )
    assert dict(parse_world(line).sizes) == {"dp": 4, "tp": 2, "pp": 4, "ep": 4, "etp": 1}


def test_the_sizes_are_a_read_only_copy() -> None:
    sizes = {"dp": 2}
    world = LogWorld(2, sizes, 1)
    sizes["dp"] = 4
    assert world.sizes == {"dp": 2}
    with pytest.raises(TypeError):
        world.sizes["tp"] = 1  # type: ignore[index]
    assert hash(world) == hash(LogWorld(2, {"tp": 8}, 1))


@given(
    st.integers(1, 10**5),
    st.dictionaries(st.sampled_from(list(SIZE_NAMES)), st.integers(0, 10**4)),
    st.sampled_from([" ", "-"]),
    st.sampled_from([", ", " ", ""]),
    st.sampled_from(["", "[rank0]: ", "(RankActor pid=7) ", "0: "]),
)
def test_every_wording_of_the_sizes_is_read(
    world: int, sizes: dict[str, int], joint: str, separator: str, prefix: str
) -> None:
    """Names joined to ``size`` by a blank or a dash, listed in any order, with or without a
    comma between them (forks glue them onto the value before), after any launcher prefix."""
    named = separator.join(f"{name}{joint}size: {value}" for name, value in sizes.items())
    stated = parse_world(f"banner\n{prefix}using world size: {world}, {named}\nmore\n")
    assert stated is not None and (stated.world_size, stated.line) == (world, 2)
    assert dict(stated.sizes) == {SIZE_NAMES[name]: value for name, value in sizes.items()}


def test_many_world_lines_are_read_in_linear_time():
    started = time.perf_counter()
    world = parse_world((HANDBOOK_LINE + "\n") * 50_000)
    assert world.line == 50_000 and world.earlier[-2:] == (49_998, 49_999)
    assert time.perf_counter() - started < 2.0
