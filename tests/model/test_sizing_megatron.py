"""Cross-check the analytic parameter counts of ``ray_layout.model.sizing`` against megatron-core.

Each configuration is built twice: once as a :class:`ModelSpec` through ``build_recipe`` and
once as megatron-core's own ``GPTModel`` (local layer spec, CPU, TP = PP = 1).  The whole-model
count and every unit (embedding, each decoder layer, each MTP layer, final norm, output layer)
must agree exactly.
"""

from __future__ import annotations

from typing import Any

import pytest

from ray_layout.model import sizing
from ray_layout.model.fields import ModelSpec
from ray_layout.model.spec import build_recipe
from tests.helpers.megatron_oracle import (
    MEGATRON_CPU_WARNINGS,
    build_gpt_model,
    count_params,
    megatron_cpu_world,
)

pytestmark = [
    pytest.mark.megatron,
    *(pytest.mark.filterwarnings(w) for w in MEGATRON_CPU_WARNINGS),
]

_BASE = {"seq_length": 64, "vocab_size": 1000}

# Small shapes that each switch on a different part of the parameter count.  Vocabularies are
# not multiples of 128, so the padded size differs from the raw one.
CONFIGS: dict[str, dict[str, Any]] = {
    "dense_mha_swiglu_rmsnorm_tied": {
        "num_layers": 2,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "ffn_hidden_size": 160,
    },
    "dense_gqa_kvchannels_layernorm_gelu_bias_untied": {
        "num_layers": 2,
        "hidden_size": 96,
        "num_attention_heads": 6,
        "num_query_groups": 2,
        "kv_channels": 24,  # hidden / heads would be 16
        "ffn_hidden_size": 200,
        "swiglu": False,
        "normalization": "LayerNorm",
        "add_bias_linear": True,
        "untie_embeddings_and_output_weights": True,
        "vocab_size": 1001,
    },
    "dense_learned_absolute_qkbias_qknorm": {
        "num_layers": 2,
        "hidden_size": 128,
        "num_attention_heads": 8,
        "num_query_groups": 4,
        "position_embedding_type": "learned_absolute",
        "max_position_embeddings": 96,  # differs from seq_length: the embedding holds 96 rows
        "add_qkv_bias": True,
        "qk_layernorm": True,
        "make_vocab_size_divisible_by": 64,
        "vocab_size": 999,
    },
    "all_moe_gqa_tied": {
        "num_layers": 2,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_query_groups": 1,
        "ffn_hidden_size": 128,
        "num_experts": 4,
        "moe_ffn_hidden_size": 48,
        "moe_router_topk": 2,
    },
    "moe_dense_first_shared_mtp1_untied": {  # DeepSeek-like: dense first, MoE last, MTP on MoE
        "num_layers": 3,
        "hidden_size": 128,
        "num_attention_heads": 8,
        "num_query_groups": 2,
        "kv_channels": 32,
        "ffn_hidden_size": 256,
        "num_experts": 8,
        "moe_ffn_hidden_size": 32,
        "moe_router_topk": 2,
        "moe_shared_expert_intermediate_size": 64,
        "moe_layer_freq": "[0]*1+[1]*2",
        "mtp_num_layers": 1,
        "untie_embeddings_and_output_weights": True,
        "vocab_size": 1100,
    },
    "moe_last_dense_mtp2_layernorm_gelu_tied": {  # MTP layers built from a dense last layer
        "num_layers": 2,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "ffn_hidden_size": 96,
        "num_experts": 4,
        "moe_ffn_hidden_size": 32,
        "moe_router_topk": 1,
        "moe_layer_freq": 2,  # [1, 0]
        "mtp_num_layers": 2,
        "swiglu": False,
        "normalization": "LayerNorm",
    },
    "moe_mix_qknorm_shared_mtp2_untied": {
        "num_layers": 4,
        "hidden_size": 256,
        "num_attention_heads": 4,
        "num_query_groups": 2,
        "kv_channels": 48,
        "ffn_hidden_size": 384,
        "num_experts": 4,
        "moe_ffn_hidden_size": 64,
        "moe_router_topk": 2,
        "moe_shared_expert_intermediate_size": 128,
        "moe_layer_freq": [0, 1, 0, 1],
        "qk_layernorm": True,
        "mtp_num_layers": 2,
        "untie_embeddings_and_output_weights": True,
    },
    "moe_gated_shared_expert_untied": {  # Qwen2-MoE's sigmoid gate on the shared expert
        "num_layers": 2,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "ffn_hidden_size": 128,
        "num_experts": 4,
        "moe_ffn_hidden_size": 32,
        "moe_router_topk": 2,
        "moe_shared_expert_intermediate_size": 48,
        "moe_shared_expert_gate": True,
        "untie_embeddings_and_output_weights": True,
    },
    "mla_q_lora_moe_mix_mtp1": {  # DeepSeek-V3 shape in miniature
        "num_layers": 2,
        "hidden_size": 128,
        "num_attention_heads": 4,
        "ffn_hidden_size": 192,
        "multi_latent_attention": True,
        "q_lora_rank": 48,
        "kv_lora_rank": 32,
        "qk_head_dim": 16,
        "qk_pos_emb_head_dim": 8,
        "v_head_dim": 24,
        "qk_layernorm": True,
        "num_experts": 4,
        "moe_ffn_hidden_size": 32,
        "moe_router_topk": 2,
        "moe_shared_expert_intermediate_size": 32,
        "moe_layer_freq": [0, 1],
        "mtp_num_layers": 1,
        "untie_embeddings_and_output_weights": True,
    },
    "mla_q_lora_without_qk_layernorm_all_moe_tied": {  # no norms on the compressed q and kv
        "num_layers": 2,
        "hidden_size": 128,
        "num_attention_heads": 4,
        "multi_latent_attention": True,
        "q_lora_rank": 48,
        "kv_lora_rank": 32,
        "qk_head_dim": 16,
        "qk_pos_emb_head_dim": 8,
        "v_head_dim": 24,
        "num_experts": 4,
        "moe_ffn_hidden_size": 32,
        "moe_router_topk": 2,
        "mtp_num_layers": 1,
    },
    "gpt_oss_quick_geglu_sinks_biases_untied": {  # gpt-oss in miniature: gated, biased experts
        "num_layers": 2,
        "hidden_size": 64,
        "num_attention_heads": 8,
        "num_query_groups": 2,
        "kv_channels": 16,
        "ffn_hidden_size": 64,
        "swiglu": False,
        "quick_geglu": True,
        "add_bias_linear": True,
        "softmax_type": "learnable",
        "num_experts": 4,
        "moe_ffn_hidden_size": 48,
        "moe_router_topk": 2,
        "untie_embeddings_and_output_weights": True,
    },
    "quick_geglu_dense_with_mtp_tied": {  # the gate on a dense MLP and on the MTP layer's
        "num_layers": 2,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "ffn_hidden_size": 96,
        "quick_geglu": True,  # swiglu left out: it yields
        "mtp_num_layers": 1,
    },
    "llama4_interleaved_shared_top1_untied": {  # Llama 4 Maverick in miniature
        "num_layers": 4,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_query_groups": 2,
        "kv_channels": 32,
        "ffn_hidden_size": 128,
        "num_experts": 4,
        "moe_ffn_hidden_size": 32,
        "moe_router_topk": 1,
        "moe_shared_expert_intermediate_size": 32,
        "moe_layer_freq": "([0,1]*2)",
        "untie_embeddings_and_output_weights": True,
    },
    "mla_no_q_lora_dense_layernorm": {  # DeepSeek-V2-Lite style: queries not compressed
        "num_layers": 2,
        "hidden_size": 96,
        "num_attention_heads": 3,
        "ffn_hidden_size": 128,
        "multi_latent_attention": True,
        "kv_lora_rank": 40,
        "qk_head_dim": 16,
        "qk_pos_emb_head_dim": 8,
        "v_head_dim": 16,
        "qk_layernorm": True,
        "normalization": "LayerNorm",
    },
}


