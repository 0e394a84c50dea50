"""The model fields: a model given only its required fields is ModelSpec's defaults, a model
written as its flags reads back as the same model (Megatron's argparse judging the words),
``--moe-layer-freq`` round-trips, and a bad value is one line naming the field."""

from __future__ import annotations

import shlex
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ray_layout.errors import ConfigError
from ray_layout.model.fields import (
    FIELD,
    MAX_DIMENSION,
    MAX_LAYERS,
    MODEL_FIELDS,
    ModelSpec,
    checked,
    model_flags,
    moe_layer_freq_flag,
    take,
)
from ray_layout.model.hf_config import load_hf_config
from ray_layout.model.megatron_recipe import load_megatron_command_line
from ray_layout.model.moe_layer_freq import parse_moe_layer_freq
from ray_layout.model.spec import build_recipe, load_recipe_file
from tests.helpers.megatron_arguments_oracle import parse_megatron_args
from tests.helpers.megatron_oracle import MEGATRON_CPU_WARNINGS
from tests.helpers.paths import HF_CONFIGS


def test_a_model_given_only_its_required_fields_has_model_specs_defaults():
    """The loaders' defaults are the model's own: build_recipe fills in what ModelSpec does, but
    for what it works out from the given fields."""
    given = {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 32}
    given |= {"vocab_size": 100}
    derived = {"ffn_hidden_size": 128, "num_query_groups": 4, "kv_channels": 16}
    model = build_recipe(given, source="c.yaml").model
    assert model == ModelSpec(**given, **derived, moe_layer_pattern=(False, False))


def words(flags: dict[str, object]) -> list[str]:
    """``model_flags`` as a command line: True a bare switch, False or None no flag."""
    out: list[str] = []
    for flag, value in flags.items():
        if value is True:
            out.append(flag)
        elif value is not None and value is not False:
            out += [flag, str(value)]
    return out


SMALL_DENSE = ModelSpec(
    name="dense",
    num_layers=4,
    hidden_size=256,
    num_attention_heads=8,
    ffn_hidden_size=1024,
    num_query_groups=8,
    kv_channels=32,
    seq_length=512,
    vocab_size=1000,
    swiglu=False,
    normalization="LayerNorm",
    add_bias_linear=True,
    position_embedding_type="learned_absolute",
    max_position_embeddings=1024,
    moe_layer_pattern=(False,) * 4,
)
MODELS = [
    SMALL_DENSE,
    *(
        load_hf_config(HF_CONFIGS / name / "config.json").model
        for name in ("DeepSeek-V3", "Qwen3-30B-A3B", "Mixtral-8x7B-v0.1", "OLMoE-1B-7B-0924")
    ),
]


MEGATRON = [pytest.mark.megatron, *(pytest.mark.filterwarnings(w) for w in MEGATRON_CPU_WARNINGS)]


@pytest.mark.parametrize("model", [pytest.param(m, id=m.name, marks=MEGATRON) for m in MODELS])
def test_a_model_written_as_its_flags_reads_back_as_itself(model):
    """Megatron's own parser (the oracle's, megatron-core's enums) takes every word."""
    argv = words(model_flags(model))
    parse_megatron_args(argv)
    got = load_megatron_command_line(shlex.join(argv)).model  # as a shell would be given it
    assert got == replace(model, name=got.name)


def test_flags_follow_the_table_order_and_leave_out_what_is_unset():
    flags = model_flags(SMALL_DENSE)
    assert list(flags) == [f.flag for f in MODEL_FIELDS if f.flag]
    assert flags["--disable-bias-linear"] is False  # negated: the model has biases
    assert flags["--group-query-attention"] is False and flags["--num-query-groups"] is None
    assert flags["--num-experts"] is None and flags["--moe-layer-freq"] is None  # omit_zero
    assert flags["--kv-lora-rank"] is None  # an MLA field of a model without MLA


@given(st.lists(st.booleans(), min_size=1, max_size=80))
def test_moe_layer_freq_round_trips_through_megatrons_expression(pattern):
    text = moe_layer_freq_flag(pattern)
    assert parse_moe_layer_freq(text, len(pattern), source="c.yaml") == tuple(pattern)


def test_moe_layer_freq_is_an_int_where_one_says_it():
    assert moe_layer_freq_flag([True] * 4) == "1"
    assert moe_layer_freq_flag([True, False] * 3) == "2"
    assert moe_layer_freq_flag([False] * 3 + [True] * 58) == "([0]*3+[1]*58)"


@pytest.mark.parametrize(
    ("value", "kind", "message"),
    [
        ("8", int, "x.yaml: hidden_size must be an integer, got '8'"),
        (True, int, "x.yaml: hidden_size must be an integer, got True"),
        (2.5, int, "x.yaml: hidden_size must be an integer, got 2.5"),
        (MAX_DIMENSION + 1, int, f"must be <= {MAX_DIMENSION:,}, got {MAX_DIMENSION + 1}"),
        (10**40, int, "must be <= 16,777,216, got a 133-bit number"),
        (-(10**40), int, "got a 133-bit number"),
        (0, int, "x.yaml: hidden_size must be >= 1, got 0"),
        ("yes", bool, "x.yaml: hidden_size must be true or false, got 'yes'"),
        (1, bool, "must be true or false, got 1"),
        (3, str, "x.yaml: hidden_size must be a string, got 3"),
    ],
)
def test_checked_values_are_one_line_errors_naming_the_field(value, kind, message):
    with pytest.raises(ConfigError) as info:
        checked("hidden_size", value, kind, source="x.yaml", minimum=1)
    assert str(info.value).startswith("x.yaml: hidden_size must be ")
    assert message in str(info.value) and "\n" not in str(info.value)


def test_checked_takes_an_integral_float_as_an_int():
    value = checked("num_layers", 8.0, int, source="x", minimum=1)
    assert value == 8 and type(value) is int


def test_a_name_is_kept_printable_wherever_a_loader_gives_it(tmp_path):
    """A config's name is printed in every table and note: a terminal's escape sequence in it is
    shown as its escape, never acted on."""
    assert checked("name", "a\x1b[31mb\rc", str, source="x") == "a\\x1b[31mb\\rc"
    config = tmp_path / "c.yaml"
    config.write_text(
        'name: "evil\\x1b[31m\\rname"\nnum_layers: 2\nhidden_size: 64\nnum_attention_heads: 4\n'
        "seq_length: 128\nvocab_size: 1000\n"
    )
    assert load_recipe_file(config).model.name == "evil\\x1b[31m\\rname"


def test_take_gives_defaults_and_refuses_a_missing_or_non_positive_required_field():
    assert take({}, "swiglu", source="x") is True  # the table's default
    assert take({"swiglu": None}, "make_vocab_size_divisible_by", source="x") == 128
    assert take({}, "ffn_hidden_size", source="x") is None  # derived by build_recipe
    assert take({}, "num_experts", source="x", default=5) == 5
    with pytest.raises(ConfigError, match=r"^x: missing required field num_layers$"):
        take({}, "num_layers", source="x")
    with pytest.raises(ConfigError, match=r"^x: num_layers must be positive, got 0$"):
        take({"num_layers": 0}, "num_layers", source="x")
    with pytest.raises(ConfigError, match=f"num_layers must be <= {MAX_LAYERS:,}"):
        take({"num_layers": MAX_LAYERS + 1}, "num_layers", source="x")
    assert FIELD["num_layers"].required and not FIELD["swiglu"].required
