"""parse_moe_layer_freq: Megatron's pattern expressions, and never anything but ConfigError; a
config file's errors: one line naming it (a wrong type for a section, keys that are not text or
come twice, a value too long to quote whole); what build_recipe works out (top-k routing)."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ray_layout.errors import ConfigError
from ray_layout.model.fields import model_flags
from ray_layout.model.megatron_args import UnresolvedArgument, megatron_flag_table
from ray_layout.model.moe_layer_freq import parse_moe_layer_freq
from ray_layout.model.spec import build_recipe, load_recipe_file

SOURCE = "c.yaml"
patterns = st.lists(st.integers(0, 1), min_size=1, max_size=200)


def freq(value, num_layers: int) -> tuple[bool, ...]:
    return parse_moe_layer_freq(value, num_layers, source=SOURCE)


def run_length_expression(pattern: list[int]) -> str:
    """Megatron's style: ``([0]*3+[1]*58)``."""
    runs = [f"[{bit}]*{len(list(run))}" for bit, run in itertools.groupby(pattern)]
    return "(" + "+".join(runs) + ")"


@given(patterns)
def test_run_length_expressions_parse_to_their_pattern(pattern):
    expected = tuple(bool(bit) for bit in pattern)
    assert freq(run_length_expression(pattern), len(pattern)) == expected


@given(patterns, st.integers(1, 5))
def test_repeated_blocks_parse_to_their_pattern(block, times):
    expression = f"({run_length_expression(block)})*{times}"
    expected = tuple(bool(bit) for bit in block) * times
    assert freq(expression, len(block) * times) == expected


@given(patterns)
def test_lists_and_list_literals_parse_alike(pattern):
    expected = tuple(bool(bit) for bit in pattern)
    assert freq(pattern, len(pattern)) == expected
    assert freq(str(pattern), len(pattern)) == expected


@given(st.integers(1, 64), st.integers(1, 100))
def test_an_int_marks_every_nth_layer_from_layer_zero(every, num_layers):
    expected = tuple(i % every == 0 for i in range(num_layers))
    assert freq(every, num_layers) == expected
    assert freq(str(every), num_layers) == expected


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
        pattern = freq(text, num_layers)
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
        freq(value, 4)
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


TINY = "num_layers: 4\nhidden_size: 64\nnum_attention_heads: 4\nseq_length: 8\nvocab_size: 10\n"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("parallel: false\n", "c.yaml: parallel must be a mapping, got False"),
        ("parallel: 0\n", "c.yaml: parallel must be a mapping, got 0"),
        ("parallel: [tp, 2]\n", "c.yaml: parallel must be a mapping, got ['tp', 2]"),
        ("1: 2\n", "c.yaml:6: key 1 is not text"),
        ("parallel:\n  1: 2\n", "c.yaml:7: key 1 is not text"),
        ("num_layers: 8\n", "c.yaml:6: duplicate key 'num_layers'"),
        ("parallel:\n  tp: 2\n  tp: 4\n", "c.yaml:8: duplicate key 'tp'"),
        ("num_experts: 2\nmoe_layer_freq: '[1]*3'\n", "c.yaml: moe_layer_freq has 3 entries but"),
        ("name: &n [a, b]\nmegatron_args: *n\nnormalization: " + "x" * 10**5 + "\n",
         "c.yaml: name must be a string, got ['a', 'b']"),
    ],
)  # fmt: skip
def test_a_config_file_refuses_with_one_line_naming_it(tmp_path, text, message):
    path = tmp_path / "c.yaml"
    path.write_text(TINY + text)
    with pytest.raises(ConfigError) as info:
        load_recipe_file(path)
    assert str(info.value).replace(str(tmp_path) + "/", "").startswith(message)


