"""Megatron-DeepSpeed's MoE read into the model (``dialects/deepspeed_moe.py``): short command
lines of our own through ``load_megatron_command_line`` (get_num_experts_per_layer's rule, top-1
on every other layer by default, PR-MoE, the teacher not trained, DeepSpeed's expert groups and
pipeline split), and its two real PR-MoE scripts, run by bash with every command stubbed, sized
to the DeepSpeed-MoE paper's counts."""

from __future__ import annotations

import pytest

from ray_layout.errors import ConfigError
from ray_layout.model.megatron_recipe import Overrides, load_megatron_command_line
from ray_layout.model.sizing import parameter_count
from tests.helpers.paths import SHARED_DATA
from tests.helpers.recorded_argv import launch_line, recorded_commands

BASE = (
    "deepspeed pretrain_gpt.py --num-layers 6 --hidden-size 64 --num-attention-heads 4 "
    "--seq-length 128 --max-position-embeddings 128 --vocab-size 1000 --deepspeed "
    "--deepspeed_config ds.json"
)
H, FFN = 64, 256  # Megatron-DeepSpeed's FFN is 4h without --swiglu
EXPERT = H * FFN + FFN + FFN * H + H  # GeLU MLP with biases


def load(extra: str = "", **sizes: int):
    return load_megatron_command_line(f"{BASE} {extra}", "t.sh", Overrides(sizes=sizes))


def test_one_expert_count_is_top1_on_every_other_layer():
    """--expert-interval defaults to 2: layers 2, 4, 6 (1-based) are MoE, top-1."""
    model = load("--num-experts 8").model
    assert model.moe_layer_pattern == (False, True) * 3
    assert (model.num_experts, model.moe_router_topk, model.moe_block) == (8, 1, "deepspeed")
    assert model.moe_ffn_hidden_size == FFN


def test_a_list_gives_each_moe_layer_its_experts():
    model = load("--num-experts 4 4 8 --moe-expert-parallel-size 4").model
    assert model.experts_per_layer == (0, 4, 0, 4, 0, 8)
    assert model.num_experts == 8
    plain = load("--num-experts 8 --moe-expert-parallel-size 4").model
    fewer = 2 * 4 * EXPERT + 2 * 4 * H  # two layers of 4 experts less, with their gates' rows
    assert parameter_count(plain).total - parameter_count(model).total == fewer


def test_the_issues_1_3b_moe_128_is_52b_not_104b():
    """One --num-experts value under --deepspeed: top-1 on every other layer (the paper's 52B),
    where core's reading (top-2 on every layer) made it 104B."""
    text = (
        "deepspeed pretrain_gpt.py --num-layers 24 --hidden-size 2048 --num-attention-heads 16 "
        "--seq-length 2048 --max-position-embeddings 2048 --num-experts 128 "
        "--moe-expert-parallel-size 128 --deepspeed --deepspeed_config x.json "
        "--no-pipeline-parallel"
    )
    recipe = load_megatron_command_line(text, overrides=Overrides(sizes={"vocab_size": 50257}))
    assert recipe.model.num_moe_layers == 12 and recipe.model.moe_router_topk == 1
    assert abs(parameter_count(recipe.model).total / 52e9 - 1) <= 0.015


def test_an_interval_and_topk_and_a_count_of_one_are_dense():
    model = load("--num-experts 1 8 --expert-interval 3 --topk 2").model
    assert model.moe_layer_pattern == (False,) * 5 + (True,)  # slot 1 has one expert: dense
    assert model.moe_router_topk == 2


def test_a_list_of_the_wrong_length_is_one_line():
    with pytest.raises(ConfigError, match=r"--num-experts has 2 values; .* one per MoE layer: 3"):
        load("--num-experts 4 8")


def test_pr_moe_adds_the_residual_mlp_and_its_coefficient():
    standard = parameter_count(load("--num-experts 8").model).total
    residual = parameter_count(load("--num-experts 8 --mlp-type residual").model).total
    assert residual - standard == 3 * (EXPERT + 2 * H + 2)


def test_the_gate_has_no_bias_though_the_linears_have():
    """deepspeed.moe TopKGate: Linear(h, E, bias=False), under Megatron's default biases."""
    model = load("--num-experts 8").model
    dense = load("").model
    moe_layer = parameter_count(model).total - parameter_count(dense).total
    assert moe_layer == 3 * (8 * EXPERT + 8 * H - (H * FFN + FFN + FFN * H + H))


