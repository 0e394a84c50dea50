"""How numbers read in the report and on the terminal: separators and fixed digits, and a dash
wherever there is no number (None, NaN, infinity)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from ray_layout.ab.vocabulary import ArmStatus
from ray_layout.report.numbers import (
    show_gib,
    show_measured,
    show_ms,
    show_pct,
    show_signed_pct,
    show_times,
    show_value,
)
from tests.helpers.report_summary import arm

SHOWS = (show_ms, show_gib, show_signed_pct, show_pct, show_times)


@pytest.mark.parametrize("missing", [None, math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("show", SHOWS)
def test_no_number_is_a_dash(show, missing):
    assert show(missing) == "—"


@pytest.mark.parametrize(
    ("show", "value", "text"),
    [
        (show_ms, 6310.04, "6,310.0"),
        (show_ms, 0.0, "0.0"),
        (show_gib, 1234.56, "1,234.6"),
        (show_signed_pct, 0.0123, "+1.2%"),
        (show_signed_pct, -0.2, "-20.0%"),
        (show_pct, 0.4, "40.0%"),
        (show_times, 1.4897, "1.49×"),
    ],
)
def test_numbers_read_with_separators_and_fixed_digits(show, value, text):
    assert show(value) == text


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (None, "not given"),
        (True, "yes"),  # a bool is an int to Python, never "1" here
        (False, "no"),
        (0, "0"),
        (816, "816"),
        (1048576, "1,048,576"),
        (0.08, "0.08"),
        (131.0, "131"),
        (999.4, "999"),
        (6310.4, "6,310"),
        ("enumeration", "enumeration"),
    ],
)
def test_a_setting_reads_as_prose(value, text):
    assert show_value(value) == text


def test_a_measured_mean_shows_half_its_intervals_width():
    assert show_measured(arm("a", 100.0, 6310.0)) == "6,310.0 ± 1.0"
    measured = arm("a", 100.0, 50.0)
    assert show_measured(replace(measured, ci_ms=(55.0, 40.0))) == "50.0 ± 7.5"
    assert show_measured(replace(measured, ci_ms=None)) == "50.0"
    for unmeasured in (None, 0.0, math.nan):
        assert show_measured(arm("a", 100.0, unmeasured, status=ArmStatus.FAILED)) == "—"
