"""The one reader of a file's numbers: any JSON or YAML value (ints of any size, inf, nan, text)
is a finite number within its bounds or one ConfigError naming the file, the key and the value,
never an OverflowError."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ray_layout.errors import ConfigError
from ray_layout.model.config_values import Bound, integer, number

ANY_VALUE = st.one_of(
    st.integers(),
    st.integers(10**300, 10**4000),  # past what a float holds: float() raises OverflowError
    st.integers(10**300, 10**4000).map(lambda n: -n),
    st.floats(),
    st.booleans(),
    st.none(),
    st.text(max_size=8),
    st.lists(st.integers(), max_size=3),
)
BOUNDS = st.builds(
    Bound,
    st.floats(-1e6, 1e6),
    st.floats(1e6, 1e12),
    zero=st.booleans(),
    above=st.booleans(),
)


@given(value=ANY_VALUE, bound=BOUNDS)
def test_any_value_is_a_finite_number_in_bounds_or_one_line_naming_it(value, bound):
    try:
        read = number(value, "rope_theta", "c.json", bound)
    except ConfigError as exc:
        message = str(exc)
        assert message.startswith("c.json: rope_theta must be ") and "\n" not in message
        assert len(message) < 300  # a 4,000-digit value is shown by its size
        return
    assert isinstance(read, float) and math.isfinite(read)
    within = bound.low <= read <= bound.high and not (bound.above and read == bound.low)
    assert within or (bound.zero and read == 0)


@given(value=ANY_VALUE, low=st.integers(-5, 5), high=st.integers(5, 10**6))
def test_any_value_is_an_int_in_bounds_or_one_line_naming_it(value, low, high):
    try:
        read = integer(value, "num_layers", "c.yaml", low=low, high=high)
    except ConfigError as exc:
        assert str(exc).startswith("c.yaml: num_layers must be ") and "\n" not in str(exc)
        assert len(str(exc)) < 300
        return
    assert type(read) is int and low <= read <= high and read == value


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (int("9" * 400), "must be at most 1e+12, got a 1329-bit number"),
        (-int("9" * 400), "must be > 0, got a 1329-bit number"),
        (float("inf"), "must be a finite number, got inf"),
        (float("nan"), "must be a finite number, got nan"),
        ("1e4", "must be a finite number, got '1e4'"),
        (True, "must be a finite number, got True"),
        (0, "must be > 0, got 0"),
    ],
)
def test_what_each_refusal_says(value, message):
    with pytest.raises(ConfigError) as info:
        number(value, "rope_theta", "c.json", Bound(0.0, 1e12, above=True))
    assert str(info.value) == f"c.json: rope_theta {message}"


def test_bounds_say_where_they_come_from_and_zero_may_mean_none():
    bound = Bound(1e-6, 6e5, " ms", zero=True, why=" (1 ns)", high_why=" (the timeout)")
    assert number(0, "p2p", "c", bound) == 0.0
    assert number(10**3, "p2p", "c", bound) == 1000.0
    with pytest.raises(ConfigError, match=r"^c: p2p must be 0 or at least 1e-06 ms \(1 ns\), got"):
        number(1e-9, "p2p", "c", bound)
    with pytest.raises(ConfigError, match=r"^c: p2p must be at most 600000 ms \(the timeout\)"):
        number(1e7, "p2p", "c", bound)


def test_integers_take_whole_floats_only_where_asked_and_never_text():
    assert integer(16.0, "n", "c", low=1, high=64, whole_floats=True) == 16
    assert integer(1e300, "n", "c", low=1, high=10**400, whole_floats=True) == int(1e300)
    for value, shown in ((16.0, "16.0"), ("16", "'16'"), ("1_6", "'1_6'"), (False, "False")):
        with pytest.raises(ConfigError, match=f"^c: n must be an integer, got {shown}$"):
            integer(value, "n", "c", low=1, high=64)
    with pytest.raises(ConfigError, match=r"^c: n must be an integer, got inf$"):
        integer(float("inf"), "n", "c", low=1, high=64, whole_floats=True)
    with pytest.raises(ConfigError, match=r"^c: n must be <= 64 \(of the 64 layers\), got 65$"):
        integer(65, "n", "c", low=1, high=64, why=" (of the 64 layers)")
