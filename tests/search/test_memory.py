"""Peak memory per PP rank against Megatron's theoretical_memory_usage.py and its scaling laws."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from ray_layout.model.costs import costs_from_flops, load_costs
from ray_layout.model.hf_config import load_hf_config
from ray_layout.model.layout import Layout
from ray_layout.model.memory_settings import memory_settings
from ray_layout.model.sizing import (
    GIB,
    GRAD_BYTES,
    OPTIMIZER_BYTES,
    WEIGHT_BYTES,
    Params,
    stage_sizes,
)
from ray_layout.model.spec import ParallelConfig, build_recipe, load_recipe_file
from search.memory import (
    StageMemory,
    activation_bytes,
    fits,
    logits_bytes,
    loss_logit_bytes,
    loss_transient_bytes,
    stage_memory,
    static_bytes,
)

HANDBOOK = load_recipe_file("configs/handbook_7b_a1b.yaml")
COSTS = load_costs("configs/costs/handbook_h200_example.json")
PICK = Layout(("Ettttt", "tttttt", "ttttt", "mL"), 4)
ONE_F_ONE_B = [{0: 4}, {0: 3}, {0: 2}, {0: 1}]  # rank r holds min(PP - r, M) micro-batches

# A dense GPT as Megatron's formula pictures it: no GQA, GeLU, LayerNorm, one attention width.
GPT = {"name": "gpt", "num_layers": 8, "hidden_size": 1024, "num_attention_heads": 16,
       "ffn_hidden_size": 3000, "swiglu": False, "normalization": "LayerNorm",
       "seq_length": 2048, "vocab_size": 50257}  # fmt: skip


def memory(model=HANDBOOK.model, parallel=HANDBOOK.parallel, layout=PICK, costs=COSTS,
           in_flight=ONE_F_ONE_B) -> list[StageMemory]:  # fmt: skip
    return stage_memory(model, parallel, layout, costs, in_flight)


def gpt(**parallel):
    return build_recipe(GPT, parallel, source="test")


# ---- Megatron's formulas, typed from theoretical_memory_usage.py ---------------------------


def megatron_layer_activation(s, b, h, ffn, tp):
    """Bytes per transformer layer (sequence parallel, selective recomputation)."""
    return s * b * h * (18 + 4 * ffn / h) / tp


def megatron_activation(s, b, h, ffn, layers, vocab, tp, pp, vpp, microbatches):
    """``compute_activation_memory``: the first stage's activations."""
    memory = s * b * h * (18 + 4 * ffn / h) * layers
    memory += 8 * s * b * pp + s * b * h * pp
    if vpp is not None:
        memory *= 1 + (pp - 1) / (pp * vpp)
    elif pp > 1:
        memory *= min(1, microbatches / pp)
    if pp == 1:
        memory += s * b * h * 4 * (1 + vocab / h)
    return memory / tp


def padded(vocab, tp):
    return math.ceil(vocab / (128 * tp)) * 128 * tp


@pytest.mark.parametrize(("tp", "b"), [(1, 1), (2, 1), (4, 3)])
def test_dense_layer_equals_megatrons_formula(tp, b):
    recipe = gpt(tp=tp, micro_batch_size=b)
    expected = megatron_layer_activation(2048, b, 1024, 3000, tp)
    assert activation_bytes(recipe.model, recipe.parallel, "t") == pytest.approx(expected)


@pytest.mark.parametrize("microbatches", [8, 2])
def test_first_stage_under_1f1b_equals_megatrons_formula(microbatches):
    recipe = gpt(tp=2, pp=4, micro_batch_size=2)
    layout = Layout(("Ett", "tt", "tt", "ttL"), 4)
    held = [{0: min(4 - rank, microbatches)} for rank in range(4)]
    first = memory(recipe.model, recipe.parallel, layout, COSTS, held)[0]
    expected = megatron_activation(2048, 2, 1024, 3000, 8, padded(50257, 2), 2, 4, None,
                                   microbatches)  # fmt: skip
    assert first.activations == pytest.approx(expected)
    assert first.logits == 0


