"""Hugging Face config.json files of real MoE models, mapped onto Megatron's model fields (the
flags that train them as released: test_hf_flags.py)."""

from __future__ import annotations

import time

import pytest

from ray_layout.errors import ConfigError
from ray_layout.model import sizing
from ray_layout.model.fields import MLAConfig, ModelSpec
from ray_layout.model.hf_config import load_hf_config
from tests.helpers.megatron_oracle import (
    MEGATRON_CPU_WARNINGS,
    megatron_core_takes,
    megatron_cpu_world,
)
from tests.helpers.model_hf_configs import GLM45, GLM45_AIR, HF, KIMI_K2, SMALL, config, real


def test_deepseek_v3():
    recipe = load_hf_config(HF / "DeepSeek-V3" / "config.json")
    assert recipe.model == ModelSpec(
        name="DeepSeek-V3",
        num_layers=61,
        hidden_size=7168,
        num_attention_heads=128,
        ffn_hidden_size=18432,
        num_query_groups=128,
        kv_channels=56,
        seq_length=4096,
        vocab_size=129280,
        make_vocab_size_divisible_by=128,
        swiglu=True,
        normalization="RMSNorm",
        add_bias_linear=False,
        add_qkv_bias=False,
        qk_layernorm=True,
        position_embedding_type="rope",
        max_position_embeddings=0,
        untie_embeddings_and_output_weights=True,
        num_experts=256,
        moe_ffn_hidden_size=2048,
        moe_router_topk=8,
        moe_shared_expert_intermediate_size=2048,
        moe_layer_pattern=(False,) * 3 + (True,) * 58,
        mtp_num_layers=1,
        mla=MLAConfig(
            q_lora_rank=1536,
            kv_lora_rank=512,
            qk_head_dim=128,
            qk_pos_emb_head_dim=64,
            v_head_dim=128,
        ),
    )
    assert recipe.model.mtp_layer_is_moe


def test_qwen3_30b_a3b():
    model = load_hf_config(HF / "Qwen3-30B-A3B" / "config.json").model
    assert model == ModelSpec(
        name="Qwen3-30B-A3B",
        num_layers=48,
        hidden_size=2048,
        num_attention_heads=32,
        ffn_hidden_size=6144,
        num_query_groups=4,
        kv_channels=128,  # head_dim, not hidden / heads = 64
        seq_length=4096,
        vocab_size=151936,
        qk_layernorm=True,
        untie_embeddings_and_output_weights=True,
        num_experts=128,
        moe_ffn_hidden_size=768,
        moe_router_topk=8,
        moe_layer_pattern=(True,) * 48,
    )


def test_mixtral_8x7b():
    model = load_hf_config(HF / "Mixtral-8x7B-v0.1" / "config.json").model
    assert model == ModelSpec(
        name="Mixtral-8x7B-v0.1",
        num_layers=32,
        hidden_size=4096,
        num_attention_heads=32,
        ffn_hidden_size=14336,
        num_query_groups=8,
        kv_channels=128,
        seq_length=4096,
        vocab_size=32000,
        untie_embeddings_and_output_weights=True,
        num_experts=8,
        moe_ffn_hidden_size=14336,  # Mixtral's intermediate_size is the expert FFN
        moe_router_topk=2,
        moe_layer_pattern=(True,) * 32,
    )


def test_olmoe_1b_7b():
    model = load_hf_config(HF / "OLMoE-1B-7B-0924" / "config.json").model
    assert model == ModelSpec(
        name="OLMoE-1B-7B-0924",
        num_layers=16,
        hidden_size=2048,
        num_attention_heads=16,
        ffn_hidden_size=1024,
        num_query_groups=16,
        kv_channels=128,
        seq_length=4096,
        vocab_size=50304,
        qk_layernorm=True,
        untie_embeddings_and_output_weights=True,
        num_experts=64,
        moe_ffn_hidden_size=1024,
        moe_router_topk=8,
        moe_layer_pattern=(True,) * 16,
    )


def test_seq_length_override_and_default_parallel_sizes():
    recipe = load_hf_config(HF / "DeepSeek-V3" / "config.json", seq_length=4096)
    assert recipe.model.seq_length == 4096
    assert recipe.parallel.world_size == 1


