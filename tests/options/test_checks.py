"""The small checks flags' values must pass: each returns the problem in words, or None."""

from __future__ import annotations

import argparse
import math
import os
import re
import socket

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ray_layout.options.checks import (
    at_least,
    between,
    comma_integers,
    costs_file,
    decimal,
    each,
    existing_file,
    finite,
    flag_type,
    folder_or_new,
    integer,
    new_file,
    plain_name,
    positive,
    reachable,
)


@given(st.integers(-100, 100), st.integers(-100, 100))
def test_at_least_and_between_pass_exactly_the_values_in_bounds(low, value):
    assert (at_least(low)(value) is None) == (value >= low)
    high = low + 10
    problem = between(low, high)(value)
    assert (problem is None) == (low <= value <= high)
    if problem:
        assert problem.endswith(f", got {value}") and "\n" not in problem


def test_bounds_say_why_where_asked_and_large_numbers_with_separators():
    assert at_least(5, "the fit drops the first 3")(4) == (
        "must be >= 5: the fit drops the first 3, got 4"
    )
    assert between(1, 65_536)(70_000) == "must be <= 65,536, got 70000"


@pytest.mark.parametrize("value", [0.0, -1.0, math.nan, -math.inf])
def test_positive_refuses_zero_negatives_and_nan(value):
    assert positive(value) == f"must be positive, got {value}"


def test_finite_refuses_infinities_and_nan():
    assert finite(1e300) is None
    assert finite(math.inf) == "must be a finite number, got inf"
    assert finite(math.nan) == "must be a finite number, got nan"


@given(st.text(max_size=140))
def test_a_plain_name_is_a_single_safe_folder_name(name):
    if plain_name(name) is None:
        assert name == os.path.basename(name) and name not in (".", "..")
        assert not name.startswith(("-", ".")) and len(name) <= 128 and name.isascii()
    else:
        assert plain_name(name).endswith(f"got {name!r}")


@pytest.mark.parametrize("name", ["../up", "a/b", "", ".hidden", "x" * 129, "tab\there", "é"])
def test_names_that_would_escape_or_hide_in_the_store_are_refused(name):
    assert plain_name(name).startswith("must be a plain name (letters, digits")


def test_files_checks_name_the_path_and_the_problem(tmp_path):
    present = tmp_path / "costs.json"
    present.write_text("{}")
    assert existing_file(present) is None and costs_file(str(present)) is None
    assert costs_file("flops") is None  # the word, not a file
    missing = tmp_path / "missing.json"
    assert existing_file(missing) == f"{missing}: no such file"
    assert existing_file(tmp_path) is None  # what it is (a folder, a FIFO) the reader says
    too_long = "x" * 5000
    assert existing_file(too_long) == f"{too_long}: unusable path (File name too long)"


def test_a_folder_to_fill_may_be_new_but_not_a_file_or_under_one(tmp_path):
    file = tmp_path / "file"
    file.write_text("")
    assert folder_or_new(tmp_path / "new" / "deeper") is None
    assert folder_or_new(tmp_path) is None
    assert folder_or_new(file) == f"{file}: is a file, not a folder"
    assert folder_or_new(file / "sub") == f"{file / 'sub'}: cannot be made, {file} is a file"
    assert folder_or_new("  ") == "must name a folder, got '  '"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes in any folder")