def test_single_stage_with_output_layer_equals_megatrons_formula():
    recipe = gpt(tp=2, micro_batch_size=2)
    only = memory(recipe.model, recipe.parallel, Layout(("E" + "t" * 8 + "L",), 1), COSTS,
                  [{0: 1}])[0]  # fmt: skip
    expected = megatron_activation(2048, 2, 1024, 3000, 8, padded(50257, 2), 2, 1, None, 1)
    bf16_logits = 2 * padded(50257, 2) * 2048 * 2 / 2  # alive beside their fp32 copy at the loss
    assert only.activations + only.logits == pytest.approx(expected + bf16_logits)


def test_interleaved_first_stage_decoder_layers_match_megatrons_penalty():
    """Rank 0 of PP=4, VPP=2, 8 micro-batches: warmup 2(PP-1) + (V-1)PP = 10 forwards (chunk 0
    micro-batches 0-3, chunk 1 0-3, chunk 0 4-5) and one more before the first backward."""
    recipe = build_recipe(GPT | {"num_layers": 16}, {"pp": 4, "vpp": 2}, source="test")
    model = recipe.model
    layout = Layout(("Ett",) + ("tt",) * 6 + ("ttL",), 4)
    held = [{0: 7, 1: 4}, {0: 5, 1: 4}, {0: 4, 1: 3}, {0: 4, 1: 1}]  # get_schedule_table(8, 2, 4)
    first = memory(model, recipe.parallel, layout, COSTS, held)[0]
    decoder = first.activations - 7 * activation_bytes(model, recipe.parallel, "E")
    expected = 16 * megatron_layer_activation(2048, 1, 1024, 3000, 1) * (1 + 3 / (4 * 2))
    assert decoder == pytest.approx(expected)


# ---- the extensions: GQA, SwiGLU, MoE, MTP, embedding, loss --------------------------------


def test_handbook_units_per_token():
    h, q, kv, experts, topk, moe_ffn = 2048, 2048, 256, 64, 8, 1024
    attention = 2 * h + 2 * q + 2 * kv + 2 * kv + 2 * q + h
    moe = 2 * h + 4 * experts + topk * (2 * h + 2 * 2 * moe_ffn + 2 * moe_ffn + 2 * h) + h
    layer = 4 * h + attention + moe
    expected = {"E": 8 + h, "t": layer, "m": layer + 10 * h, "L": 2 * h * 3}
    tokens = 4096 * 2
    for unit, per_token in expected.items():
        got = activation_bytes(HANDBOOK.model, HANDBOOK.parallel, unit)
        assert got == pytest.approx(per_token * tokens), unit
    assert logits_bytes(HANDBOOK.model, HANDBOOK.parallel) == 4 * 128256 * tokens * 2


def test_shared_expert_and_mla_widths():
    recipe = load_hf_config("tests/data/hf/DeepSeek-V3/config.json", seq_length=1024)
    model, parallel = recipe.model, ParallelConfig()
    h, heads = 7168, 128
    attention = 3 * h + 2 * (1536 + 512 + 64) + 4 * heads * (128 + 64) + 4 * heads * 128
    dense = 4 * h + attention + 3 * h + 6 * 18432
    moe = 4 * h + attention + 3 * h + 4 * 256 + 8 * (4 * h + 6 * 2048) + 6 * 2048
    assert activation_bytes(model, parallel, "t_dense") == pytest.approx(dense * 1024)
    assert activation_bytes(model, parallel, "t_moe") == pytest.approx(moe * 1024)
    assert activation_bytes(model, parallel, "m") == pytest.approx((moe + 10 * h) * 1024)


# ---- scaling laws ---------------------------------------------------------------------------


def test_activations_scale_with_micro_batches_in_flight():
    base = memory(in_flight=[{0: 1}] * 4)
    # The bf16 logits of the loss being computed and the last MTP depth's, not per batch.
    once = (2 + 2) * 128256 * 4096 * 2
    for k in (2, 3, 5):
        scaled = memory(in_flight=[{0: k}] * 4)
        for one, many in zip(base, scaled, strict=True):
            assert many.activations == pytest.approx(k * one.activations)
            transient = once if one.logits else 0
            assert many.logits - transient == pytest.approx(k * (one.logits - transient))
            assert many.weights == one.weights and many.optimizer == one.optimizer
    assert [m.activations for m in memory(in_flight=[{}] * 4)] == [0] * 4


