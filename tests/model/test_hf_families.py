"""gpt-oss, Llama 4 and MiniMax-M2 read from their ``config.json``: the published totals, the
fields and Megatron flags each family trains with, the one-line notes and errors, and scaled-down
configs of each built by megatron-core on the CPU."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ray_layout.errors import ConfigError
from ray_layout.model import sizing
from ray_layout.model.hf_config import load_hf_config
from ray_layout.model.hf_families import _every, _pattern_flag
from ray_layout.model.moe_layer_freq import parse_moe_layer_freq
from ray_layout.model.spec import build_parallel
from tests.helpers.megatron_oracle import (
    MEGATRON_CPU_WARNINGS,
    megatron_core_takes,
    megatron_cpu_world,
)
from tests.helpers.model_hf_configs import HF, config

GPT_OSS_120B = HF / "gpt-oss-120b" / "config.json"
SCOUT = HF / "Llama-4-Scout-17B-16E" / "config.json"
MAVERICK = HF / "Llama-4-Maverick-17B-128E" / "config.json"
MINIMAX_M2 = HF / "MiniMax-M2" / "config.json"


# (file, published total, tolerance, published active, the count of the card's convention)
PUBLISHED = {
    # gpt-oss model card: 116.83B / 5.13B and 20.91B / 3.61B, the output layer counted as active
    "gpt-oss-120b": (116.83e9, 0.03, 5.13e9, "active_without_input_embedding"),
    "gpt-oss-20b": (20.91e9, 0.015, 3.61e9, "active_without_input_embedding"),
    # Meta: 109B / 17B and 400B / 17B (the totals with the vision encoder, not read here)
    "Llama-4-Scout-17B-16E": (109e9, 0.015, 17e9, "active"),
    "Llama-4-Maverick-17B-128E": (400e9, 0.015, 17e9, "active"),
    # MiniMax: 230B / 10B, embeddings left out of the active count
    "MiniMax-M2": (230e9, 0.015, 10e9, "active_without_embedding_and_output"),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_published_totals_and_active_counts(name):
    total, tolerance, active, convention = PUBLISHED[name]
    counts = sizing.parameter_count(load_hf_config(HF / name / "config.json").model)
    assert counts.total == pytest.approx(total, rel=tolerance)
    if name.startswith("gpt-oss"):  # published to two decimals
        assert round(getattr(counts, convention) / 1e9, 2) == active / 1e9
    else:  # published in whole billions
        assert round(getattr(counts, convention) / 1e9) == active / 1e9


def test_gpt_oss_reads_as_a_biased_quick_geglu_moe_with_sinks():
    model = load_hf_config(GPT_OSS_120B).model
    assert (model.num_layers, model.hidden_size, model.num_attention_heads) == (36, 2880, 64)
    assert (model.num_query_groups, model.kv_channels, model.vocab_size) == (8, 64, 201088)
    assert (model.num_experts, model.moe_router_topk, model.moe_ffn_hidden_size) == (128, 4, 2880)
    assert model.quick_geglu and not model.swiglu and model.gated_linear_unit
    assert model.add_bias_linear and model.softmax_type == "learnable"
    assert all(model.moe_layer_pattern) and model.untie_embeddings_and_output_weights


def test_gpt_oss_trains_with_its_window_clamp_and_offset():
    flags = load_hf_config(GPT_OSS_120B).megatron_args
    text = " ".join(flags)
    assert "--glu-linear-offset 1.0 --activation-func-clamp-value 7.0" in text
    assert "--window-size 127,0 --window-attn-skip-freq 2" in text  # 128 tokens, self included
    assert "--moe-router-score-function softmax" in text and "--rotary-base 150000" in text
    assert "--moe-router-pre-softmax" not in text  # the softmax of the top-4 logits


def test_gpt_oss_without_layer_types_or_window():
    raw = config("gpt-oss-20b")
    del raw["layer_types"]  # GptOssConfig's default: sliding on even layers
    assert "--window-attn-skip-freq 2" in " ".join(load_hf_config(raw).megatron_args)
    raw["layer_types"] = ["full_attention"] * 3 + ["sliding_attention"] * 21
    assert "--window-attn-skip-freq ([0]*3+[1]*21)" in " ".join(load_hf_config(raw).megatron_args)
    raw["sliding_window"] = None
    assert "--window-size" not in load_hf_config(raw).megatron_args


def test_llama4_reads_its_text_config_with_interleaved_moe_and_shared_expert():
    recipe = load_hf_config(MAVERICK)
    model = recipe.model
    assert model.name == "Llama-4-Maverick-17B-128E"
    assert model.moe_layer_pattern == (False, True) * 24  # moe_layers 1, 3, ..., 47
    assert (model.ffn_hidden_size, model.moe_ffn_hidden_size) == (16384, 8192)
    assert model.moe_shared_expert_intermediate_size == 8192 and model.moe_router_topk == 1
    assert not model.qk_layernorm  # Llama 4's QK norm is an L2 norm without parameters
    text = " ".join(recipe.megatron_args)
    assert "--moe-router-score-function sigmoid" in text
    assert "--moe-apply-probs-on-input --no-rope-freq 4" in text  # NoPE on every 4th layer
    assert "--qk-l2-norm" not in text  # Maverick's use_qk_norm is false
    scout = " ".join(load_hf_config(SCOUT).megatron_args)
    assert "--qk-l2-norm" in scout and "--use-rope-scaling --rope-scaling-factor 16.0" in scout


def test_llama4_text_alone_and_the_interleave_step():
    text = json.loads(MAVERICK.read_text())["text_config"] | {"moe_layers": None}
    model = load_hf_config(text | {"interleave_moe_layer_step": 4}).model
    assert [i for i, moe in enumerate(model.moe_layer_pattern) if moe] == list(range(3, 48, 4))
    assert load_hf_config(text).model.moe_layer_pattern == (False, True) * 24


def test_minimax_m2_routes_by_sigmoid_with_bias_and_ropes_half_of_each_head():
    recipe = load_hf_config(MINIMAX_M2)
    model = recipe.model
    assert (model.num_experts, model.moe_router_topk, model.moe_ffn_hidden_size) == (256, 8, 1536)
    assert model.qk_layernorm and model.moe_shared_expert_intermediate_size == 0
    text = " ".join(recipe.megatron_args)
    assert "--moe-router-score-function sigmoid --moe-router-enable-expert-bias" in text
    assert "--rotary-base 5000000 --rotary-percent 0.5 --norm-epsilon 1e-06" in text
    unbiased = load_hf_config(config("MiniMax-M2") | {"use_routing_bias": False})
    assert "--moe-router-enable-expert-bias" not in unbiased.megatron_args


@pytest.mark.parametrize(
    ("path", "named"),
    [
        (GPT_OSS_120B, "sliding window on 18 of 36 layers and its attention sinks"),
        (SCOUT, "chunked attention (8192 tokens on its RoPE layers)"),
        (MINIMAX_M2, "QK norm spans all heads"),
    ],
)
def test_what_is_not_modelled_is_one_note_naming_it(path, named):
    notes = load_hf_config(path).notes
    assert len(notes) == 1 and "\n" not in notes[0] and named in notes[0]


@pytest.mark.parametrize(
    ("name", "change", "message"),
    [
        ("gpt-oss-20b", {"attention_bias": False}, "attention_bias false: Megatron's --add-bias"),
        ("gpt-oss-20b", {"layer_types": ["full_attention"]}, "layer_types must be a list of 24"),
        ("gpt-oss-20b", {"layer_types": ["local"] * 24}, "layer_types entries must be sliding"),
        ("gpt-oss-20b", {"num_experts_per_tok": 64}, "num_experts_per_tok 64 is more than"),
        ("MiniMax-M2", {"attn_type_list": [0] + [1] * 61}, "layer 0 .* lightning"),
        ("MiniMax-M2", {"use_qk_norm": "yes"}, "use_qk_norm must be true or false"),
        ("MiniMax-M2", {"use_mtp": 1}, "use_mtp must be true or false"),
        ("MiniMax-M2", {"num_mtp_modules": -1}, "num_mtp_modules must be >= 0"),
        ("MiniMax-M2", {"mtp_transformer_layers": 0}, "mtp_transformer_layers must be >= 1"),
        ("Llama-4-Scout-17B-16E", {"text_config": [1]}, "text_config must be a mapping"),
    ],
)
def test_bad_keys_are_one_line_errors_naming_them(name, change, message):
    with pytest.raises(ConfigError, match=message) as error:
        load_hf_config(config(name) | change)
    assert "\n" not in str(error.value)


def test_minimax_m2_leaves_its_mtp_modules_out_as_its_release_and_total_do():
    """The released checkpoint has no MTP weights and 230B counts none: with Megatron's three
    MTP layers the total would be 4% over it, without them it is within 1.5%."""
    recipe = load_hf_config(MINIMAX_M2)
    assert recipe.model.mtp_num_layers == 0
    assert "--mtp-num-layers" not in recipe.megatron_args
    assert "its 3 MTP modules (one layer each) are left out" in recipe.notes[0]
    with_mtp = dataclasses.replace(recipe.model, mtp_num_layers=3)
    assert sizing.parameter_count(with_mtp).total_with_everything > 230e9 * 1.04
    deeper = load_hf_config(config("MiniMax-M2") | {"mtp_transformer_layers": 2}).notes[0]
    assert "its 3 MTP modules (2 layers each)" in deeper
    for change in ({"use_mtp": False}, {"num_mtp_modules": 0}, {"use_mtp": None}):
        assert "MTP" not in load_hf_config(config("MiniMax-M2") | change).notes[0]


def test_llama4_notes_its_qk_norm_on_rope_layers_and_rope_scaling_factors():
    """transformers builds Llama 4's L2 QK norm on the RoPE layers only, megatron-core's
    --qk-l2-norm on every layer; Megatron's llama3 scaling fixes low/high 1 and 4 (Scout: 1, 1)."""
    scout = load_hf_config(SCOUT)
    assert "its L2 QK norm, on its 36 RoPE layers only, is applied on all 48" in scout.notes[0]
    assert "high_freq_factor 1 (Megatron's is 4) has no Megatron flag" in scout.notes[0]
    assert "low_freq_factor" not in scout.notes[0]  # Scout's 1 is Megatron's
    assert "--qk-l2-norm" in scout.megatron_args
    maverick = load_hf_config(MAVERICK).notes[0]  # use_qk_norm false, no rope_scaling
    assert "QK norm" not in maverick and "RoPE scaling" not in maverick
    raw = config("Llama-4-Scout-17B-16E")
    text = raw["text_config"]
    scaling = text["rope_scaling"] | {"high_freq_factor": 4.0}
    everywhere = text | {"no_rope_layers": [1] * 48, "rope_scaling": scaling}
    notes = load_hf_config(raw | {"text_config": everywhere}).notes[0]
    assert "QK norm" not in notes and "RoPE scaling" not in notes
    scaling = text["rope_scaling"] | {"original_max_position_embeddings": 4096}
    notes = load_hf_config(raw | {"text_config": text | {"rope_scaling": scaling}}).notes[0]
    assert "original_max_position_embeddings 4096 (Megatron's is 8192)" in notes


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"rope_scaling": {"rope_type": "llama3", "factor": 16.0, "high_freq_factor": "1"}},
            "rope_scaling high_freq_factor must be a finite number",
        ),
        (
            {"moe_layers": [48]},
            r"text_config: moe_layers entry 48 is not a layer of the 48 \(0 to 47\)",
        ),
        ({"no_rope_layers": [1] * 3}, "no_rope_layers must be a list of 48"),
        ({"attention_bias": True}, "attention_bias true: Megatron has no bias"),
    ],
)
def test_llama4_text_config_errors_name_where(change, message):
    raw = config("Llama-4-Scout-17B-16E")
    raw["text_config"] = raw["text_config"] | change
    with pytest.raises(ConfigError, match=message):
        load_hf_config(raw)