def test_mapping_with_source_and_name_or_path():
    raw = config("Mixtral-8x7B-v0.1") | {"_name_or_path": "mistralai/Mixtral-8x7B-v0.1"}
    assert load_hf_config(raw, source="mixtral").model.name == "Mixtral-8x7B-v0.1"
    assert load_hf_config(config("OLMoE-1B-7B-0924")).model.name == "olmoe"


def test_a_name_with_terminal_escapes_is_kept_printable():
    """A name reaches the terminal in every table and note: its escapes are shown, not acted on."""
    raw = config("Mixtral-8x7B-v0.1") | {"_name_or_path": "org/\x1b[31mevil\rname\x07"}
    recipe = load_hf_config(raw | {"rope_scaling": {"rope_type": "longrope", "factor": 4.0}})
    assert recipe.model.name == "\\x1b[31mevil\\rname\\x07"
    assert recipe.notes[0].startswith("\\x1b[31mevil\\rname\\x07: its longrope RoPE scaling")
    assert all(c.isprintable() for c in recipe.model.name + recipe.notes[0])


def test_numbers_too_large_for_a_float_are_one_line_naming_the_key():
    for key in ("rope_theta", "rms_norm_eps", "routed_scaling_factor"):
        with pytest.raises(ConfigError) as info:
            load_hf_config(config("DeepSeek-V3") | {key: int("9" * 400)}, source="c.json")
        assert str(info.value) == f"c.json: {key} must be at most 1e+12, got a 1329-bit number"
    scaling = {"type": "yarn", "factor": 40, "mscale": float("inf")}
    with pytest.raises(ConfigError, match=r"^c\.json: rope_scaling mscale must be a finite number"):
        load_hf_config(config("DeepSeek-V3") | {"rope_scaling": scaling}, source="c.json")


def test_deepseek_layer_freq_counts_from_layer_zero():
    raw = config("DeepSeek-V3") | {"num_hidden_layers": 8, "moe_layer_freq": 2}
    pattern = load_hf_config(raw).model.moe_layer_pattern
    assert pattern == (False, False, False, False, True, False, True, False)


def test_deepseek_v2_lite_without_q_lora_and_with_two_shared_experts():
    raw = config("DeepSeek-V3") | {
        "model_type": "deepseek_v2",
        "q_lora_rank": None,
        "n_shared_experts": 2,
        "first_k_dense_replace": 1,
        "num_nextn_predict_layers": None,
    }
    model = load_hf_config(raw).model
    assert model.mla.q_lora_rank is None
    assert model.moe_shared_expert_intermediate_size == 2 * 2048
    assert model.moe_layer_pattern == (False,) + (True,) * 60
    assert model.mtp_num_layers == 0


def test_qwen_sparse_step_and_mlp_only_layers():
    raw = config("Qwen3-30B-A3B") | {
        "num_hidden_layers": 6,
        "decoder_sparse_step": 2,
        "mlp_only_layers": [3],
    }
    assert load_hf_config(raw).model.moe_layer_pattern == (False, True, False, False, False, True)


def test_qwen2_moe_shared_expert_and_qkv_bias():
    raw = config("Qwen3-30B-A3B") | {
        "model_type": "qwen2_moe",
        "shared_expert_intermediate_size": 5632,
    }
    model = load_hf_config(raw).model
    assert model.moe_shared_expert_intermediate_size == 5632
    assert model.add_qkv_bias and not model.qk_layernorm


