"""What each rank printed, parsed where it ran, and merged by the driver into one run."""

from __future__ import annotations

from pathlib import Path

import pytest

from ray_layout.errors import MeasurementError
from ray_layout.measure.log_format import (
    iteration_line,
    memory_line,
    timers_all,
    world_line,
)
from ray_layout.runtime.outputs import RankOutput, rank_output, run_log, write_logs


def memory(rank: int, iteration: int) -> str:
    return memory_line(rank, iteration, 1.0, 2.0, 3.0, 4.0)


# PP=2 x DP=2: rank 0 states the world, ranks 0 and 2 (DP rank 0) print their memory, the last
# rank the iterations and the timer block every rank's values were gathered into.
RANK_TEXTS = [
    "\n".join([world_line(4, dp=2, cp=1, tp=1, pp=2), memory(0, 1), memory(0, 2), ""]),
    "nothing of Megatron's here\n",
    "\n".join([memory(2, 2), memory(2, 1), ""]),
    "\n".join(
        [
            iteration_line(1, 2, 8, 100.0, 8, {"lm loss": 1.0}),
            timers_all({"forward-compute": {0: 1.0, 3: 2.0}}),
            iteration_line(2, 2, 16, 90.0, 8, {"lm loss": 0.9}),
            "",
        ]
    ),
]


def outputs() -> list[RankOutput]:
    """Each rank of RANK_TEXTS as its node parsed it."""
    return [rank_output(text, f"a/rank-{rank}") for rank, text in enumerate(RANK_TEXTS)]


def test_a_rank_keeps_its_raw_log_and_what_was_parsed_of_it() -> None:
    kept, dropped = rank_output(RANK_TEXTS[3], "a/rank-3"), rank_output(RANK_TEXTS[1], "a/rank-1")
    assert kept.log == RANK_TEXTS[3].encode() and kept.text == RANK_TEXTS[3]
    assert [r.iteration for r in kept.parsed.iterations] == [1, 2] and kept.parse_error is None
    assert dropped.parsed is None
    assert dropped.parse_error.startswith("a/rank-1: no Megatron timers, iteration or memory")


def test_text_that_utf_8_cannot_hold_is_kept_replaced() -> None:
    """A rank's output decoded with errors replaced can still hold lone surrogates."""
    output = rank_output("\udcff iteration\n", "a/rank-0")
    assert output.log == b"? iteration\n" and output.parsed is None


def test_the_run_is_the_last_ranks_records_with_every_ranks_memory() -> None:
    text, parsed = run_log(outputs())
    last = outputs()[-1].parsed
    assert (parsed.timers, parsed.iterations) == (last.timers, last.iterations)
    assert [(m.rank, m.iteration) for m in parsed.memory] == [(0, 1), (0, 2), (2, 1), (2, 2)]
    assert parsed.world is not None and parsed.world.sizes == {"dp": 2, "cp": 1, "tp": 1, "pp": 2}
    assert text == "".join(f"=== rank {rank} ===\n{body}\n" for rank, body in enumerate(RANK_TEXTS))


def test_a_lost_middle_rank_is_marked_in_the_text() -> None:
    lost = [*outputs()[:2], None, outputs()[3]]
    text, parsed = run_log(lost)
    assert "=== rank 2 ===\n(lost)\n" in text
    assert [m.rank for m in parsed.memory] == [0, 0]


@pytest.mark.parametrize(
    ("ranks", "message"),
    [
        ([], r"^the last rank's output never came back \(its actor was lost\)$"),
        ([None], r"^the last rank's output never came back"),
        ([rank_output("x\n", "a/rank-0")], r"^the last rank's output: a/rank-0: no Megatron"),
    ],
)
def test_no_run_without_the_last_ranks_records(
    ranks: list[RankOutput | None], message: str
) -> None:
    with pytest.raises(MeasurementError, match=message) as error:
        run_log(ranks)
    assert "\n" not in str(error.value)


def test_each_ranks_raw_log_is_written_by_the_driver(tmp_path: Path) -> None:
    folder = tmp_path / "logs" / "a-retry1"
    paths = write_logs(folder, [*outputs()[:3], None])
    assert paths == [folder / f"rank-{rank}.log" for rank in range(4)]
    assert [path.read_text() for path in paths] == [*RANK_TEXTS[:3], ""]