def test_deepspeeds_expert_groups_and_zero_are_the_parallel_facts():
    recipe = load("--num-experts 8 --moe-expert-parallel-size 4 --tensor-model-parallel-size 2")
    p = recipe.parallel
    assert (p.expert_groups, p.ep, p.etp, p.tp) == ("deepspeed", 4, 1, 2)
    assert p.dp % p.ep == 0 and p.expert_dp == p.dp // p.ep  # each TP rank's DP split by EP
    assert p.use_distributed_optimizer  # ZeRO, with its stage in ds.json, said in a note
    assert any("ds.json" in note and "ZeRO-1" in note for note in recipe.notes)


def test_experts_that_do_not_divide_by_ep_are_refused_with_the_hint():
    with pytest.raises(ConfigError, match="MoE layers of 4 experts on expert-parallel size 8"):
        load("--num-experts 4 --moe-expert-parallel-size 8")
    assert load("--num-experts 4 --moe-expert-parallel-size 8", ep=4).parallel.ep == 4


def test_megatron_deepspeeds_own_spellings_of_the_model():
    model = load("--num-key-value-heads 2 --normalization rmsnorm --no-position-embedding "
                 "--use-rotary-position-embeddings --swiglu").model  # fmt: skip
    assert (model.num_query_groups, model.normalization) == (2, "RMSNorm")
    assert model.position_embedding_type == "rope"
    assert load("").model.position_embedding_type == "learned_absolute"  # its default


def test_the_teacher_is_not_trained_and_says_so():
    recipe = load("--num-experts 8 --mos --num-layers-teacher 12 --num-experts-teacher 8 8 8 8 8 8")
    assert any("teacher (12 layers" in note and "not trained" in note for note in recipe.notes)
    assert (
        parameter_count(recipe.model).total == parameter_count(load("--num-experts 8").model).total
    )


def test_the_pipeline_engine_splits_by_type_transformer():
    recipe = load("--num-experts 8 --pipeline-model-parallel-size 4")
    assert recipe.split.layout == "Et*2|t*2|t|tL"
    assert any("partition_method 'type:transformer'" in note for note in recipe.notes)
    legacy = load_megatron_command_line(
        BASE.replace(" --deepspeed ", " ") + " --num-experts 8 --pipeline-model-parallel-size 3"
    )
    assert legacy.split.layout == "Et*2|t*2|t*2L"  # its own even split, without the engine


def test_no_pipeline_parallel_needs_pp_1():
    with pytest.raises(ConfigError, match="--no-pipeline-parallel needs PP 1"):
        load("--no-pipeline-parallel --pipeline-model-parallel-size 2")


@pytest.mark.parametrize("flag", ["--enable-expert-tensor-parallelism", "--num-experts-switch 4"])
def test_what_is_not_modelled_is_refused(flag):
    with pytest.raises(ConfigError, match=f"{flag.split()[0]} is Megatron-DeepSpeed's"):
        load(f"--num-experts 8 {flag}")


SCRIPTS = SHARED_DATA / "real_launch_scripts"


def real_launch(name: str) -> str:
    path = SCRIPTS / name
    if not path.exists():
        pytest.skip(f"{path} is not here (../shared/data holds the real scripts)")
    return launch_line(recorded_commands(path))


def test_the_real_1_3b_pr_moe_64_128_script_sizes_to_31b():
    """24 layers, 64 x 10 then 128 x 2 experts on every other layer, PR-MoE; GPT-2's BPE
    vocabulary (50,257) is the hint a user gives."""
    text = real_launch("mds_ds_pretrain_gpt_1.3B_PR-MoE64or128.sh")
    recipe = load_megatron_command_line(text, overrides=Overrides(sizes={"vocab_size": 50257}))
    model = recipe.model
    assert model.moe_layer_experts == (64,) * 10 + (128,) * 2 and model.moe_residual
    assert abs(parameter_count(model).total / 31e9 - 1) <= 0.015


def test_the_real_350m_pr_moe_mos_script_sizes_to_3_5b():
    """The student: --num-layers 21, 32 x 8 then 64 x 2 experts; its EP 64 does not divide 32
    experts (DeepSpeed asserts it), so the hint is --ep 32; the 24-layer teacher is not sized."""
    text = real_launch("mds_ds_pretrain_gpt_350M_PR-MoE32or64_MoS.sh")
    with pytest.raises(ConfigError, match="give --ep N"):
        load_megatron_command_line(text, overrides=Overrides(sizes={"vocab_size": 50257}))
    hints = Overrides(sizes={"vocab_size": 50257, "ep": 32})
    recipe = load_megatron_command_line(text, overrides=hints)
    assert recipe.model.num_layers == 21 and recipe.model.num_moe_layers == 10
    assert abs(parameter_count(recipe.model).total / 3.5e9 - 1) <= 0.015
    assert any("teacher (24 layers" in note for note in recipe.notes)
