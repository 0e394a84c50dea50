"""Hugging Face config.json files of real MoE models, mapped onto Megatron's model fields."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ray_layout.errors import ConfigError
from ray_layout.model.hf_config import load_hf_config
from ray_layout.model.spec import MLAConfig, ModelSpec

HF = Path(__file__).parent / "data" / "hf"


def config(name: str) -> dict:
    return json.loads((HF / name / "config.json").read_text())


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