@given(st.lists(st.booleans(), min_size=1, max_size=64))
def test_layer_patterns_mean_what_megatron_reads(marked):
    """The window and NoPE patterns, int or list, select the layers Megatron selects."""
    for layer_is_marked in (lambda number, n: number % n != 0, lambda number, n: number % n == 0):
        every = _every(marked, layer_is_marked)
        text = _pattern_flag(marked, every)
        if every is None:
            assert parse_moe_layer_freq(text, len(marked), source="t") == tuple(marked)
        else:
            assert [layer_is_marked(i + 1, every) for i in range(len(marked))] == marked


@given(st.integers(1, 12), st.integers(1, 6))
def test_llama4_moe_layers_follow_the_interleave_step(layers, step):
    raw = config("Llama-4-Scout-17B-16E")["text_config"] | {"num_hidden_layers": layers}
    raw |= {"moe_layers": None, "no_rope_layers": None, "interleave_moe_layer_step": step}
    pattern = load_hf_config(raw).model.moe_layer_pattern
    assert [i for i, moe in enumerate(pattern) if moe] == list(range(step - 1, layers, step))


# --- Scaled down, against megatron-core's own GPTModel ---------------------------------------

SMALL = {
    "gpt_oss": {
        "model_type": "gpt_oss", "num_hidden_layers": 2, "hidden_size": 64,
        "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 16,
        "intermediate_size": 48, "num_local_experts": 4, "num_experts_per_tok": 2,
        "sliding_window": 16, "vocab_size": 1024, "max_position_embeddings": 256,
    },
    "llama4": {
        "model_type": "llama4", "vision_config": {"hidden_size": 8},
        "text_config": {
            "num_hidden_layers": 4, "hidden_size": 64, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 32, "intermediate_size": 32,
            "intermediate_size_mlp": 128, "num_local_experts": 4, "num_experts_per_tok": 1,
            "interleave_moe_layer_step": 2, "vocab_size": 1000, "max_position_embeddings": 256,
        },
    },
    "minimax_m2": {
        "model_type": "minimax_m2", "num_hidden_layers": 2, "hidden_size": 64,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
        "intermediate_size": 32, "num_local_experts": 8, "num_experts_per_tok": 2,
        "rotary_dim": 16, "use_routing_bias": True, "vocab_size": 1024,
        "max_position_embeddings": 256,
    },
}  # fmt: skip

