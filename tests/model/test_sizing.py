"""Analytic sizing: the handbook's published counts, Megatron's FLOP formula, memory rules."""

from __future__ import annotations

import pytest

from ray_layout.model.sizing import (
    Params,
    gpu_gigaparams,
    gpu_params,
    layer_params,
    moe_block_params,
    parameter_count,
    stage_sizes,
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


def test_one_gpu_holds_dense_parameters_split_by_tp_and_experts_by_ep_x_etp():
    parallel = ParallelConfig(tp=2, ep=4, etp=1, dp=4, pp=2)  # world 16, expert-DP 2
    params = Params(tp_sharded=1000, replicated=10, expert=8000)
    dense, expert, fp8_eligible = gpu_params(params, parallel)
    assert (dense, expert, fp8_eligible) == (500 + 10, 2000, 500 + 2000)
    assert gpu_gigaparams(params, parallel) == pytest.approx((510 + 2000) / 1e9)


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


_GATED = {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 32,
          "vocab_size": 128, "ffn_hidden_size": 96, "num_experts": 4, "moe_ffn_hidden_size": 32,
          "moe_router_topk": 2, "moe_layer_freq": [0, 1]}  # fmt: skip


def test_quick_geglu_is_gated_in_parameters_and_flops():
    """Megatron sets gated_linear_unit for --quick-geglu: its first projection is 2 x ffn wide, as
    SwiGLU's, where an ungated MLP's is ffn wide."""
    geglu = build_recipe(_GATED | {"quick_geglu": True}, {}, source="test").model
    swiglu = build_recipe(_GATED | {"swiglu": True}, {}, source="test").model
    gelu = build_recipe(_GATED | {"swiglu": False}, {}, source="test").model
    assert geglu.gated_linear_unit and not geglu.swiglu
    for unit in ("t_dense", "t_moe"):
        sizes = [unit_sizes(m)[unit] for m in (geglu, swiglu, gelu)]
        assert sizes[0].params == sizes[1].params != sizes[2].params
        assert sizes[0].forward_flops == sizes[1].forward_flops > sizes[2].forward_flops
    dense = unit_sizes(geglu)["t_dense"].params.total - unit_sizes(gelu)["t_dense"].params.total
    assert dense == 64 * 96  # the gate's own h x ffn


def test_attention_sinks_and_the_router_bias_are_counted():
    plain = build_recipe(_GATED, {}, source="test").model
    sinks = build_recipe(_GATED | {"softmax_type": "learnable"}, {}, source="test").model
    assert (
        unit_sizes(sinks)["t_moe"].params.tp_sharded - unit_sizes(plain)["t_moe"].params.tp_sharded
        == 4  # one offset per head
    )
    biased = build_recipe(_GATED | {"add_bias_linear": True}, {}, source="test").model
    router_and_fc2_bias = unit_sizes(biased)["t_moe"].params.replicated
    assert router_and_fc2_bias - unit_sizes(plain)["t_moe"].params.replicated == 4 + 64


def test_active_counts_name_what_they_leave_out():
    untied = build_recipe(_GATED | {"untie_embeddings_and_output_weights": True}, {}, source="t")
    counts = parameter_count(untied.model)
    matrix = 128 * 64
    assert counts.embedding == counts.output_layer == matrix
    assert counts.active_without_input_embedding == counts.active - matrix
    assert counts.active_without_embedding_and_output == counts.active - 2 * matrix
    tied = parameter_count(build_recipe(_GATED, {}, source="t").model)
    assert tied.output_layer == 0 and tied.active_without_input_embedding == tied.active
    assert tied.active_without_embedding_and_output == tied.active - matrix
    assert HANDBOOK.model and parameter_count(HANDBOOK.model).active > (
        parameter_count(HANDBOOK.model).active_without_embedding_and_output
    )


_FORKED = {"num_layers": 4, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 32,
           "vocab_size": 128, "ffn_hidden_size": 96, "num_experts": 8, "moe_router_topk": 1,
           "moe_layer_freq": [0, 1, 0, 1], "add_bias_linear": True, "swiglu": False}  # fmt: skip


def test_each_moe_layer_is_sized_with_its_own_experts():
    model = build_recipe(_FORKED | {"moe_layer_experts": [4, 8]}, {}, source="t").model
    layers = layer_params(model)
    expert = (64 * 96 + 96) + (96 * 64 + 64)
    assert layers[3].total - layers[1].total == 4 * expert + 4 * (64 + 1)  # experts + router rows
    assert layers[3].active - layers[1].active == 4 * (64 + 1)  # top-1 of either; the router
    stages = stage_sizes(model, ParallelConfig(pp=2, dp=1), ("Ett", "ttL"))
    assert sum(s.params.total for s in stages) == parameter_count(model).total + 128 * 64


def test_deepspeed_moe_block_pr_moe_and_its_flops():
    """TopKGate without bias; PR-MoE's MLP beside the experts (replicated: outside TP) and its
    2-way coefficient; FLOPs count the residual MLP as one more expert per token."""
    core = build_recipe(_FORKED, {}, source="t").model
    ds = build_recipe(_FORKED | {"moe_block": "deepspeed", "moe_residual": True}, {}, source="t")
    expert = (64 * 96 + 96) + (96 * 64 + 64)
    moe = moe_block_params(ds.model)
    assert moe.total - moe_block_params(core).total == expert + 2 * 64 + 2 - 8  # - router bias
    assert moe.replicated == 8 * 64 + expert + 2 * 64 + 2
    unit = unit_sizes(ds.model)["t_moe"].forward_flops - unit_sizes(core)["t_moe"].forward_flops
    assert unit == pytest.approx(32 * 2 * 64 * 96 * 2)  # one more GeLU MLP for 32 tokens


def test_the_shared_experts_gate_is_h_weights():
    shared = _FORKED | {"moe_shared_expert_intermediate_size": 48}
    plain = build_recipe(shared, {}, source="t").model
    gated = build_recipe(shared | {"moe_shared_expert_gate": True}, {}, source="t").model
    assert moe_block_params(gated).replicated - moe_block_params(plain).replicated == 64


def test_noop_layers_hold_nothing_and_compute_nothing():
    model = build_recipe(_FORKED | {"noop_layers": [0, 3]}, {}, source="t").model
    plain = build_recipe(_FORKED, {}, source="t").model
    layers = layer_params(model)
    assert layers[0].total == layers[3].total == 0
    stages = stage_sizes(model, ParallelConfig(pp=2, dp=1), ("Ett", "ttL"))
    full = stage_sizes(plain, ParallelConfig(pp=2, dp=1), ("Ett", "ttL"))
    units = unit_sizes(plain)
    assert full[0].forward_flops - stages[0].forward_flops == units["t_dense"].forward_flops
    assert full[1].forward_flops - stages[1].forward_flops == units["t_moe"].forward_flops
    flops = training_flops_per_iteration(plain, 1) - training_flops_per_iteration(model, 1)
    assert flops == pytest.approx(units["t_dense"].training_flops + units["t_moe"].training_flops)