def _model(name: str) -> ModelSpec:
    return build_recipe({**_BASE, **CONFIGS[name], "name": name}, {}, source="test").model


@pytest.fixture(scope="session")
def megatron_world():
    with megatron_cpu_world():
        yield


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def built(request, megatron_world) -> tuple[ModelSpec, Any]:
    model = _model(request.param)
    return model, build_gpt_model(model)


def test_total_matches_gpt_model(built):
    model, gpt = built
    assert sizing.parameter_count(model).total_with_everything == count_params(gpt)


def test_each_unit_matches_its_module(built):
    model, gpt = built
    units = sizing.unit_sizes(model)

    assert count_params(gpt.embedding) == units[sizing.EMBEDDING].params.total

    assert len(gpt.decoder.layers) == model.num_layers
    for index, layer in enumerate(gpt.decoder.layers):
        moe = model.moe_layer_pattern[index]
        assert type(layer.mlp).__name__ == ("MoELayer" if moe else "MLP"), index
        assert count_params(layer) == sizing.decoder_layer_params(model, moe).total, index
        assert count_params(layer) == units[sizing.decoder_unit(model, index)].params.total

    assert count_params(gpt.decoder.final_layernorm) == sizing.final_norm_params(model).total

    if model.mtp_num_layers:
        assert len(gpt.mtp.layers) == model.mtp_num_layers
        for layer in gpt.mtp.layers:
            assert count_params(layer) == units[sizing.MTP].params.total
    else:
        assert not hasattr(gpt, "mtp")

    expected_output = units[sizing.LOSS].params.total
    assert count_params(gpt.output_layer) == (
        expected_output if model.untie_embeddings_and_output_weights else 0
    )


def test_tied_embedding_counted_once(built):
    model, gpt = built
    everything = sum(p.numel() for _, p in gpt.named_parameters(remove_duplicate=False))
    assert everything == count_params(gpt)  # no tensor is registered twice at TP = PP = 1
    word_embeddings = gpt.embedding.word_embeddings.weight
    if model.untie_embeddings_and_output_weights:
        assert gpt.output_layer.weight is not word_embeddings
    else:
        # With PP = 1 the output layer allocates no weight and projects with the embedding's.
        assert gpt.output_layer.weight is None
        assert gpt.shared_embedding_or_output_weight() is word_embeddings
