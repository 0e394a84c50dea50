"""The one reader of input files: regular files of bounded size only, strict UTF-8, and YAML/JSON
mappings with text keys given once and aliases that cannot balloon; any other file is one
ConfigError naming it, at once."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ray_layout.errors import ConfigError
from ray_layout.model.files import (
    MAX_INPUT_BYTES,
    MAX_MAPPING_BYTES,
    MAX_YAML_VALUES,
    read_log_opening,
    read_mapping,
    read_text,
)

TMP = settings(suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=40)


def written(folder: Path, name: str, content: str | bytes) -> Path:
    path = folder / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    return path


def refusal(path: Path, read=read_mapping) -> str:
    """The one-line message reading ``path`` ends in, within a second."""
    started = time.monotonic()
    with pytest.raises(ConfigError) as info:
        read(path, path.name)
    assert time.monotonic() - started < 1.0
    message = str(info.value)
    assert "\n" not in message and message.startswith(path.name)
    return message


def test_regular_files_read_as_utf8(tmp_path):
    path = written(tmp_path, "train.sh", "echo é\n")
    assert read_text(path, "train.sh") == "echo é\n"


def test_a_fifo_is_refused_at_once_stating_the_cap(tmp_path):
    fifo = tmp_path / "config.yaml"
    os.mkfifo(fifo)  # opened blocking, this would wait for a writer forever
    assert refusal(fifo) == (
        "config.yaml: a FIFO, not a regular file (an input file is read whole: a regular file of "
        f"at most {MAX_MAPPING_BYTES:,} bytes)"
    )


def test_devices_and_folders_are_refused_stating_the_cap(tmp_path):
    with pytest.raises(ConfigError, match=r"^/dev/zero: a character device, not a regular file"):
        read_text("/dev/zero", "/dev/zero")
    message = refusal(tmp_path, read_text)
    assert "a folder, not a regular file" in message and f"{MAX_INPUT_BYTES:,} bytes" in message


def test_a_sparse_9_gb_file_is_refused_by_its_size_before_a_byte_is_read(tmp_path):
    path = tmp_path / "costs.json"
    with path.open("wb") as handle:
        handle.truncate(9 * 10**9)
    assert refusal(path) == (
        f"costs.json: 9,000,000,000 bytes, more than the {MAX_MAPPING_BYTES:,} an input file "
        "may hold"
    )
    assert "4,000,001 bytes" in refusal(written(tmp_path, "t.sh", b" " * (MAX_INPUT_BYTES + 1)))


def test_a_file_that_grows_past_its_size_reads_no_more_than_the_cap():
    """/proc files say size 0: the reader still stops at the cap (here: well under it)."""
    assert "Name:" in read_text("/proc/self/status", "status")


def test_missing_and_unreadable_paths_say_why(tmp_path):
    assert refusal(tmp_path / "gone.sh", read_text) == (
        "gone.sh: cannot read (No such file or directory)"
    )
    with pytest.raises(ConfigError, match="cannot read"):
        read_text("a\0b", "a\\0b")


@pytest.mark.parametrize("name", ["c.yaml", "c.json", "COSTS.JSON", "t.sh"])
def test_non_utf8_bytes_name_the_file_byte_and_line(tmp_path, name):
    path = written(tmp_path, name, b'{"a":\n 1,\n "b": "\xff"}')
    read = read_text if name == "t.sh" else read_mapping
    assert refusal(path, read) == f"{name}: not UTF-8 text at byte 17 (line 3)"


@TMP
@given(
    prefix=st.text(st.characters(codec="utf-8", exclude_characters="\r"), max_size=20),
    bad=st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x80abc", b"\xf8\x88\x80\x80\x80"]),
)
def test_any_invalid_utf8_is_one_line_with_its_offset(tmp_path, prefix, bad):
    data = prefix.encode() + bad
    path = written(tmp_path, "x.yaml", data)
    message = refusal(path)
    assert message.startswith(f"x.yaml: not UTF-8 text at byte {len(prefix.encode())} (line ")


def test_json_is_read_as_json_whatever_the_suffix_case(tmp_path):
    """QWEN.JSON, tab-indented: valid JSON, never valid YAML."""
    path = written(tmp_path, "QWEN.JSON", '{\n\t"model_type": "qwen3",\n\t"a": [1, 2]\n}')
    assert read_mapping(path, "QWEN.JSON") == {"model_type": "qwen3", "a": [1, 2]}


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("c.yaml", "tp: 1\npp: 2\ntp: 4\n", "c.yaml:3: duplicate key 'tp'"),
        ("c.yaml", "parallel:\n  tp: 1\n  tp: 2\n", "c.yaml:3: duplicate key 'tp'"),
        ("c.yaml", "a: 1\n'a': 2\n", "c.yaml:2: duplicate key 'a'"),
        ("c.json", '{"forward_ms": {"t": 1, "t": 2}}', "c.json: duplicate key 't'"),
        ("c.yml", "1: 2\n", "c.yml:1: key 1 is not text (quote it if it is a name)"),
        ("c.yaml", "parallel:\n  1: 2\n", "c.yaml:2: key 1 is not text"),
        ("c.yaml", "on: 1\n", "c.yaml:1: key True is not text"),
        ("c.yaml", "? [a, b]\n: 1\n", "c.yaml:1: key a collection is not text"),
        ("c.yaml", "a: [1\n", "c.yaml: not valid YAML: expected ',' or ']', but got '<stream"),
        ("c.json", "{'a': 1}", "c.json: not valid JSON: Expecting property name"),
        ("c.yaml", "- 1\n", "c.yaml: expected a mapping at the top level"),
        ("c.json", "[1]", "c.json: expected a JSON object at the top level"),
        ("c.json", "[" * 100_000, "c.json: nested too deeply"),
    ],
)
def test_keys_are_text_given_once(tmp_path, name, text, message):
    assert refusal(written(tmp_path, name, text)).startswith(message)


def test_a_merge_key_may_be_overridden_by_the_mapping_that_merges_it(tmp_path):
    path = written(tmp_path, "c.yaml", "base: &b {x: 1, y: 2}\nc:\n  <<: *b\n  x: 3\n")
    assert read_mapping(path, "c.yaml")["c"] == {"x": 3, "y": 2}


def billion_laughs(levels: int = 9, width: int = 9) -> str:
    lines = ["l0: &l0 [" + ", ".join(["lol"] * width) + "]"]
    lines += [f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * width) + "]" for i in range(1, levels)]
    return "\n".join(lines) + "\nname: *l8\n"


BOUND = f"c.yaml: more than {MAX_YAML_VALUES:,} values (each use of an alias counted)"


@pytest.mark.parametrize(
    "text",
    [
        billion_laughs(),
        "a: &a [*a]\n",  # a cycle: never ends when walked
        "a0: &a0 {x: 1}\n"
        + "".join(f"a{i + 1}: &a{i + 1} {{<<: [*a{i}, *a{i}]}}\n" for i in range(30)),
    ],
    ids=["billion-laughs", "cycle", "merge-bomb"],
)
def test_aliases_never_expand_past_the_bound(tmp_path, text):
    assert refusal(written(tmp_path, "c.yaml", text)) == BOUND


def test_a_document_of_too_many_values_stops_composing_at_the_bound(tmp_path):
    path = written(tmp_path, "c.yaml", "a: [" + "1, " * 150_000 + "]\n")
    started = time.monotonic()
    with pytest.raises(ConfigError) as info:
        read_mapping(path, "c.yaml")
    assert str(info.value) == BOUND and time.monotonic() - started < 10


def test_a_few_aliases_are_read_as_yaml_reads_them(tmp_path):
    text = "a: &a {x: [1, 2]}\nb: *a\nc: [*a, *a]\n"
    assert read_mapping(written(tmp_path, "c.yaml", text), "c.yaml") == yaml.safe_load(text)


KEYS = st.text(
    st.characters(codec="utf-8", exclude_categories=["Cs", "Cc"]), min_size=1, max_size=8
)


@TMP
@given(keys=st.lists(KEYS, min_size=1, max_size=6), again=st.data())
def test_any_repeated_key_is_refused_by_name_in_yaml_and_json(tmp_path, keys, again):
    """A mapping's keys, one of them given a second time, in either format."""
    repeated = again.draw(st.sampled_from(keys))
    pairs = [(k, i) for i, k in enumerate(dict.fromkeys(keys))] + [(repeated, -1)]
    as_json = "{" + ", ".join(f"{json.dumps(k)}: {v}" for k, v in pairs) + "}"
    as_yaml = "".join(f"{json.dumps(k, ensure_ascii=False)}: {v}\n" for k, v in pairs)
    for name, text in (("c.json", as_json), ("c.yaml", as_yaml)):
        message = refusal(written(tmp_path, name, text))
        assert "duplicate key" in message and repr(repeated)[:40] in message