def test_dense_llama_with_tied_embeddings():
    raw = {
        "model_type": "llama",
        "num_hidden_layers": 16,
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "vocab_size": 128256,
        "max_position_embeddings": 131072,
        "tie_word_embeddings": True,
        "rope_scaling": {"rope_type": "llama3", "factor": 32.0},
    }
    model = load_hf_config(raw).model
    assert model.num_experts == 0 and model.num_moe_layers == 0
    assert model.num_query_groups == 8
    assert not model.untie_embeddings_and_output_weights


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"model_type": "gpt2"}, "model_type 'gpt2' is not supported (deepseek_v2, deepseek_v3,"),
        ({"model_type": None}, "model_type None is not supported"),
        ({"model_type": ["mixtral"]}, "model_type ['mixtral'] is not supported"),
        ({"hidden_size": None}, "missing key hidden_size"),
        ({"num_local_experts": None}, "missing key num_local_experts"),
        ({"num_experts_per_tok": 9}, "num_experts_per_tok 9 is more than num_local_experts 8"),
        ({"num_hidden_layers": "32"}, "num_hidden_layers must be an integer, got '32'"),
        ({"num_key_value_heads": 0}, "num_key_value_heads must be >= 1, got 0"),
        ({"hidden_act": "gelu"}, "hidden_act 'gelu' is not supported"),
        ({"tie_word_embeddings": "no"}, "tie_word_embeddings must be true or false"),
    ],
)
def test_errors_name_the_key(change, message):
    with pytest.raises(ConfigError) as info:
        load_hf_config(config("Mixtral-8x7B-v0.1") | change)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("name", "change", "message"),
    [
        ("DeepSeek-V3", {"moe_layer_freq": 0}, "moe_layer_freq must be >= 1, got 0"),
        ("DeepSeek-V3", {"kv_lora_rank": None}, "missing key kv_lora_rank"),
        ("Qwen3-30B-A3B", {"mlp_only_layers": "3"}, "mlp_only_layers must be a list of layer"),
        ("Qwen3-30B-A3B", {"mlp_only_layers": False}, "mlp_only_layers must be a list of layer"),
        ("Qwen3-30B-A3B", {"mlp_only_layers": [48]}, "entry 48 is not a layer of the 48 .0 to 47"),
        ("Qwen3-30B-A3B", {"mlp_only_layers": [-1]}, "entry -1 is not a layer"),
        ("DeepSeek-V3", {"num_nextn_predict_layers": 10**9}, "must be <= 1,024, got 1000000000"),
        ("DeepSeek-V3", {"n_routed_experts": 10**12}, "n_routed_experts must be <= 16,777,216"),
        # a count of layers past the model's layers is a typo, not a model of dense layers only
        ("DeepSeek-V3", {"first_k_dense_replace": 62}, "first_k_dense_replace must be <= 61 .the "
         "dense layers before the first MoE one, of the 61., got 62"),
        ("DeepSeek-V3", {"moe_layer_freq": 10**400}, "moe_layer_freq must be <= 61 .a step "
         "within the 61 layers., got a 1329-bit number"),
        ("Qwen3-30B-A3B", {"decoder_sparse_step": 49}, "decoder_sparse_step must be <= 48"),
    ],
)  # fmt: skip
def test_family_key_errors(name, change, message):
    with pytest.raises(ConfigError, match=message):
        load_hf_config(config(name) | change, source="c.json")


@pytest.mark.parametrize("name", ["DeepSeek-V3", "Qwen3-30B-A3B", "Mixtral-8x7B-v0.1"])
@pytest.mark.parametrize("key", ["num_hidden_layers", "hidden_size", "vocab_size"])
def test_every_count_is_bounded_before_anything_is_built_per_layer(name, key):
    """10**9 layers once hung: each family built its per-layer list before the bound was
    checked."""
    started = time.monotonic()
    with pytest.raises(ConfigError, match=f"^c.json: {key} must be <= "):
        load_hf_config(config(name) | {key: 10**9}, source="c.json")
    assert time.monotonic() - started < 1.0


def test_a_dense_layer_list_as_long_as_the_file_allows_is_read_in_linear_time():
    raw = config("Qwen3-30B-A3B") | {"mlp_only_layers": list(range(48)) * 20_000}
    started = time.monotonic()
    assert load_hf_config(raw).model.num_moe_layers == 0
    assert time.monotonic() - started < 2.0


