"""What wraps Megatron's lines on their way into a file: container runtime records (Kubernetes'
CRI files, docker's json-file) and the prefixes of launchers and loggers."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ray_layout.measure.log_wrappers import content, printed_text

STAMP = "2026-12-05T10:31:07.123456789Z"


def cri(text: str, stream: str = "stdout", tag: str = "F", stamp: str = STAMP) -> str:
    return f"{stamp} {stream} {tag} {text}"


def docker(text: str, stream: str = "stdout") -> str:
    return json.dumps({"log": text, "stream": stream, "time": "2026-12-05T10:31:07.1Z"})


def test_text_without_container_records_is_left_as_it_is() -> None:
    text = "a\r\nb\rc\n(RankActor pid=1) iteration 1/ 2 |\n{not json\nlast"
    assert printed_text(text) is text


@pytest.mark.parametrize("stamp", [STAMP, "2026-12-05T10:31:07Z", "2026-12-05T10:31:07.5+02:00"])
@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_a_cri_record_is_its_text(stamp: str, stream: str) -> None:
    lines = [cri("     rank  1: 1234.00", stream, stamp=stamp), cri("", stream), cri("x | y")]
    assert printed_text("\n".join(lines) + "\n") == "     rank  1: 1234.00\n\nx | y\n"


def test_partial_cri_records_are_joined_on_the_line_that_completes_them() -> None:
    """Each line keeps its number in the file: a partial record's line is left blank."""
    lines = [
        cri(" iteration   10/  100 | elapsed time per", tag="P"),
        cri("[rank0]: a warning of another stream", "stderr"),
        cri(" iteration (ms): 1234.5 |", tag="P"),
        cri(""),
        cri("plain"),
    ]
    assert printed_text("\n".join(lines) + "\n").split("\n") == [
        "",
        "[rank0]: a warning of another stream",
        "",
        " iteration   10/  100 | elapsed time per iteration (ms): 1234.5 |",
        "plain",
        "",
    ]


def test_a_partial_record_nothing_completes_is_a_cut_last_line() -> None:
    text = cri("whole") + "\n" + cri("half of a li", tag="P") + "\n"
    assert printed_text(text) == "whole\n\nhalf of a li"
    assert printed_text(cri("whole")) == "whole"  # no newline after it: cut too


def test_docker_json_file_records_and_partial_ones() -> None:
    lines = [
        docker("     rank  1: 1234.00\n"),
        docker("first half ", "stderr"),
        docker("[Rank 0] (after 1 iterations) memory (MB) | a: 1\n"),
        docker("second half\n", "stderr"),
        '{"log": [[[[',  # cut, or no record: read as the text it is
        "plain",
    ]
    assert printed_text("\n".join(lines) + "\n").split("\n") == [
        "     rank  1: 1234.00",
        "",
        "[Rank 0] (after 1 iterations) memory (MB) | a: 1",
        "first half second half",
        '{"log": [[[[',
        "plain",
        "",
    ]


def test_a_deeply_nested_docker_like_line_is_text() -> None:
    line = '{"log":' + "[" * 100_000 + "]" * 100_000 + "}"
    assert printed_text(line + "\n" + docker("x\n") + "\n") == line + "\nx\n"


@given(st.lists(st.text(st.characters(exclude_characters="\r\n"), max_size=30), max_size=12))
def test_any_lines_in_cri_records_read_as_the_lines(lines: list[str]) -> None:
    """Every line split at any point into partial records reads back whole, in place."""
    records, expected = [], []
    for line in lines:
        cut = len(line) // 2
        records += [cri(line[:cut], tag="P"), cri(line[cut:])]
        expected += ["", line]
    assert printed_text("".join(r + "\n" for r in records)) == "".join(e + "\n" for e in expected)


@pytest.mark.parametrize(
    ("raw", "text"),
    [
        ("(RankActor pid=1, ip=10.0.0.1) [default0]:rank 1: 2", "rank 1: 2"),
        ("3: 2026-03-16 10:00:12,345 INFO megatron.core.timers: x", " x"),
        ("(not ray) rank", "(not ray) rank"),
        ("x [repeated 3x across cluster]", "x"),
    ],
)
def test_content_takes_off_launcher_and_logger_prefixes(raw: str, text: str) -> None:
    assert content(raw) == text