@TMP
@given(depth=st.integers(1, 12), width=st.integers(2, 12))
def test_any_alias_tree_is_read_or_refused_by_its_expanded_size(tmp_path, depth, width):
    lines = ["l0: &l0 [" + ", ".join(["x"] * width) + "]"]
    lines += [f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * width) + "]" for i in range(1, depth)]
    path = written(tmp_path, "c.yaml", "\n".join(lines) + "\n")
    expanded = sum(width**i + width**i // width for i in range(1, depth + 1))  # >= the values
    if expanded < MAX_YAML_VALUES // 2:
        assert len(read_mapping(path, "c.yaml")) == depth
    elif width**depth > MAX_YAML_VALUES:
        assert "values (each use of an alias counted)" in refusal(path)


def test_a_log_of_any_size_is_read_from_its_opening_with_stray_bytes_replaced(tmp_path):
    big = written(tmp_path, "run.log", b"rank 0 \xff says\n" + b"x" * (MAX_INPUT_BYTES + 10))
    opening = read_log_opening(big, "run.log", limit=100)
    assert opening.startswith("rank 0 \ufffd says\n") and len(opening) == 100
    assert len(read_log_opening(big, "run.log")) == 4_000_000
    fifo = tmp_path / "fifo.log"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match=r"^fifo\.log: a FIFO, not a regular file .*at most"):
        read_log_opening(fifo, "fifo.log")


