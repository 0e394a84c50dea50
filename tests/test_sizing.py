"""Analytic sizing: the handbook's published counts, Megatron's FLOP formula, memory rules."""

from __future__ import annotations

import pytest

from ray_layout.model.sizing import (
    GRAD_BYTES,
    OPTIMIZER_BYTES,
    WEIGHT_BYTES,
    Params,
    parameter_count,
    stage_sizes,
    static_memory,
    training_flops_per_iteration,
    unit_sizes,
)
from ray_layout.model.spec import ParallelConfig, build_recipe, load_recipe_file

HANDBOOK = load_recipe_file("configs/handbook_7b_a1b.yaml")


def test_handbook_parameter_counts():
    counts = parameter_count(HANDBOOK.model)
    assert round(counts.total / 1e9, 2) == 6.86
    assert round(counts.active / 1e9, 2) == 1.22
    assert round(counts.mtp / 1e9, 2) == 0.42
    assert counts.output_layer == 0  # tied embeddings


def megatron_flops(args: dict, batch: int) -> float:
    """``num_floating_point_operations`` as written in Megatron's training.py (GQA branch),
    typed in independently of ray_layout.model.sizing."""
    h, s, layers = args["hidden_size"], args["seq_length"], args["num_layers"]
    pattern = args["pattern"]
    mtp = args["mtp"]
    n_moe = sum(pattern) + pattern[-1] * mtp
    n_dense = layers - sum(pattern) + (1 - pattern[-1]) * mtp
    f = 3 if args["swiglu"] else 2
    q = args["kv_channels"] * args["heads"]
    kv = args["kv_channels"] * args["groups"]
    attention = 6 * (h * (q + 2 * kv) + q * s / 2 * 2 + q * h)
    return batch * s * (
        6 * h * (args["ffn"] * f * n_dense + args["moe_ffn"] * args["topk"] * f * n_moe
                 + args["shared"] * f * n_moe)
        + (layers + mtp) * attention
        + 6 * mtp * (3 * h + 2 * h * h)
        + 6 * h * args["vocab"] * (mtp + 1)
    )  # fmt: skip


@pytest.mark.parametrize(
    "raw",
    [
        {"num_layers": 16, "hidden_size": 2048, "num_attention_heads": 16, "num_query_groups": 2,
         "kv_channels": 128, "seq_length": 4096, "vocab_size": 128256, "num_experts": 64,
         "moe_router_topk": 8, "moe_ffn_hidden_size": 1024, "mtp_num_layers": 1},
        {"num_layers": 6, "hidden_size": 512, "num_attention_heads": 8, "seq_length": 1024,
         "vocab_size": 1000, "num_experts": 8, "moe_router_topk": 2, "moe_ffn_hidden_size": 256,
         "moe_shared_expert_intermediate_size": 512, "moe_layer_freq": "[0]*2+[1]*4",
         "ffn_hidden_size": 1536, "mtp_num_layers": 2, "swiglu": False},
        {"num_layers": 4, "hidden_size": 256, "num_attention_heads": 4, "seq_length": 512,
         "vocab_size": 5000, "num_experts": 4, "moe_router_topk": 1, "moe_ffn_hidden_size": 128,
         "moe_layer_freq": "[1,1,1,0]", "mtp_num_layers": 1},
        {"num_layers": 3, "hidden_size": 128, "num_attention_heads": 4, "seq_length": 256,
         "vocab_size": 300},
    ],
)  # fmt: skip
def test_unit_flops_add_up_to_megatrons_formula(raw):
    model = build_recipe(raw, {}, source="test").model
    args = {
        "hidden_size": model.hidden_size, "seq_length": model.seq_length,
        "num_layers": model.num_layers, "pattern": [int(x) for x in model.moe_layer_pattern],
        "mtp": model.mtp_num_layers, "swiglu": model.swiglu, "kv_channels": model.kv_channels,
        "heads": model.num_attention_heads, "groups": model.num_query_groups,
        "ffn": model.ffn_hidden_size, "moe_ffn": model.moe_ffn_hidden_size,
        "topk": model.moe_router_topk, "shared": model.moe_shared_expert_intermediate_size,
        "vocab": model.padded_vocab_size(),
    }  # fmt: skip
    expected = megatron_flops(args, batch=64)
    assert training_flops_per_iteration(model, 64) == pytest.approx(expected, rel=1e-12)


def test_units_split_by_layer_kind_when_mixed():
    model = build_recipe(
        {"num_layers": 4, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 32,
         "vocab_size": 100, "num_experts": 4, "moe_layer_freq": "[0]+[1]*3",
         "mtp_num_layers": 1},
        {}, source="test",
    ).model  # fmt: skip
    assert set(unit_sizes(model)) == {"E", "t_dense", "t_moe", "m", "L"}
    assert unit_sizes(model)["m"].params.expert > 0  # MTP copies the last (MoE) layer's spec


def test_static_memory_follows_megatrons_bytes_per_parameter():
    dense = Params(tp_sharded=1000)
    plain = ParallelConfig(dp=4, use_distributed_optimizer=False)
    assert static_memory(dense, plain).total == 1000 * 18
    distributed = ParallelConfig(dp=4)
    assert static_memory(dense, distributed).total == 1000 * (6 + 12 / 4)
    tp2 = ParallelConfig(tp=2, dp=4)
    assert static_memory(Params(tp_sharded=1000, replicated=10), tp2).weights == 2 * (500 + 10)


def test_expert_parameters_shard_by_ep_and_expert_dp():
    parallel = ParallelConfig(tp=2, ep=4, etp=1, dp=4, pp=2)  # world 16, expert-DP 2
    assert parallel.expert_dp == 2
    memory = static_memory(Params(expert=8000), parallel)
    assert memory.weights == WEIGHT_BYTES * 2000
    assert memory.gradients == GRAD_BYTES * 2000
    assert memory.optimizer == OPTIMIZER_BYTES * 2000 / 2


def test_stage_sums_cover_the_model_plus_the_copies_megatron_builds():
    model, parallel = HANDBOOK.model, HANDBOOK.parallel
    units = unit_sizes(model, parallel.micro_batch_size)
    everything = parameter_count(model).total_with_everything
    stages = stage_sizes(model, parallel, ("Etttt", "tttt", "tttt", "ttttmL"))
    tied_copy = units["L"].params.total  # the last stage's own output-layer copy
    assert sum(s.params.total for s in stages) == everything + tied_copy
    standalone = stage_sizes(model, parallel, ("Ettttt", "tttttt", "ttttt", "mL"))
    assert sum(s.params.total for s in standalone) == everything + tied_copy
    mtp_alone = stage_sizes(model, parallel, ("Ettttt", "tttttt", "tttttm", "L"))
    embedding_copy = units["E"].params.total
    assert sum(s.params.total for s in mtp_alone) == everything + tied_copy + embedding_copy
    assert sum(s.forward_flops for s in stages) == pytest.approx(
        sum(s.forward_flops for s in mtp_alone)
    )


def test_single_stage_shares_tied_embedding():
    model = HANDBOOK.model
    single = stage_sizes(model, ParallelConfig(), ("E" + "t" * 16 + "mL",))
    assert single[0].params.total == parameter_count(model).total_with_everything


def test_vpp_chunks_sum_per_rank():
    model, parallel = HANDBOOK.model, ParallelConfig(pp=2, vpp=2, dp=4)
    stages = stage_sizes(model, parallel, ("Etttt", "tttt", "tttt", "ttttmL"))
    assert [s.units for s in stages] == ["Etttt|tttt", "tttt|ttttmL"]