MEGATRON = [pytest.mark.megatron, *(pytest.mark.filterwarnings(w) for w in MEGATRON_CPU_WARNINGS)]


def _as_megatron_reads(settings: dict) -> dict:
    """The derived flags' values as Megatron-LM's argument types make them (``tuple_type``,
    ``moe_freq_type`` and ``no_rope_freq_type``)."""
    out = dict(settings)
    if "window_size" in out:
        out["window_size"] = tuple(int(x) for x in out["window_size"].split(","))
    for key in ("window_attn_skip_freq", "no_rope_freq"):
        if key in out:
            out[key] = int(out[key])
    return out


@pytest.fixture(scope="module")
def megatron_world():
    with megatron_cpu_world():
        yield


@pytest.mark.parametrize("name", [pytest.param(name, marks=MEGATRON) for name in sorted(SMALL)])
def test_small_configs_match_megatron_core(name, megatron_world):
    """megatron-core's GPTModel holds the count, and its TransformerConfig takes the derived
    settings (window, sinks' clamp and offset, NoPE layers, probabilities on the input)."""
    megatron_core_takes(load_hf_config(SMALL[name]), name, _as_megatron_reads)


@pytest.mark.parametrize(
    ("path", "sizes"),
    [
        pytest.param(GPT_OSS_120B, {"tp": 2, "pp": 4, "ep": 8, "dp": 4}, marks=MEGATRON),
        pytest.param(SCOUT, {"tp": 2, "pp": 4, "ep": 8, "dp": 4}, marks=MEGATRON),
        pytest.param(MAVERICK, {"tp": 2, "pp": 4, "ep": 8, "dp": 4}, marks=MEGATRON),
        pytest.param(MINIMAX_M2, {"tp": 2, "pp": 2, "ep": 8, "dp": 4}, marks=MEGATRON),
    ],
)
def test_each_familys_rank_command_line_is_one_megatron_accepts(path, sizes):
    from launchers.megatron import MegatronRunSettings, megatron_arguments
    from tests.helpers.megatron_arguments_oracle import (
        parse_megatron_args,
        validate_megatron_args,
    )

    recipe = load_hf_config(path)
    recipe = dataclasses.replace(recipe, parallel=build_parallel(recipe.model, sizes))
    argv = megatron_arguments(recipe, None, MegatronRunSettings()).argv
    args = validate_megatron_args(parse_megatron_args(argv), recipe.parallel.world_size)
    assert args.quick_geglu == recipe.model.quick_geglu
    assert args.softmax_type == recipe.model.softmax_type