def test_a_yaml_number_is_one_only_in_plain_decimal(tmp_path):
    """YAML 1.1 reads 1_6 and 1:30 as 16 and 90, 016 as octal 14 and 0x10 as 16: those stay text,
    which a field's reader refuses by name; plain numbers, signs and inf/nan stay numbers."""
    text = (
        "a: 1_6\nb: 016\nc: 1:30\nd: 0x10\ne: 0o7\nf: 1_000.5\ng: 16\nh: -3\ni: +7\nj: 0\n"
        "k: 1.5\nl: .5\nm: 2.\nn: 1.0e+3\no: .inf\np: -.inf\nq: 12345678901234567890123\n"
    )
    read = read_mapping(written(tmp_path, "x.yaml", text.encode()), "x.yaml")
    assert {k: read[k] for k in "abcdef"} == dict(
        zip("abcdef", ["1_6", "016", "1:30", "0x10", "0o7", "1_000.5"], strict=True)
    )
    assert [read[k] for k in "ghijklmnopq"] == [
        16,
        -3,
        7,
        0,
        1.5,
        0.5,
        2.0,
        1000.0,
        float("inf"),
        float("-inf"),
        12345678901234567890123,
    ]
    nan = read_mapping(written(tmp_path, "y.yaml", b"x: .nan\n"), "y.yaml")["x"]
    assert nan != nan
