"""Hugging Face config.json files for the loader's tests and its flags' tests: the bundled test
copies, the real released files beside the checkout (skipped where absent), GLM-4.5 written out,
and small configs of each family that transformers and megatron-core were counted on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.paths import HF_CONFIGS, SHARED_DATA

HF = HF_CONFIGS
REAL = SHARED_DATA / "real_hf_configs"
KIMI_K2 = REAL / "Kimi-K2-Instruct" / "config.json"
GLM45_AIR = REAL / "GLM-4.5-Air" / "config.json"


def config(name: str) -> dict:
    return json.loads((HF / name / "config.json").read_text())


def real(path: Path) -> dict:
    if not path.is_file():
        pytest.skip(f"{path} is not there (the shared data of the project)")
    return json.loads(path.read_text())


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

SMALL: dict[str, dict] = {
    "glm4_moe": {
        "model_type": "glm4_moe",
        "num_hidden_layers": 3,
        "hidden_size": 96,
        "num_attention_heads": 6,
        "num_key_value_heads": 2,
        "head_dim": 24,
        "intermediate_size": 160,
        "moe_intermediate_size": 32,
        "n_routed_experts": 8,
        "num_experts_per_tok": 2,
        "n_shared_experts": 2,
        "first_k_dense_replace": 1,
        "attention_bias": True,
        "use_qk_norm": True,
        "partial_rotary_factor": 0.5,
        "vocab_size": 1024,
        "max_position_embeddings": 256,
        "tie_word_embeddings": False,
        "num_nextn_predict_layers": 1,
    },
    "glm4_moe_tied_defaults": {
        "model_type": "glm4_moe",
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "intermediate_size": 128,
        "moe_intermediate_size": 16,
        "n_routed_experts": 4,
        "num_experts_per_tok": 2,
        "vocab_size": 640,
        "max_position_embeddings": 256,
        "tie_word_embeddings": True,
    },
    "kimi_k2": {
        "model_type": "kimi_k2",
        "num_hidden_layers": 3,
        "hidden_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "intermediate_size": 192,
        "moe_intermediate_size": 32,
        "n_routed_experts": 8,
        "n_shared_experts": 1,
        "num_experts_per_tok": 2,
        "first_k_dense_replace": 1,
        "moe_layer_freq": 1,
        "q_lora_rank": 48,
        "kv_lora_rank": 32,
        "qk_nope_head_dim": 16,
        "qk_rope_head_dim": 8,
        "v_head_dim": 24,
        "n_group": 1,
        "topk_group": 1,
        "vocab_size": 1024,
        "max_position_embeddings": 256,
        "tie_word_embeddings": False,
    },
    "qwen3_moe_no_head_dim": {
        "model_type": "qwen3_moe",
        "num_hidden_layers": 2,
        "hidden_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 192,
        "moe_intermediate_size": 32,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "vocab_size": 1024,
        "max_position_embeddings": 256,
        "tie_word_embeddings": False,
    },
    "qwen3_no_head_dim": {
        "model_type": "qwen3",
        "num_hidden_layers": 2,
        "hidden_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 192,
        "vocab_size": 1024,
        "max_position_embeddings": 256,
        "tie_word_embeddings": False,
    },
}
