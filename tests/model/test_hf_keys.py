"""The key readers every Hugging Face family shares: bounds, kinds, defaults and per-layer lists,
each refused in one line naming the file and the key."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ray_layout.errors import ConfigError
from ray_layout.model.hf_keys import (
    boolean,
    experts,
    integer,
    layer_flags,
    layer_indices,
    optional_int,
)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: integer({}, "hidden_size", "c.json"), "c.json: missing key hidden_size"),
        (lambda: integer({"n": 1.5}, "n", "c.json"), "n must be an integer, got 1.5"),
        (lambda: integer({"n": True}, "n", "c.json"), "n must be an integer, got True"),
        (lambda: integer({"n": 0}, "n", "c.json"), "n must be >= 1, got 0"),
        (lambda: optional_int({"n": 2**30}, "n", "c.json"), "n must be <= 16,777,216"),
        (lambda: boolean({"b": 1}, "b", "c.json"), "b must be true or false, got 1"),
        (
            lambda: experts({"e": 2, "num_experts_per_tok": 3, "f": 8}, "e", "f", "c.json"),
            "num_experts_per_tok 3 is more than e 2",
        ),
        (
            lambda: layer_flags({"k": [0, 2]}, "k", 2, "c.json", (0, 1)),
            "k entries must be 0, 1, got 2",
        ),
        (
            lambda: layer_flags({"k": [True, 1]}, "k", 2, "c.json", (0, 1)),
            "k entries must be 0, 1, got True",
        ),
        (lambda: layer_flags({"k": "01"}, "k", 2, "c.json", (0, 1)), "k must be a list of 2"),
        (
            lambda: layer_indices({"k": [1.0]}, "k", 4, "c.json"),
            "k must be a list of layer indices",
        ),
        (
            lambda: layer_indices({"k": [0, 4]}, "k", 4, "c.json"),
            r"k entry 4 is not a layer of the 4 \(0 to 3\)",
        ),
    ],
)
def test_each_bad_key_is_one_line_naming_it(call, message):
    with pytest.raises(ConfigError, match=message) as error:
        call()
    assert "\n" not in str(error.value)


def test_defaults_fill_missing_keys_only():
    assert integer({}, "n", "c", default=0, minimum=0) == 0
    assert integer({"n": None}, "n", "c", default=3) == 3
    assert optional_int({}, "n", "c") is None
    assert boolean({}, "b", "c", default=True) and not boolean({"b": False}, "b", "c", True)


@given(st.one_of(st.integers(), st.floats(allow_nan=False), st.text(), st.booleans(), st.none()))
def test_integer_returns_a_bounded_int_or_refuses(value):
    try:
        result = integer({"n": value}, "n", "c", default=7)
    except ConfigError as error:
        assert str(error).startswith("c: n must be")
    else:
        assert type(result) is int and 1 <= result <= 2**24


@given(st.integers(1, 64), st.sets(st.integers(0, 63)))
def test_layer_indices_are_the_listed_layers_or_absent(num_layers, listed):
    inside = sorted(i for i in listed if i < num_layers)
    assert layer_indices({"k": inside}, "k", num_layers, "c") == frozenset(inside)
    assert layer_indices({}, "k", num_layers, "c") is None