def test_an_empty_parallel_section_is_no_section(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(TINY + "parallel:\n")
    assert load_recipe_file(path).parallel.tp == 1


def test_an_error_quotes_a_huge_value_in_80_characters(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(TINY + "normalization: " + "x" * 10**5 + "\n")
    with pytest.raises(ConfigError) as info:
        load_recipe_file(path)
    assert len(str(info.value)) < len(str(path)) + 140


def test_quick_geglu_takes_the_place_of_swiglu_and_softmax_type_is_checked():
    base = {"num_layers": 1, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 8,
            "vocab_size": 64}  # fmt: skip
    model = build_recipe(base | {"quick_geglu": True}, source="t").model
    assert model.quick_geglu and not model.swiglu and model.gated_linear_unit
    assert model.ffn_hidden_size == 4 * 64  # Megatron's 2/3 rounding is SwiGLU's alone
    with pytest.raises(ConfigError, match="swiglu and quick_geglu are both set"):
        build_recipe(base | {"quick_geglu": True, "swiglu": True}, source="t")
    with pytest.raises(ConfigError, match="softmax_type must be one of vanilla, off-by-one, learn"):
        build_recipe(base | {"softmax_type": "sinks"}, source="t")


def test_a_moe_model_routes_to_megatrons_top_k_unless_given_and_a_dense_one_has_no_router():
    """Left out, top-k is what Megatron's parser defaults --moe-router-topk to; a dense model
    holds 0 (nothing reads it), writes no flag and refuses one; a MoE model's 0 is refused."""
    base = {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 8,
            "vocab_size": 64}  # fmt: skip
    moe = build_recipe(base | {"num_experts": 4}, source="t").model
    assert moe.moe_router_topk == megatron_flag_table()["--moe-router-topk"]["default"] == 2
    given = build_recipe(base | {"num_experts": 4, "moe_router_topk": 1}, source="t").model
    assert given.moe_router_topk == 1
    dense = build_recipe(base, source="t").model
    assert dense.moe_router_topk == 0 and model_flags(dense)["--moe-router-topk"] is None
    with pytest.raises(ConfigError, match=r"^t: moe_router_topk set but num_experts is 0$"):
        build_recipe(base | {"moe_router_topk": 2}, source="t")
    with pytest.raises(ConfigError, match="moe_router_topk 0 must be between 1 and num_experts 4"):
        build_recipe(base | {"num_experts": 4, "moe_router_topk": 0}, source="t")


def test_uniform_recompute_of_more_than_one_layer_with_mtp_is_refused_as_megatron_core_asserts():
    recipe = load_recipe_file("configs/tiny_moe_mtp.yaml")
    uniform = ["--recompute-granularity", "full", "--recompute-method", "uniform"]
    with pytest.raises(ConfigError, match="'recompute_num_layers must be 1 for MTP recompute'"):
        replace(recipe, megatron_args=(*uniform, "--recompute-num-layers", "2"))
    one = replace(recipe, megatron_args=(*uniform, "--recompute-num-layers", "1"))
    assert one.flags.memory.recompute_num_layers == 1
    dense = replace(recipe, model=replace(recipe.model, mtp_num_layers=0))
    assert replace(dense, megatron_args=(*uniform, "--recompute-num-layers", "2")).flags


def test_a_recompute_rule_of_an_fp8_recipe_the_job_leaves_to_its_environment_is_not_applied():
    """``--fp8-recipe $FP8_RECIPE`` from a file the reader did not read: delayed scaling's rule
    against layernorm recompute cannot be judged, so the recipe loads (a run asks for the value)."""
    recipe = load_recipe_file("configs/tiny_moe_mtp.yaml")
    flags = ("--fp8-format", "e4m3", "--recompute-granularity", "selective",
             "--recompute-modules", "layernorm")  # fmt: skip
    with pytest.raises(ConfigError, match="delayed scaling does not support"):
        replace(recipe, megatron_args=flags)
    unknown = UnresolvedArgument(
        "--fp8-recipe", "--fp8-recipe $FP8_RECIPE", "s.sh:3", "$FP8_RECIPE"
    )
    loaded = replace(recipe, megatron_args=flags, unresolved_arguments=(unknown,))
    assert loaded.flags.memory.selective == {"layernorm"}