def test_unreadable_files(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_hf_config(bad)
    bad.write_text("[1, 2]")
    with pytest.raises(ConfigError, match="expected a JSON object"):
        load_hf_config(bad)
    with pytest.raises(ConfigError, match="cannot read"):
        load_hf_config(tmp_path / "missing.json")


def test_training_sequence_length_defaults_to_4096():
    assert load_hf_config(HF / "DeepSeek-V3" / "config.json").model.seq_length == 4096


# --- Published parameter counts -----------------------------------------------------------------


def _published(raw: dict) -> tuple[sizing.ParameterCount, ModelSpec]:
    model = load_hf_config(raw).model
    return sizing.parameter_count(model), model


def test_published_totals_leave_the_mtp_layers_out():
    """Vendors publish the main model without its MTP layers, and so does ``total`` here.

    DeepSeek-V3's 671B leaves out its 11.5B MTP module (DeepSeek's README_WEIGHTS).  GLM-4.5-Air's
    106B settles GLM's convention: with the MTP layer of the released model (one MoE layer, which
    this copy of its config does not list) the count would be 109.2B, 3.0% over.  GLM-4.5's 355B
    is 0.6% above the count without its MTP layer and 0.5% below the count with it.
    """
    deepseek, _ = _published(config("DeepSeek-V3"))
    assert deepseek.total == pytest.approx(671e9, rel=0.001)
    assert deepseek.mtp == pytest.approx(11.5e9, rel=0.015)
    air, air_model = _published(real(GLM45_AIR))
    assert air_model.mtp_num_layers == 0
    assert air.total == pytest.approx(106e9, rel=0.015)  # 106.85B
    released, _ = _published(real(GLM45_AIR) | {"num_nextn_predict_layers": 1})
    assert released.total == air.total
    assert released.total_with_everything == pytest.approx(109.2e9, rel=0.001)
    glm, glm_model = _published(GLM45)
    assert glm_model.mtp_num_layers == 1
    assert glm.total == pytest.approx(355e9, rel=0.015)  # 352.80B; 356.79B with the MTP layer


@pytest.mark.parametrize(
    ("name", "total", "active"),
    [
        ("Qwen3-30B-A3B", 30.5e9, 3.3e9),  # the Qwen3-30B-A3B model card
        ("Mixtral-8x7B-v0.1", 46.7e9, 12.9e9),  # Mistral AI's Mixtral of experts announcement
        ("OLMoE-1B-7B-0924", 6.9e9, 1.3e9),  # the OLMoE paper (arXiv 2409.02060)
    ],
)
def test_published_totals_of_the_families_without_mtp(name, total, active):
    """Published to one decimal: 30.53B / 3.35B, 46.70B / 12.88B and 6.92B / 1.28B here."""
    counts, model = _published(config(name))
    assert model.mtp_num_layers == 0
    assert counts.total == pytest.approx(total, rel=0.015)
    assert counts.active == pytest.approx(active, rel=0.02)


def test_kimi_k2_total():
    """1.04T is 1.3% above the 1,026.4B counted here, which is what transformers 5.24's
    DeepseekV3ForCausalLM holds for this file: the gap is about one MoE layer's experts (16.9B),
    yet the file has no MTP layer to count."""
    counts, model = _published(real(KIMI_K2))
    assert model.mtp_num_layers == 0
    assert counts.total == pytest.approx(1.04e12, rel=0.015)


def test_glm_active_counts_leave_embedding_and_output_layer_out():
    """GLM's 12B and 32B active: without the embedding and the output layer (12.18B, 32.08B)."""
    for raw, published in ((real(GLM45_AIR), 12e9), (GLM45, 32e9)):
        counts, model = _published(raw)
        embedding = model.padded_vocab_size() * model.hidden_size
        assert counts.active - embedding - counts.output_layer == pytest.approx(published, rel=0.02)


# --- New families -------------------------------------------------------------------------------


def test_kimi_k2_reads_exactly_like_deepseek_v3():
    raw = real(KIMI_K2)
    kimi = load_hf_config(raw)
    deepseek = load_hf_config(raw | {"model_type": "deepseek_v3"})
    assert kimi.model == deepseek.model
    assert kimi.megatron_args == deepseek.megatron_args
    model = kimi.model
    assert (model.name, model.num_layers, model.num_experts, model.moe_router_topk) == (
        "Kimi-K2-Instruct",
        61,
        384,
        8,
    )
    assert model.moe_layer_pattern == (False,) + (True,) * 60
    assert model.mla == MLAConfig(1536, 512, 128, 64, 128)
    assert model.qk_layernorm and model.untie_embeddings_and_output_weights


def test_glm45_air():
    real(GLM45_AIR)
    model = load_hf_config(GLM45_AIR).model
    assert model == ModelSpec(
        name="GLM-4.5-Air",
        num_layers=46,
        hidden_size=4096,
        num_attention_heads=96,
        ffn_hidden_size=10944,
        num_query_groups=8,
        kv_channels=128,  # head_dim; 4096 / 96 is not a whole number
        seq_length=4096,
        vocab_size=151552,
        add_qkv_bias=True,  # attention_bias: q/k/v only, o_proj has none
        qk_layernorm=False,  # use_qk_norm
        untie_embeddings_and_output_weights=True,
        num_experts=128,
        moe_ffn_hidden_size=1408,
        moe_router_topk=8,
        moe_shared_expert_intermediate_size=1408,
        moe_layer_pattern=(False,) + (True,) * 45,
        mtp_num_layers=0,  # this copy of the config leaves num_nextn_predict_layers out
    )


def test_glm45_qk_norm_dense_layers_and_mtp():
    model = load_hf_config(GLM45).model
    assert model.qk_layernorm and model.add_qkv_bias
    assert model.moe_layer_pattern == (False,) * 3 + (True,) * 89
    assert model.mtp_num_layers == 1 and model.mtp_layer_is_moe


def test_glm4_moe_defaults_of_its_config_class():
    """Glm4MoeConfig: one shared expert, one dense layer, no biases or QK norm, no MTP here."""
    raw = {
        key: value
        for key, value in GLM45.items()
        if key not in {"n_shared_experts", "first_k_dense_replace", "attention_bias",
                       "use_qk_norm", "num_nextn_predict_layers"}
    }  # fmt: skip
    model = load_hf_config(raw).model
    assert model.moe_shared_expert_intermediate_size == 1536
    assert model.moe_layer_pattern == (False,) + (True,) * 91
    assert not model.add_qkv_bias and not model.qk_layernorm and model.mtp_num_layers == 0


def test_head_dim_defaults():
    """Without head_dim, Qwen3Config says 128; Qwen3MoeConfig has none, so Qwen3-MoE's attention
    (as measured with transformers 5.24: q_proj 256 x 256 below) takes hidden / heads."""
    assert load_hf_config(SMALL["qwen3_no_head_dim"]).model.kv_channels == 128
    moe = load_hf_config(SMALL["qwen3_moe_no_head_dim"]).model
    assert moe.kv_channels == moe.hidden_size // moe.num_attention_heads == 32


# --- Small configs of each new family, against transformers and megatron-core --------------------

# sum(p.numel() for p in model.parameters()) of transformers 5.24's Glm4MoeForCausalLM,
# DeepseekV3ForCausalLM (Kimi-K2's architecture), Qwen3MoeForCausalLM and Qwen3ForCausalLM built
# from SMALL (on the CPU, once, outside this suite: transformers is no dependency of the project).
# transformers builds no MTP layer, so these are the totals without it.
TRANSFORMERS_COUNTS = {
    "glm4_moe": 540_672,
    "glm4_moe_tied_defaults": 114_240,
    "kimi_k2": 660_080,
    "qwen3_moe_no_head_dim": 460_544,
    "qwen3_no_head_dim": 803_968,
}


@pytest.mark.parametrize("name", sorted(SMALL))
def test_small_configs_count_what_transformers_builds(name):
    model = load_hf_config(SMALL[name]).model
    assert sizing.parameter_count(model).total == TRANSFORMERS_COUNTS[name]


@pytest.fixture(scope="module")
def megatron_world():
    with megatron_cpu_world():
        yield


MEGATRON = [pytest.mark.megatron, *(pytest.mark.filterwarnings(w) for w in MEGATRON_CPU_WARNINGS)]


@pytest.mark.parametrize("name", [pytest.param(name, marks=MEGATRON) for name in sorted(SMALL)])
def test_small_configs_match_megatron_core(name, megatron_world):
    """megatron-core's GPTModel holds the count (MTP included), and its TransformerConfig accepts
    the derived router and rotary settings (sigmoid with expert bias, groups, MLA's rope type)."""
    recipe = load_hf_config(SMALL[name])
    settings = megatron_core_takes(recipe, name)
    assert "moe_router_score_function" in settings or not recipe.model.num_experts


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"attention_bias": 1}, "attention_bias must be true or false, got 1"),
        ({"use_qk_norm": "false"}, "use_qk_norm must be true or false"),
        ({"partial_rotary_factor": 1.5}, "partial_rotary_factor must be at most 1, got 1.5"),
        ({"n_routed_experts": None}, "missing key n_routed_experts"),
        ({"first_k_dense_replace": -1}, "first_k_dense_replace must be >= 0, got -1"),
        ({"first_k_dense_replace": 93}, "first_k_dense_replace must be <= 92"),
    ],
)
def test_glm4_moe_errors_name_the_key(change, message):
    with pytest.raises(ConfigError, match=message):
        load_hf_config(GLM45 | change)