# --- The count of the modules transformers builds, typed in from its modeling code -------------


def _transformers_gpt_oss(c: dict) -> int:
    """GptOssForCausalLM: q/k/v/o with biases, sinks, a biased router, experts with biased
    gate_up (2 x ffn) and down projections, two norms a layer, final norm, untied lm_head."""
    h, d, heads, kv = (
        c["hidden_size"],
        c["head_dim"],
        c["num_attention_heads"],
        c["num_key_value_heads"],
    )
    e, f = c["num_local_experts"], c["intermediate_size"]
    attention = h * d * (heads + 2 * kv) + d * (heads + 2 * kv) + heads * d * h + h + heads
    experts = e * (h * 2 * f + 2 * f + f * h + h)
    layer = attention + (e * h + e) + experts + 2 * h
    return c["num_hidden_layers"] * layer + h + 2 * c["vocab_size"] * h


def _transformers_llama4_text(c: dict, moe_layers: set[int]) -> int:
    """Llama4ForCausalLM: q/k/v/o, MoE layers with a router, routed experts and a shared expert of
    intermediate_size, dense layers of intermediate_size_mlp, two norms a layer."""
    h, d, heads, kv = (
        c["hidden_size"],
        c["head_dim"],
        c["num_attention_heads"],
        c["num_key_value_heads"],
    )
    attention = h * d * (heads + 2 * kv) + heads * d * h
    expert = 3 * h * c["intermediate_size"]
    moe = c["num_local_experts"] * (h + expert) + expert
    dense = 3 * h * c["intermediate_size_mlp"]
    total = sum(attention + 2 * h + (moe if i in moe_layers else dense)
                for i in range(c["num_hidden_layers"]))  # fmt: skip
    return total + h + 2 * c["vocab_size"] * h