def test_activations_scale_with_micro_batch_size_and_inversely_with_tp():
    base = memory()
    doubled = memory(parallel=replace(HANDBOOK.parallel, micro_batch_size=4))
    split = memory(parallel=replace(HANDBOOK.parallel, tp=2))
    for one, two, half in zip(base, doubled, split, strict=True):
        assert two.activations == pytest.approx(2 * one.activations)
        assert two.logits == pytest.approx(2 * one.logits)
        assert half.activations == pytest.approx(one.activations / 2)
        assert half.logits == pytest.approx(one.logits / 2)  # 128256 pads alike for TP 1 and 2


def test_last_stage_carries_the_logits_of_every_depth():
    tokens, vocab = 4096 * 2, 128256
    ranks = memory()
    assert [m.logits for m in ranks[:3]] == [0, 0, 0]
    # One depth's bf16 logits beside their fp32 copy at its loss, and the last MTP depth's.
    once = (2 + 2) * tokens * vocab
    assert ranks[3].logits == 4 * tokens * vocab * 2 + once  # fp32, MTP depth 1 + 1
    no_mtp = replace(HANDBOOK.model, mtp_num_layers=0)
    plain = memory(model=no_mtp, layout=Layout(("Ettttt", "tttttt", "ttttt", "L"), 4))
    assert plain[3].logits == 4 * tokens * vocab + 2 * tokens * vocab
    twice = memory(in_flight=[{0: 4}, {0: 3}, {0: 2}, {0: 2}])
    assert twice[3].logits == 2 * (ranks[3].logits - once) + once


LLAMA_1B = {"name": "llama-3.2-1b", "num_layers": 16, "hidden_size": 2048,
            "ffn_hidden_size": 8192, "num_attention_heads": 32, "num_query_groups": 8,
            "kv_channels": 64, "seq_length": 1024, "vocab_size": 128256}  # fmt: skip


def test_loss_logits_follow_the_cross_entropy_kernel():
    # Llama-3.2-1B at 1024 tokens, micro-batch 1, TP 1: 128256 (a multiple of 128, no padding)
    # x 1024 = 131,334,144 logits per depth.  Unfused (tensor_parallel/cross_entropy.py): the
    # .float() copy, shifted, exp'd and normalised in place, is the saved softmax, 4 x 131,334,144
    # = 525,336,576 bytes; beside it the bf16 logits (forward) or the bf16 gradient autograd casts
    # to (backward), 2 x 131,334,144 = 262,668,288.  Native fusion
    # (fusions/fused_cross_entropy.py): the same softmax, and calculate_gradients' compiled
    # indexed update takes a fresh fp32 buffer beside its bf16 result, 6 x 131,334,144 =
    # 788,004,864.  TE: its kernels save the bf16 logits, 262,668,288, and write the gradient
    # into them.  MTP depth 1 (unfused): two softmaxes, 1,050,673,152, and the last depth's bf16
    # logits beside the main loss's, 525,336,576.
    recipe = build_recipe(LLAMA_1B, {"dp": 8, "global_batch_size": 512}, source="test")
    model, parallel = recipe.model, recipe.parallel
    unfused = memory_settings([])
    native = memory_settings(["--cross-entropy-loss-fusion"])
    te = memory_settings(["--cross-entropy-loss-fusion", "--cross-entropy-fusion-impl", "te"])
    assert native.cross_entropy == "native" and te.cross_entropy == "te"
    assert logits_bytes(model, parallel, unfused) == 525_336_576
    assert loss_transient_bytes(model, parallel, unfused) == 262_668_288
    assert logits_bytes(model, parallel, native) == 525_336_576
    assert loss_transient_bytes(model, parallel, native) == 788_004_864
    assert logits_bytes(model, parallel, te) == 262_668_288
    assert loss_transient_bytes(model, parallel, te) == 0
    mtp = replace(model, mtp_num_layers=1)
    assert logits_bytes(mtp, parallel, unfused) == 1_050_673_152
    assert loss_transient_bytes(mtp, parallel, unfused) == 525_336_576
    assert loss_logit_bytes(mtp, native) == (4, 6) and loss_logit_bytes(mtp, te) == (2, 0)
    # The stage's figure is saved x micro-batches held + the transient once.
    layout = Layout(("E" + "t" * 16 + "L",), 1)
    costs = costs_from_flops(model, parallel)
    (stage,) = stage_memory(model, parallel, layout, costs, [{0: 1}], native)
    assert stage.logits == 525_336_576 + 788_004_864


