"""block_flags: an arguments block as the command line that makes the same run, in the flags of
the run's own Megatron (core_v0.16.1's table, or a fork's)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ray_layout.errors import ConfigError
from ray_layout.model.loading import load_recipe
from ray_layout.model.run_log_flags import BlockFlags, block_flags, check_deepspeed_moe
from tests.helpers.paths import SHARED_DATA

MDS_MOE = SHARED_DATA / "real_megatron_logs" / "args_01_mds_gpt125m_moe64_2022.log"
SHAPE = {"num_layers": "12", "hidden_size": "768", "num_attention_heads": "12"}


def flags(**values: str) -> BlockFlags:
    """The block of ``values`` (each on its own line, from line 10), as flags."""
    entries = SHAPE | values
    return block_flags(entries, {k: 10 + i for i, k in enumerate(entries)}, "run.log")


def words(**values: str) -> list[str]:
    return list(flags(**values).words)


def test_a_switch_is_written_only_where_it_is_not_the_default():
    assert "--swiglu" in words(swiglu="True")  # store_true, default False
    assert "--swiglu" not in words(swiglu="False")
    assert "--disable-bias-linear" in words(add_bias_linear="False")  # store_false, default True
    assert "--disable-bias-linear" not in words(add_bias_linear="True")
    assert "--no-async-tensor-model-parallel-allreduce" in words(
        async_tensor_model_parallel_allreduce="False"
    )  # the first of its two spellings
    assert words(no_load_optim="None", fp16="False") == words()


def test_values_as_the_flag_takes_them():
    got = words(
        ffn_hidden_size="3072",
        data_path="['1', '/data/a b', '2', '/data/c']",
        retriever_report_topk_accuracies="[]",
        attention_backend="AttnBackend.flash",
        exp_avg_dtype="torch.bfloat16",
        normalization="rmsnorm",
        moe_layer_freq="[0, 1, 1, 1]",
        lr="0.00015",
        initial_loss_scale="4294967296",  # the default, printed as an int of a float flag
        seed="1234",
        tokenizer_model="-tok.model",  # would read as a flag: written inline
    )
    assert got[6:] == [
        "--ffn-hidden-size", "3072",
        "--data-path", "1", "/data/a b", "2", "/data/c",
        "--attention-backend", "flash",
        "--exp-avg-dtype", "bf16",
        "--normalization", "RMSNorm",
        "--moe-layer-freq", "[0,1,1,1]",
        "--lr", "0.00015",
        "--tokenizer-model=-tok.model",
    ]  # fmt: skip


def test_what_megatron_derives_is_left_out():
    derived = dict(
        rank="0",
        world_size="8",
        data_parallel_size="2",
        encoder_num_layers="12",  # Megatron refuses it beside --num-layers
        encoder_seq_length="2048",
        transformer_pipeline_model_parallel_size="2",
        params_dtype="torch.float16",
        consumed_train_samples="0",
        weight_decay_incr_style="constant",
        start_weight_decay="0.1",  # asserted unset with a constant decay
        end_weight_decay="0.1",
        overlap_p2p_comm="False",  # turned off without an interleaved schedule
        local_rank="3",
    )
    assert words(**derived) == words()
    assert "--no-overlap-p2p-communication" in words(
        overlap_p2p_comm="False", num_layers_per_virtual_pipeline_stage="2"
    )


def test_a_fork_s_vpp_size_becomes_core_s_virtual_stages():
    assert words(virtual_pipeline_model_parallel_size="2")[-2:] == [
        "--num-virtual-stages-per-pipeline-rank",
        "2",
    ]
    assert "--num-virtual-stages-per-pipeline-rank" not in words(
        virtual_pipeline_model_parallel_size="2", pipeline_model_parallel_layout="Et|t*11L"
    )


def test_older_megatron_lm_keys_become_core_s():
    assert words(use_rotary_position_embeddings="True", add_position_embedding="False")[-2:] == [
        "--position-embedding-type",
        "rope",
    ]
    assert words(add_position_embedding="False")[-2:] == ["--position-embedding-type", "none"]
    assert words(add_position_embedding="True", use_rotary_position_embeddings="False") == words()
    with pytest.raises(ConfigError, match=r"^run\.log:13: add_position_embedding True with rota"):
        words(add_position_embedding="True", use_rotary_position_embeddings="True")
    recompute = words(checkpoint_activations="True", checkpoint_num_layers="2")
    assert recompute[-6:] == [
        "--recompute-granularity", "full", "--recompute-method", "uniform",
        "--recompute-num-layers", "2",
    ]  # fmt: skip
    assert "--recompute-num-layers" not in words(recompute_num_layers="1")  # no granularity
    assert "--apply-layernorm-1p" in words(apply_layernorm_1p="True")
    assert "--num-query-groups" not in words(num_query_groups="4")  # ignored without GQA


def test_keys_of_no_table_are_noted_or_refused_by_what_they_may_size():
    got = flags(data_impl="mmap", DDP_impl="local", fp8_hybrid="False")
    assert "--data-impl" not in got.words
    (note,) = got.notes
    assert "2 keys of the arguments block set no flag of Megatron core_v0.16.1's table" in note
    assert note.endswith("not carried: data_impl, DDP_impl")
    with pytest.raises(ConfigError, match=r"^run\.log:13: extra_dense_layers '2' is in no flag"):
        words(extra_dense_layers="2")  # a fork's, whose name speaks of the model's shape
    with pytest.raises(ConfigError, match=r"^run\.log:13: standalone_embedding_stage 'True'"):
        words(standalone_embedding_stage="True")
    assert words(standalone_embedding_stage="False", extra_dense_layers="None") == words()


def test_other_models_keys_are_never_written():
    other = dict(
        retro_encoder_layers="2",
        dino_head_hidden_size="2048",
        num_layers_teacher="None",
        hidden_size_teacher="4096",
        img_h="224",
    )
    assert flags(**other) == flags()
    with pytest.raises(ConfigError, match="retro_add_retriever 'True'"):
        words(retro_add_retriever="True")


def test_a_value_the_table_refuses_is_an_error_for_the_model_and_a_note_else():
    with pytest.raises(ConfigError, match=r"^run\.log:13: --normalization must be one of"):
        words(normalization="FooNorm")
    got = flags(optimizer="lamb")  # not a choice of core's: a fork's optimizer
    assert "--optimizer" not in got.words and got.notes[0].endswith("not carried: optimizer")


def test_a_megatron_deepspeed_block_is_written_in_its_flags():
    ds = dict(
        num_experts="[64]",
        topk="1",
        expert_interval="2",
        mlp_type="standard",
        moe_expert_parallel_size="4",
        moe_token_dropping="True",
        normalization="rmsnorm",
        num_key_value_heads="4",
        deepspeed="True",
        no_pipeline_parallel="False",
    )
    got = flags(**ds)
    assert got.words[6:] == (
        "--num-experts", "64", "--topk", "1", "--expert-interval", "2", "--mlp-type", "standard",
        "--moe-expert-parallel-size", "4", "--normalization", "rmsnorm",
        "--num-key-value-heads", "4", "--deepspeed",
    )  # fmt: skip
    assert got.lines["--topk"] == 14
    moe = got.deepspeed_moe
    assert moe is not None and moe.experts == (1, 64) * 6
    assert (moe.topk, moe.residual, moe.ep) == (1, False, 4)
    assert "--disable-moe-token-dropping" in words(**ds | {"moe_token_dropping": "False"})
    assert flags(**ds | {"num_experts": "[1]"}).deepspeed_moe is None  # dense
    with pytest.raises(ConfigError, match=r"num_experts '\[8, 8\]' is neither one count nor"):
        flags(**ds | {"num_experts": "[8, 8]"})


def test_the_deepspeed_moe_reading_is_checked_key_by_key():
    if not MDS_MOE.exists():
        pytest.skip(f"{MDS_MOE} is not on this machine (the shared real-log fixtures)")
    recipe = load_recipe(str(MDS_MOE))
    moe = flags(num_experts="[64]", topk="1", moe_expert_parallel_size="4").deepspeed_moe
    assert moe is not None
    check_deepspeed_moe(moe, recipe, set(), "run.log")
    for key, wrong in (
        ("topk", replace(moe, topk=2)),
        ("expert_interval", replace(moe, experts=(64,) * 12)),
        ("num_experts", replace(moe, experts=(1, 32) * 6)),
        ("mlp_type", replace(moe, residual=True)),
        ("moe_expert_parallel_size", replace(moe, ep=2)),
    ):
        with pytest.raises(ConfigError, match=rf"^run\.log:\d+: {key} .* refused rather than"):
            check_deepspeed_moe(wrong, recipe, set(), "run.log")
    check_deepspeed_moe(replace(moe, ep=2), recipe, {"ep"}, "run.log")  # the user's --ep