@given(
    layers=st.integers(1, 6),
    heads=st.sampled_from([2, 4, 8]),
    groups=st.sampled_from([1, 2]),
    experts=st.integers(2, 8),
    ffn=st.integers(1, 64),
)
def test_gpt_oss_counts_what_transformers_builds(layers, heads, groups, experts, ffn):
    raw = SMALL["gpt_oss"] | {
        "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": groups,
        "num_local_experts": experts, "num_experts_per_tok": 2, "intermediate_size": ffn,
        "vocab_size": 1024,
    }  # fmt: skip
    assert sizing.parameter_count(load_hf_config(raw).model).total == _transformers_gpt_oss(raw)


@given(layers=st.integers(1, 8), step=st.integers(1, 4), experts=st.integers(1, 6))
def test_llama4_counts_what_transformers_builds(layers, step, experts):
    text = SMALL["llama4"]["text_config"] | {
        "num_hidden_layers": layers, "interleave_moe_layer_step": step,
        "num_local_experts": experts, "vocab_size": 1024,
    }  # fmt: skip
    moe_layers = set(range(step - 1, layers, step))
    model = load_hf_config(SMALL["llama4"] | {"text_config": text}).model
    assert sizing.parameter_count(model).total == _transformers_llama4_text(text, moe_layers)


def test_minimax_m2_counts_what_transformers_builds_but_its_qk_norm():
    """MiniMaxM2ForCausalLM's q_norm and k_norm span all heads (heads x head_dim, kv x head_dim);
    Megatron's per-head norms hold head_dim each: the note's difference, and nothing else."""
    c = SMALL["minimax_m2"]
    h, d, heads, kv = (
        c["hidden_size"],
        c["head_dim"],
        c["num_attention_heads"],
        c["num_key_value_heads"],
    )
    e, f = c["num_local_experts"], c["intermediate_size"]
    layer = h * d * (heads + 2 * kv) + heads * d * h + (heads + kv) * d + e * h + e * 3 * h * f
    hf = c["num_hidden_layers"] * (layer + 2 * h) + h + 2 * c["vocab_size"] * h
    counted = sizing.parameter_count(load_hf_config(c).model).total
    assert hf - counted == c["num_hidden_layers"] * (heads + kv - 2) * d