def test_logits_follow_the_chunk_that_holds_the_loss():
    layout = Layout(("Ett", "tt", "tt", "tt", "tt", "tt", "tt", "ttmL"), 4)
    parallel = replace(HANDBOOK.parallel, vpp=2)
    last = memory(parallel=parallel, layout=layout, in_flight=[{0: 1, 1: 1}] * 3 + [{0: 5, 1: 3}])
    once = loss_transient_bytes(HANDBOOK.model, parallel)
    assert last[3].logits == 3 * logits_bytes(HANDBOOK.model, parallel) + once


# ---- static memory and calibration ----------------------------------------------------------


@pytest.mark.parametrize("distributed", [True, False])
def test_megatrons_bytes_per_parameter_hold_through(distributed):
    recipe = gpt(tp=2, pp=2, dp=4)
    parallel = replace(recipe.parallel, use_distributed_optimizer=distributed)
    layout = Layout(("Etttt", "ttttL"), 2)
    per_parameter = 6 + 12 / 4 if distributed else 18
    ranks = memory(recipe.model, parallel, layout, COSTS, [{0: 2}, {0: 1}])
    for rank, size in zip(ranks, stage_sizes(recipe.model, parallel, layout.stages), strict=True):
        local = size.params.tp_sharded / 2 + size.params.replicated
        assert rank.weights + rank.gradients + rank.optimizer == pytest.approx(
            local * per_parameter
        )
        assert rank.weights == pytest.approx(2 * local)


def test_expert_parameters_use_expert_data_parallel():
    parallel = HANDBOOK.parallel  # world 8, EP 2, PP 4: expert-DP 1, DP 2
    rank = memory()[1]
    params = stage_sizes(HANDBOOK.model, parallel, PICK.stages)[1].params
    dense = params.tp_sharded + params.replicated
    expected = dense * (6 + 12 / 2) + params.expert / 2 * (6 + 12 / 1)
    assert rank.weights + rank.gradients + rank.optimizer == pytest.approx(expected)


def test_calibration_multiplies_the_right_parts():
    base = memory()
    scaled = memory(costs=replace(COSTS, memory_calibration={"t": 2.0, "L": 3.0},
                                  memory_overhead_gib=5.0))  # fmt: skip
    model, parallel = HANDBOOK.model, HANDBOOK.parallel
    e, t, m, loss = (activation_bytes(model, parallel, u) for u in ("E", "t", "m", "L"))
    assert scaled[1].activations == pytest.approx(2 * base[1].activations)  # t only
    assert scaled[0].activations == pytest.approx(4 * (e + 5 * 2 * t))
    assert scaled[3].activations == pytest.approx(m + 3 * loss)
    assert scaled[3].logits == pytest.approx(3 * base[3].logits)
    for one, other in zip(base, scaled, strict=True):
        assert (one.weights, one.gradients, one.optimizer) == (
            other.weights, other.gradients, other.optimizer,
        )  # fmt: skip
        assert (one.overhead, other.overhead) == (3 * GIB, 5 * GIB)


def test_total_and_fits():
    ranks = memory()
    first = ranks[0]
    parts = (first.weights, first.gradients, first.optimizer, first.activations, first.logits,
             first.overhead)  # fmt: skip
    assert first.total == pytest.approx(sum(parts))
    assert first.total_gib == pytest.approx(sum(parts) / 2**30)
    peak = max(m.total_gib for m in ranks)
    assert fits(ranks, peak) and not fits(ranks, peak - 0.01)
    assert fits([], 0.0)


