"""parse_moe_layer_freq: Megatron's pattern expressions, and never anything but ConfigError."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ray_layout.errors import ConfigError
from ray_layout.model.spec import build_recipe, parse_moe_layer_freq

patterns = st.lists(st.integers(0, 1), min_size=1, max_size=200)


def run_length_expression(pattern: list[int]) -> str:
    """Megatron's style: ``([0]*3+[1]*58)``."""
    runs = [f"[{bit}]*{len(list(run))}" for bit, run in itertools.groupby(pattern)]
    return "(" + "+".join(runs) + ")"


@given(patterns)
def test_run_length_expressions_parse_to_their_pattern(pattern):
    expected = tuple(bool(bit) for bit in pattern)
    assert parse_moe_layer_freq(run_length_expression(pattern), len(pattern)) == expected


@given(patterns, st.integers(1, 5))
def test_repeated_blocks_parse_to_their_pattern(block, times):
    expression = f"({run_length_expression(block)})*{times}"
    expected = tuple(bool(bit) for bit in block) * times
    assert parse_moe_layer_freq(expression, len(block) * times) == expected


@given(patterns)
def test_lists_and_list_literals_parse_alike(pattern):
    expected = tuple(bool(bit) for bit in pattern)
    assert parse_moe_layer_freq(pattern, len(pattern)) == expected
    assert parse_moe_layer_freq(str(pattern), len(pattern)) == expected


@given(st.integers(1, 64), st.integers(1, 100))
def test_an_int_marks_every_nth_layer_from_layer_zero(every, num_layers):
    expected = tuple(i % every == 0 for i in range(num_layers))
    assert parse_moe_layer_freq(every, num_layers) == expected
    assert parse_moe_layer_freq(str(every), num_layers) == expected


@given(
    st.one_of(
        st.text(alphabet="[]()+*-,. 0123456789abx_\x00\n", max_size=60),
        st.text(max_size=30),
        st.recursive(
            st.integers(-3, 300).map(str) | st.just("[0]") | st.just("[1]") | st.just("[]"),
            lambda inner: (
                st.tuples(inner, st.sampled_from("+*-,"), inner).map("".join)
                | inner.map(lambda s: f"({s})")
                | inner.map(lambda s: f"[{s}]")
            ),
        ),
    ),
    st.integers(1, 64),
)
def test_any_text_is_a_pattern_or_a_config_error(text, num_layers):
    try:
        pattern = parse_moe_layer_freq(text, num_layers)
    except ConfigError as exc:
        assert "\n" not in str(exc)
    else:
        assert len(pattern) == num_layers
        assert all(isinstance(bit, bool) for bit in pattern)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (2.0, "must be an int or a list, got 2.0"),
        ({"layers": 1}, "must be an int or a list"),
        (True, "must be an int or a list, got True"),
        (0, "must be >= 1, got 0"),
        ("[1]*3", "has 3 entries but num_layers is 4"),
        ("[2]*4", "entries must be 0 or 1"),
        ("__import__('os')", "only integers, lists, '+' and '*' are allowed"),
        ("[1]*", "is not an int or a list expression"),
        ("[1]*10**9", "only integers, lists"),
        ("[1]*99999+[1]*99999", "is too large"),
        ("[1, 1]*60000", "is too long"),
        ("+".join(["[1]"] * 5000), "nested too deeply"),
        ("-" * 5000 + "1", "nested too deeply"),
    ],
)
def test_bad_values_are_config_errors(value, message):
    with pytest.raises(ConfigError) as info:
        parse_moe_layer_freq(value, 4)
    assert message in str(info.value)


def test_build_recipe_treats_a_null_layer_freq_as_unset():
    raw = {
        "num_layers": 2,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "seq_length": 8,
        "vocab_size": 10,
        "num_experts": 2,
        "moe_layer_freq": None,
    }
    assert build_recipe(raw, source="yaml").model.moe_layer_pattern == (True, True)


def test_model_fields_table_agrees_with_model_spec():
    """ModelSpec's own defaults are the table's, and every table key reaches build_recipe."""
    from dataclasses import MISSING, fields

    from ray_layout.model.fields import FIELD, MODEL_KEYS, REQUIRED
    from ray_layout.model.spec import MLAConfig, ModelSpec

    derived = {"max_position_embeddings", "moe_router_topk"}  # 0 unless learned / MoE
    for f in fields(ModelSpec):
        if f.name in FIELD and f.default is not MISSING and f.name not in derived:
            assert FIELD[f.name].default in (f.default, REQUIRED, None), f.name
    spec_keys = {f.name for f in fields(ModelSpec)} | {f.name for f in fields(MLAConfig)}
    inputs_only = {"group_query_attention", "multi_latent_attention", "moe_layer_freq"}
    assert (spec_keys - {"moe_layer_pattern", "mla"}) | inputs_only == MODEL_KEYS
