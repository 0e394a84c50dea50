"""The one strict reader of a log's numbers: every way Python prints a number reads back to the
value it prints, and a token with anything else in it is no number."""

from __future__ import annotations

import math

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from ray_layout.measure.log_numbers import MAX_COUNT_DIGITS, read_count, read_number

# How Megatron and its forks print a float: timers {:.2f}, step {:.1f}, grad norm {:.3f},
# learning rate {:.6E}/{:.3E}, losses {:.6E}, repr, and with thousands separators.
FLOAT_FORMATS = ["{:.2f}", "{:.1f}", "{:.3f}", "{:.6E}", "{:.3E}", "{!r}", "{}", "{:,.2f}",
                 "{:_.2f}", "{:,}", "{:,.1f}", "{:.4g}"]  # fmt: skip
INT_FORMATS = ["{:d}", "{:8d}", "{:,d}", "{:_d}", "{:+d}"]
# What a number may not be followed by: at least one character no number holds.
NUMBER_CHARACTERS = set("0123456789.,_+-eE")


@given(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from(FLOAT_FORMATS))
@example(1392.0, "{:,.2f}")
@example(1234567.891, "{:_.2f}")
@example(float("-inf"), "{:.2f}")
def test_any_float_printed_as_megatron_prints_it_reads_back_to_its_value(value, form) -> None:
    printed = form.format(value).strip()
    read = read_number(printed)
    assert read is not None, printed
    if math.isnan(value):
        assert math.isnan(read)
    else:
        assert read == float(printed.replace(",", "").replace("_", ""))
        assert form != "{!r}" or read == value  # repr is exact


@given(
    st.integers(-(10**MAX_COUNT_DIGITS) + 1, 10**MAX_COUNT_DIGITS - 1), st.sampled_from(INT_FORMATS)
)
def test_any_count_printed_reads_back_to_its_value(value, form) -> None:
    printed = form.format(value).strip()
    assert read_count(printed) == value
    assert read_number(printed) == float(value)


JUNK = st.text(min_size=1, max_size=12).filter(lambda text: not set(text) <= NUMBER_CHARACTERS)


@given(
    st.one_of(
        st.builds(str.format, st.sampled_from(FLOAT_FORMATS), st.floats()),
        st.builds(str.format, st.sampled_from(INT_FORMATS), st.integers(-(10**12), 10**12)),
    ),
    JUNK,
)
@example("1", ",392.00x")
@example("1392.00", "ms")
@example("12", "x4.5")
@example("1.5", " ")
def test_any_token_with_junk_appended_is_no_number(printed, junk) -> None:
    token = printed.strip() + junk
    assert read_number(token) is None and read_count(token) is None


@pytest.mark.parametrize(
    "token",
    ["1,39", "1,3920", "13,92.0", ",392", "1,,392", "1,392,", "0,123", "1,392_000", "1_0",
     "12x4.5", "1.2.3", "1e", "e5", "--1", "+-1", "", " 1", "1 ", "١٢", "0x1F", "infinity",
     "nanx", "1..2", "."],
)  # fmt: skip
def test_malformed_numbers_are_none(token) -> None:
    assert read_number(token) is None and read_count(token) is None


@pytest.mark.parametrize(
    ("token", "value"),
    [("1,392.00", 1392.0), ("1_392.5", 1392.5), ("1,234,567", 1234567.0), ("-1.5E+03", -1500.0),
     ("+3", 3.0), (".5", 0.5), ("5.", 5.0), ("007", 7.0), ("NaN", math.nan), ("-inf", -math.inf)],
)  # fmt: skip
def test_numbers_read_as_the_value_they_print(token, value) -> None:
    read = read_number(token)
    assert read is not None
    assert (math.isnan(read) and math.isnan(value)) or read == value


def test_a_count_is_whole_and_bounded() -> None:
    assert read_count("1,024") == 1024 and read_count("-3") == -3
    assert read_count("1.0") is None and read_count("1e3") is None and read_count("nan") is None
    assert read_count("9" * MAX_COUNT_DIGITS) == int("9" * MAX_COUNT_DIGITS)
    assert read_count("9" * (MAX_COUNT_DIGITS + 1)) is None  # and no 4,300-digit int() error
    assert read_count("9" * 5000) is None and read_number("9" * 5000) is None