def test_a_folder_this_user_cannot_write_in_is_refused(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    assert folder_or_new(locked / "store") == f"{locked / 'store'}: {locked} is not writable"
    assert new_file()(locked / "out.json").endswith("is not writable")


def test_a_device_or_fifo_is_never_a_file_to_write():
    """A rename onto /dev/full would replace the device with a file: refuse it first."""
    assert new_file()("/dev/full") == "/dev/full: is not a regular file; name a file to write"


def test_a_new_file_needs_its_folder_and_its_suffix(tmp_path):
    check = new_file((".png", ".svg"))
    assert check(tmp_path / "chart.PNG") is None  # suffixes match in any case
    assert check(tmp_path) == f"{tmp_path}: is a folder, not a file"
    assert check(tmp_path / "no" / "chart.png") == (
        f"{tmp_path / 'no' / 'chart.png'}: no such folder {str(tmp_path / 'no')!r}"
    )
    assert check(tmp_path / "chart.txt") == f"{tmp_path / 'chart.txt'}: must end in .png, .svg"
    assert new_file()(tmp_path / "anything.txt") is None


def test_each_reports_the_first_item_that_fails():
    check = each(at_least(1))
    assert check((1, 2, 3)) is None
    assert check((1, 0, -1)) == "must be >= 1, got 0"


@given(st.lists(st.integers(-(10**98), 10**98), min_size=1, max_size=10))
def test_comma_integers_reads_what_a_join_wrote(numbers):
    assert comma_integers("1,2")(",".join(map(str, numbers))) == tuple(numbers)


@pytest.mark.parametrize("text", ["", "1,,2", "1,x", "1.5", "1;2", "1_0,2", " 1,2", "٣,1"])
def test_comma_integers_says_what_it_expected(text):
    with pytest.raises(ValueError, match=rf"^must be integers such as 1,2,4, got {text!r}$"):
        comma_integers("1,2,4")(text)


@pytest.mark.parametrize(
    "address",
    [
        "host",
        "host:",
        ":6379",
        "host:0",
        "host:65536",
        "host:x",
        "host:１２",
        "ray://",
        "host:123456",
    ],
)
def test_an_address_that_is_no_host_and_port_is_refused_without_connecting(address):
    assert reachable(address) == f"must be HOST:PORT (or ray://HOST:PORT, auto), got {address!r}"


def test_an_address_answers_or_is_refused_in_seconds():
    assert reachable("auto") is None and reachable("local") is None
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        assert reachable(f"ray://127.0.0.1:{port}") is None  # a Ray client: its port answers
        silent = reachable(f"127.0.0.1:{port}")  # answers, but not as a Ray head does
        assert silent.startswith(f"127.0.0.1:{port}: ") and "Ray" in silent
    problem = reachable(f"127.0.0.1:{port}")  # closed now: nobody answers
    assert problem.startswith(f"127.0.0.1:{port}: no Ray cluster answers there (")
    assert problem.endswith("); start it or fix the address")


@given(st.text(alphabet="0123456789-+_ .eE٣x\n", max_size=12) | st.integers().map(str))
def test_integers_are_ascii_digits_only(text):
    """Python's int() reads 1_0 as 10, ' 7' and '+7' as 7 and '٣' as 3: no flag means those."""
    plain = len(text) <= 100 and re.fullmatch(r"-?[0-9]+", text) is not None
    if plain:
        assert integer(text) == int(text)
    else:
        with pytest.raises(ValueError, match=r"^must be an integer in digits \(0-9\), got "):
            integer(text)


@given(st.text(alphabet="0123456789-+_ .eEinfa٣\n", max_size=12) | st.floats().map(repr))
def test_decimals_are_finite_and_plainly_written(text):
    try:
        value = decimal(text)
    except ValueError as exc:
        assert str(exc).startswith("must be a") and "\n" not in str(exc)
        return
    assert math.isfinite(value) and value == float(text)
    assert "_" not in text and text == text.strip() and "n" not in text and text[:1] != "+"


@pytest.mark.parametrize(
    ("kind", "text", "message"),
    [
        (int, "1_0", "argument --pp: must be an integer in digits (0-9), got '1_0'"),
        (int, "9" * 101, "argument --pp: must be an integer in digits (0-9), got '99999"),
        (float, "nan", "argument --pp: must be a decimal number (such as 2, 0.5, 1e-3), got 'nan'"),
        (float, "1e400", "argument --pp: must be a number a float holds (up to 1.8e308)"),
        (float, "1_0.5", "argument --pp: must be a decimal number"),
    ],
)
def test_a_number_flag_refuses_what_int_and_float_would_stretch_to(kind, text, message, capsys):
    parser = argparse.ArgumentParser(exit_on_error=False)
    parser.add_argument("--pp", type=flag_type(kind))
    with pytest.raises(argparse.ArgumentError) as info:
        parser.parse_args(["--pp", text])
    assert str(info.value).startswith(message)
    assert parser.parse_args(["--pp", "-12"]).pp == kind(-12)
    assert flag_type(str) is str and flag_type(bool) is bool