def test_flop_costs_carry_the_default_calibration():
    flops = costs_from_flops(HANDBOOK.model, HANDBOOK.parallel)
    assert [m.total for m in memory(costs=flops)] == [m.total for m in memory()]


@pytest.mark.parametrize(
    ("parallel", "in_flight", "message"),
    [
        (replace(HANDBOOK.parallel, pp=2), ONE_F_ONE_B, "must agree"),
        (HANDBOOK.parallel, ONE_F_ONE_B[:3], "must agree"),
        (HANDBOOK.parallel, [{1: 2}, {0: 1}, {0: 1}, {0: 1}], r"PP rank 0 name chunks \[1\]"),
    ],
)
def test_inconsistent_inputs_are_refused(parallel, in_flight, message):
    with pytest.raises(ValueError, match=message):
        memory(parallel=parallel, in_flight=in_flight)


def test_quick_geglu_keeps_a_gated_mlps_activations():
    """--quick-geglu is gated (Megatron sets gated_linear_unit): its first projection is as
    wide as SwiGLU's, a third more than GeLU's."""
    gelu, quick = gpt().model, replace(gpt().model, quick_geglu=True)
    swiglu = replace(gelu, swiglu=True)
    parallel = gpt().parallel
    assert activation_bytes(quick, parallel, "t") == activation_bytes(swiglu, parallel, "t")
    ffn, tokens = GPT["ffn_hidden_size"], GPT["seq_length"] * parallel.micro_batch_size
    extra = activation_bytes(quick, parallel, "t") - activation_bytes(gelu, parallel, "t")
    assert extra == pytest.approx(2 * ffn * tokens / parallel.tp)


def test_static_state_follows_megatrons_bytes_per_parameter():
    dense = Params(tp_sharded=1000)
    plain = ParallelConfig(dp=4, use_distributed_optimizer=False)
    assert static_bytes(dense, plain).total == 1000 * 18
    distributed = ParallelConfig(dp=4)
    assert static_bytes(dense, distributed).total == 1000 * (6 + 12 / 4)
    tp2 = ParallelConfig(tp=2, dp=4)
    assert static_bytes(Params(tp_sharded=1000, replicated=10), tp2).weights == 2 * (500 + 10)


def test_expert_state_shards_by_ep_and_expert_dp():
    parallel = ParallelConfig(tp=2, ep=4, etp=1, dp=4, pp=2)  # world 16, expert-DP 2
    assert parallel.expert_dp == 2
    memory = static_bytes(Params(expert=8000), parallel)
    assert memory.weights == WEIGHT_BYTES * 2000
    assert memory.gradients == GRAD_BYTES * 2000
    assert memory.optimizer == OPTIMIZER_BYTES * 2000 / 2


def test_deepspeed_shards_expert_state_over_dp_over_ep_within_a_tp_rank():
    """DeepSpeed's expert-data-parallel groups (deepspeed/utils/groups.py) split each TP rank's
    DP group by EP, and its experts are whole on every TP rank: ZeRO shards their optimizer
    state over DP / EP, where megatron-core's grid shards it over TP x DP / EP."""
    megatron = ParallelConfig(tp=2, ep=4, etp=1, dp=8)
    deepspeed = ParallelConfig(tp=2, ep=4, etp=1, dp=8, expert_groups="deepspeed")
    assert (megatron.expert_dp, deepspeed.expert_dp) == (4, 2)
    experts = Params(expert=8000)
    memory = static_bytes(experts, deepspeed)
    assert memory.weights == WEIGHT_BYTES * 2000  # 8000 / EP, not split by TP
    assert memory.optimizer == OPTIMIZER_BYTES * 2000 / 2
    assert static_bytes(experts, megatron).optimizer == OPTIMIZER_BYTES * 2000 / 4
    unsharded = ParallelConfig(
        ep=4, dp=8, expert_groups="deepspeed", use_distributed_optimizer=False
    )
    assert static_bytes(experts, unsharded).optimizer == OPTIMIZER_BYTES * 2000  # no ZeRO
