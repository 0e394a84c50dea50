"""Hugging Face config.json files of real MoE models, mapped onto Megatron's model fields and
the Megatron flags that train them as released."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from ray_layout.errors import ConfigError
from ray_layout.model import sizing
from ray_layout.model.hf_config import load_hf_config
from ray_layout.model.megatron_args import check_arguments, megatron_flag_table, parse_flags
from ray_layout.model.spec import MLAConfig, ModelSpec
from tests.megatron_oracle import (
    MEGATRON_CPU_WARNINGS,
    build_gpt_model,
    count_params,
    megatron_cpu_world,
    transformer_config,
)

HF = Path(__file__).parent / "data" / "hf"
REAL = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "real_hf_configs"
KIMI_K2 = REAL / "Kimi-K2-Instruct" / "config.json"
GLM45_AIR = REAL / "GLM-4.5-Air" / "config.json"


def config(name: str) -> dict:
    return json.loads((HF / name / "config.json").read_text())


def real(path: Path) -> dict:
    if not path.is_file():
        pytest.skip(f"{path} is not there (the shared data of the project)")
    return json.loads(path.read_text())


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
    ],
)
def test_family_key_errors(name, change, message):
    with pytest.raises(ConfigError, match=message):
        load_hf_config(config(name) | change)


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

# GLM-4.5 (zai-org/GLM-4.5's config.json, written out here: it is not among the shared files).
GLM45 = {
    "model_type": "glm4_moe",
    "num_hidden_layers": 92,
    "first_k_dense_replace": 3,
    "hidden_size": 5120,
    "num_attention_heads": 96,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "intermediate_size": 12288,
    "moe_intermediate_size": 1536,
    "n_routed_experts": 160,
    "num_experts_per_tok": 8,
    "n_shared_experts": 1,
    "vocab_size": 151552,
    "num_nextn_predict_layers": 1,
    "tie_word_embeddings": False,
    "attention_bias": True,
    "use_qk_norm": True,
    "partial_rotary_factor": 0.5,
    "rope_theta": 1000000,
    "rms_norm_eps": 1e-05,
    "routed_scaling_factor": 2.5,
    "n_group": 1,
    "topk_group": 1,
    "max_position_embeddings": 131072,
}


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

SMALL: dict[str, dict] = {
    "glm4_moe": {
        "model_type": "glm4_moe", "num_hidden_layers": 3, "hidden_size": 96,
        "num_attention_heads": 6, "num_key_value_heads": 2, "head_dim": 24,
        "intermediate_size": 160, "moe_intermediate_size": 32, "n_routed_experts": 8,
        "num_experts_per_tok": 2, "n_shared_experts": 2, "first_k_dense_replace": 1,
        "attention_bias": True, "use_qk_norm": True, "partial_rotary_factor": 0.5,
        "vocab_size": 1024, "max_position_embeddings": 256, "tie_word_embeddings": False,
        "num_nextn_predict_layers": 1,
    },
    "glm4_moe_tied_defaults": {
        "model_type": "glm4_moe", "num_hidden_layers": 2, "hidden_size": 64,
        "num_attention_heads": 4, "num_key_value_heads": 4, "intermediate_size": 128,
        "moe_intermediate_size": 16, "n_routed_experts": 4, "num_experts_per_tok": 2,
        "vocab_size": 640, "max_position_embeddings": 256, "tie_word_embeddings": True,
    },
    "kimi_k2": {
        "model_type": "kimi_k2", "num_hidden_layers": 3, "hidden_size": 128,
        "num_attention_heads": 4, "num_key_value_heads": 4, "intermediate_size": 192,
        "moe_intermediate_size": 32, "n_routed_experts": 8, "n_shared_experts": 1,
        "num_experts_per_tok": 2, "first_k_dense_replace": 1, "moe_layer_freq": 1,
        "q_lora_rank": 48, "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8,
        "v_head_dim": 24, "n_group": 1, "topk_group": 1, "vocab_size": 1024,
        "max_position_embeddings": 256, "tie_word_embeddings": False,
    },
    "qwen3_moe_no_head_dim": {
        "model_type": "qwen3_moe", "num_hidden_layers": 2, "hidden_size": 128,
        "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 192,
        "moe_intermediate_size": 32, "num_experts": 4, "num_experts_per_tok": 2,
        "vocab_size": 1024, "max_position_embeddings": 256, "tie_word_embeddings": False,
    },
    "qwen3_no_head_dim": {
        "model_type": "qwen3", "num_hidden_layers": 2, "hidden_size": 128,
        "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 192,
        "vocab_size": 1024, "max_position_embeddings": 256, "tie_word_embeddings": False,
    },
}  # fmt: skip

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
    gpt = build_gpt_model(recipe.model)
    assert sizing.parameter_count(recipe.model).total_with_everything == count_params(gpt)
    config = transformer_config(recipe.model)
    names = {f.name for f in dataclasses.fields(config)}
    settings = {k: v for k, v in parse_flags(recipe.megatron_args, name).items() if k in names}
    assert "moe_router_score_function" in settings or not recipe.model.num_experts
    dataclasses.replace(config, **settings)  # runs TransformerConfig's checks again


# --- The flags that train a model as released ---------------------------------------------------


def test_deepseek_v3_flags():
    assert load_hf_config(HF / "DeepSeek-V3" / "config.json").megatron_args == (
        "--moe-router-score-function", "sigmoid",
        "--moe-router-enable-expert-bias",  # topk_method noaux_tc: e_score_correction_bias
        "--moe-router-num-groups", "8", "--moe-router-group-topk", "4",
        "--moe-router-topk-scaling-factor", "2.5",
        "--moe-grouped-gemm",
        "--rotary-base", "10000",
        "--rope-type", "yarn", "--rotary-scaling-factor", "40.0",
        "--mscale", "1.0", "--mscale-all-dim", "1.0",
        "--norm-epsilon", "1e-06",
    )  # fmt: skip


def test_kimi_k2_flags_of_this_file():
    """This copy has no router or rope keys: DeepseekV3Config's defaults (8 groups of which 4,
    scaling 2.5, rope_theta 10000, no YaRN); MLA without YaRN needs plain rope, unfused."""
    assert load_hf_config(real(KIMI_K2)).megatron_args == (
        "--moe-router-score-function", "sigmoid",
        "--moe-router-enable-expert-bias",
        "--moe-router-num-groups", "8", "--moe-router-group-topk", "4",
        "--moe-router-topk-scaling-factor", "2.5",
        "--moe-grouped-gemm",
        "--rotary-base", "10000",
        "--rope-type", "rope", "--no-rope-fusion",
        "--norm-epsilon", "1e-06",
    )  # fmt: skip


# The router and rope keys of moonshotai/Kimi-K2-Instruct's released config.json.
KIMI_K2_ROUTER_AND_ROPE = {
    "scoring_func": "sigmoid",
    "topk_method": "noaux_tc",
    "n_group": 1,
    "topk_group": 1,
    "norm_topk_prob": True,
    "routed_scaling_factor": 2.827,
    "rope_theta": 50000.0,
    "rope_scaling": {
        "beta_fast": 1.0,
        "beta_slow": 1.0,
        "factor": 32.0,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 4096,
        "type": "yarn",
    },
    "rms_norm_eps": 1e-06,
}


def test_kimi_k2_flags_as_released():
    """One group: no group-limited routing.  YaRN's beta_fast 1 has no Megatron flag (MLA fixes
    32), so it is not carried."""
    raw = real(KIMI_K2) | KIMI_K2_ROUTER_AND_ROPE
    assert load_hf_config(raw).megatron_args == (
        "--moe-router-score-function", "sigmoid",
        "--moe-router-enable-expert-bias",
        "--moe-router-topk-scaling-factor", "2.827",
        "--moe-grouped-gemm",
        "--rotary-base", "50000",
        "--rope-type", "yarn", "--rotary-scaling-factor", "32.0",
        "--mscale", "1.0", "--mscale-all-dim", "1.0",
        "--norm-epsilon", "1e-06",
    )  # fmt: skip


def test_glm45_air_flags():
    """GLM routes as DeepSeek-V3 does (sigmoid, e_score_correction_bias), here in one group."""
    assert load_hf_config(real(GLM45_AIR)).megatron_args == (
        "--moe-router-score-function", "sigmoid",
        "--moe-router-enable-expert-bias",
        "--moe-router-topk-scaling-factor", "2.5",
        "--moe-grouped-gemm",
        "--rotary-base", "1000000",
        "--rotary-percent", "0.5",  # partial_rotary_factor
        "--norm-epsilon", "1e-06",
    )  # fmt: skip


def test_softmax_families_flags():
    """Qwen3-MoE renormalizes its top-k softmax weights (norm_topk_prob), which is Megatron's
    softmax over the top-k logits; OLMoE does not: --moe-router-pre-softmax."""
    assert load_hf_config(HF / "Qwen3-30B-A3B" / "config.json").megatron_args == (
        "--moe-router-score-function", "softmax", "--moe-grouped-gemm",
        "--rotary-base", "1000000", "--norm-epsilon", "1e-06",
    )  # fmt: skip
    olmoe = load_hf_config(HF / "OLMoE-1B-7B-0924" / "config.json").megatron_args
    assert olmoe[:3] == ("--moe-router-score-function", "softmax", "--moe-router-pre-softmax")
    mixtral = load_hf_config(HF / "Mixtral-8x7B-v0.1" / "config.json").megatron_args
    assert "--moe-router-pre-softmax" not in mixtral
    top1 = load_hf_config(config("Mixtral-8x7B-v0.1") | {"num_experts_per_tok": 1})
    assert "--moe-router-pre-softmax" in top1.megatron_args  # Megatron refuses top-1 without


def test_dense_llama3_rope_scaling_and_transformers5_rope_parameters():
    raw = {
        "model_type": "llama", "num_hidden_layers": 2, "hidden_size": 256,
        "intermediate_size": 512, "num_attention_heads": 4, "vocab_size": 1024,
        "max_position_embeddings": 4096, "rope_theta": 500000.0, "rms_norm_eps": 1e-05,
        "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
    }  # fmt: skip
    assert load_hf_config(raw).megatron_args == (
        "--rotary-base", "500000", "--use-rope-scaling", "--rope-scaling-factor", "32.0",
        "--norm-epsilon", "1e-05",
    )  # fmt: skip
    glm = GLM45 | {"rope_parameters": {"rope_theta": 20000.0, "partial_rotary_factor": 0.25}}
    del glm["rope_theta"], glm["partial_rotary_factor"]
    flags = load_hf_config(glm).megatron_args
    assert flags[flags.index("--rotary-base") + 1] == "20000"
    assert flags[flags.index("--rotary-percent") + 1] == "0.25"


def test_every_derived_flag_is_megatrons():
    raws = {name: config(name) for name in ("DeepSeek-V3", "Qwen3-30B-A3B", "Mixtral-8x7B-v0.1",
                                            "OLMoE-1B-7B-0924")}  # fmt: skip
    raws |= {"GLM-4.5": GLM45, **SMALL}
    for path in (KIMI_K2, GLM45_AIR):
        if path.is_file():
            raws[path.parent.name] = json.loads(path.read_text())
            raws[path.parent.name + " as released"] = raws[path.parent.name] | (
                KIMI_K2_ROUTER_AND_ROPE if path == KIMI_K2 else {}
            )
    for name, raw in raws.items():
        flags = load_hf_config(raw).megatron_args
        assert flags, name
        check_arguments(flags, name)
        dests = [megatron_flag_table()[word]["dest"] for word in flags if word.startswith("--")]
        assert len(dests) == len(set(dests)), name


def test_derived_flags_come_first_and_the_users_win():
    raw = config("DeepSeek-V3") | {
        "megatron_args": ["--rotary-base", "20000", "--moe-grouped-gemm", "--norm-epsilon=1e-5",
                          "--overlap-grad-reduce"],
    }  # fmt: skip
    flags = load_hf_config(raw).megatron_args
    assert flags[-5:] == tuple(raw["megatron_args"])
    assert flags.count("--rotary-base") == flags.count("--moe-grouped-gemm") == 1
    assert "--norm-epsilon" not in flags  # only the user's --norm-epsilon=1e-5
    assert flags[:2] == ("--moe-router-score-function", "sigmoid")
    check_arguments(flags, "test")
    table = megatron_flag_table()
    dests = [table[w.partition("=")[0]]["dest"] for w in flags if w.startswith("--")]
    assert len(dests) == len(set(dests))
    assert parse_flags(flags, "test")["rotary_base"] == 20000


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"rope_theta": 10000.5}, "rope_theta 10000.5 is not a whole number"),
        ({"rope_theta": "1e4"}, "rope_theta must be a number > 0, got '1e4'"),
        ({"rms_norm_eps": -1}, "rms_norm_eps must be a number > 0, got -1"),
        ({"scoring_func": "relu"}, "scoring_func must be softmax or sigmoid, got 'relu'"),
        ({"topk_method": "best"}, "topk_method must be one of greedy, group_limited_greedy,"),
        ({"scoring_func": "softmax"}, "topk_method noaux_tc needs scoring_func sigmoid"),
        ({"n_group": 7}, "n_group 7 does not divide the 256 experts"),
        ({"n_group": "8"}, "n_group must be an integer >= 1, got '8'"),
        ({"topk_group": 16}, "topk_group 16 is more than n_group 8"),
        ({"num_experts_per_tok": 2}, "num_experts_per_tok 2 is less than topk_group 4"),
        ({"norm_topk_prob": "yes"}, "norm_topk_prob must be true or false"),
        ({"routed_scaling_factor": 0}, "routed_scaling_factor must be a number > 0, got 0"),
        ({"rope_scaling": "yarn"}, "rope_scaling must be a mapping, got 'yarn'"),
        ({"rope_scaling": {"type": "yarn"}}, "rope_scaling has no factor"),
        ({"rope_scaling": {"type": "yarn", "factor": 40, "mscale_all_dim": -1}},
         "rope_scaling mscale_all_dim must be a number >= 0, got -1"),
        ({"megatron_args": "--bf16"}, "megatron_args must be a list of flags and values"),
    ],
)  # fmt: skip
def test_training_flag_errors_name_the_key(change, message):
    with pytest.raises(ConfigError) as info:
        load_hf_config(config("DeepSeek-V3") | change, source="ds.json")
    assert str(info.value).startswith("ds.json: ")
    assert message in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"attention_bias": 1}, "attention_bias must be true or false, got 1"),
        ({"use_qk_norm": "false"}, "use_qk_norm must be true or false"),
        ({"partial_rotary_factor": 1.5}, "partial_rotary_factor must be at most 1, got 1.5"),
        ({"n_routed_experts": None}, "missing key n_routed_experts"),
        ({"first_k_dense_replace": -1}, "first_k_dense_replace must be >= 0, got -1"),
    ],
)
def test_glm4_moe_errors_name_the_key(change, message):
    with pytest.raises(ConfigError, match=message):
        load_hf_config(GLM45 | change)
