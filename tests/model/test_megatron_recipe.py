"""Recipes from Megatron command lines and scripts: bash expansion, argparse rules, Megatron's
defaults, the world size from torchrun, the split, the user's flags and environment."""

from __future__ import annotations

import shlex

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ray_layout.errors import ConfigError
from ray_layout.model.fields import MLAConfig, ModelSpec
from ray_layout.model.megatron_recipe import (
    Overrides,
    load_megatron_command_line,
    load_megatron_script,
)
from ray_layout.model.spec import ParallelConfig
from ray_layout.model.split import PipelineSplit
from tests.helpers.paths import TEST_DATA

DATA = TEST_DATA
BASE = "--num-layers 4 --hidden-size 256 --num-attention-heads 8 --seq-length 512 --vocab-size 1000"


def load(extra: str = "", prefix: str = "") -> tuple[ModelSpec, ParallelConfig]:
    recipe = load_megatron_command_line(f"{prefix} {BASE} {extra}")
    return recipe.model, recipe.parallel


def test_launch_script_fixture():
    recipe = load_megatron_script(DATA / "train_moe_16l.sh")
    # its exports, not its other variables (MASTER_ADDR, GPUS_PER_NODE, ...)
    assert recipe.environment == (("CUDA_DEVICE_MAX_CONNECTIONS", "1"), ("NCCL_IB_TIMEOUT", "19"))
    assert recipe.unresolved_environment == ()
    assert recipe.model == ModelSpec(
        name="train_moe_16l",
        num_layers=16,  # not the commented-out 24
        hidden_size=2048,
        num_attention_heads=32,
        ffn_hidden_size=6144,
        num_query_groups=4,
        kv_channels=128,
        seq_length=4096,
        vocab_size=151936,
        make_vocab_size_divisible_by=128,
        swiglu=True,
        normalization="RMSNorm",
        add_bias_linear=False,
        add_qkv_bias=False,
        qk_layernorm=True,
        position_embedding_type="rope",
        max_position_embeddings=0,
        untie_embeddings_and_output_weights=True,
        num_experts=64,
        moe_ffn_hidden_size=768,
        moe_router_topk=8,
        moe_shared_expert_intermediate_size=1536,
        moe_layer_pattern=(False,) * 2 + (True,) * 14,
        mtp_num_layers=1,
        mla=None,
    )
    # torchrun: 8 processes x 2 nodes = 16 = TP 2 x PP 4 x DP 2
    assert recipe.parallel == ParallelConfig(
        tp=2,
        pp=4,
        vpp=2,
        cp=1,
        ep=4,
        etp=1,
        dp=2,
        micro_batch_size=1,
        global_batch_size=256,
        use_distributed_optimizer=True,
    )


def test_megatron_defaults_differ_from_this_projects():
    model, parallel = load()
    assert model.name == "megatron-cmdline"
    assert model.swiglu is False
    assert model.normalization == "LayerNorm"
    assert model.add_bias_linear is True
    assert model.position_embedding_type == "learned_absolute"
    assert model.max_position_embeddings == 512  # Megatron: defaults to seq_length
    assert model.ffn_hidden_size == 4 * 256
    assert model.num_query_groups == 8
    assert parallel == ParallelConfig(use_distributed_optimizer=False)


def test_switches_and_equals_form():
    model, parallel = load(
        "--swiglu --disable-bias-linear --add-qkv-bias --qk-layernorm "
        "--untie-embeddings-and-output-weights --normalization=RMSNorm "
        "--position-embedding-type=rope --make-vocab-size-divisible-by=64 "
        "--use-distributed-optimizer --micro-batch-size=2 --global-batch-size 32"
    )
    assert model.swiglu and model.add_qkv_bias and model.qk_layernorm
    assert not model.add_bias_linear
    assert model.untie_embeddings_and_output_weights
    assert (model.normalization, model.position_embedding_type) == ("RMSNorm", "rope")
    assert model.make_vocab_size_divisible_by == 64
    assert parallel.use_distributed_optimizer
    assert (parallel.micro_batch_size, parallel.global_batch_size) == (2, 32)


def test_query_groups_need_group_query_attention_as_in_megatron():
    assert load("--num-query-groups 2")[0].num_query_groups == 8
    assert load("--group-query-attention --num-query-groups 2")[0].num_query_groups == 2
    assert load("--group-query-attention")[0].num_query_groups == 1  # Megatron's default


def test_mla_takes_megatron_defaults_for_unset_dims():
    model, _ = load("--multi-latent-attention --position-embedding-type rope --q-lora-rank 64")
    assert model.mla == MLAConfig(
        q_lora_rank=64, kv_lora_rank=32, qk_head_dim=128, qk_pos_emb_head_dim=64, v_head_dim=128
    )


def test_moe_flags_and_int_layer_freq():
    model, parallel = load(
        "--num-experts 8 --moe-router-topk 2 --moe-ffn-hidden-size 128 --moe-layer-freq 2 "
        "--expert-model-parallel-size 2 --expert-tensor-parallel-size 1"
    )
    assert model.moe_layer_pattern == (True, False, True, False)
    assert (model.num_experts, model.moe_router_topk, model.moe_ffn_hidden_size) == (8, 2, 128)
    assert (parallel.ep, parallel.etp) == (2, 1)


def test_expert_tp_defaults_to_tp():
    assert load("--tensor-model-parallel-size 2")[1].etp == 2


def test_unknown_world_takes_the_smallest_dp_the_experts_allow():
    _, parallel = load(
        "--num-experts 8 --expert-model-parallel-size 8 --expert-tensor-parallel-size 1 "
        "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2"
    )
    assert parallel.dp == 4  # TP 2 x DP 4 = ETP 1 x EP 8


def test_torchrun_sets_dp():
    prefix = "torchrun --nproc_per_node=8 --nnodes 2 --master_addr host pretrain_gpt.py"
    _, parallel = load("--tensor-model-parallel-size 2 --context-parallel-size 2", prefix)
    assert parallel.dp == 4


def test_virtual_stages_from_layers_per_virtual_stage():
    extra = "--pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 1"
    assert load(extra)[1].vpp == 2


def test_only_words_after_the_script_are_megatron_flags():
    prefix = "CUDA_DEVICE_MAX_CONNECTIONS=1 torchrun --rdzv-backend c10d scripts/pretrain_gpt.py"
    assert load("", prefix)[0].num_layers == 4


def test_typed_lists_switch_pairs_and_stray_words_parse():
    model, _ = load(
        "--data-path 0.3 /data/a 0.7 /data/b --lr 1e-4 --recompute-modules core_attn mlp "
        "--no-rl-skip-bos-token --moe-router-load-balancing-type aux_loss seq_aux_loss "
        "--rampup-batch-size 16 16 1000 --attention-backend flash 2>&1"
    )
    assert model.num_layers == 4


def test_variables_strings_arrays_and_defaults_expand():
    script = """
    LAYERS=4
    export HIDDEN=256
    SIZES="--num-attention-heads 8"
    SIZES+=" --seq-length ${SEQ:-512}"
    ARGS=(--num-layers $LAYERS)
    ARGS+=( --hidden-size ${HIDDEN} )
    EMPTY=""
    echo "start"; python pretrain_gpt.py "${ARGS[@]}" $SIZES --vocab-size ${EMPTY:-1000} > log &
    """
    model = load_megatron_command_line(script).model
    assert (model.num_layers, model.hidden_size, model.num_attention_heads) == (4, 256, 8)
    assert (model.seq_length, model.vocab_size) == (512, 1000)


def test_comment_ends_a_continued_command_as_in_bash():
    script = f"python pretrain_gpt.py {BASE} \\\n  # --swiglu \\\n  --qk-layernorm\n"
    model = load_megatron_command_line(script).model
    assert not model.swiglu and not model.qk_layernorm


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (BASE.replace("4", "$LAYERS", 1), "--num-layers uses $LAYERS, which the script does not"),
        (
            "L=$((2*N))\n" + BASE.replace("4", "${L}", 1),
            "--num-layers uses $N, which the script does not set (give --env N=VALUE)",
        ),
        (
            BASE.replace("4", "$(cat layers)", 1),
            "--num-layers uses $(cat layers) (runs cat (line 1), whose output",
        ),
        (
            "ARGS=(--num-layers $(nproc))\npython pretrain_gpt.py "
            "${ARGS[@]} " + BASE.replace("--num-layers 4", ""),
            "--num-layers uses $(nproc) (runs nproc (line 1), whose output needs",
        ),
        (f"{BASE} --tensor-model-parallel-size 0", "--tensor-model-parallel-size must be >= 1"),
        (BASE.replace("256", "big"), "--hidden-size needs a value of type int, got 'big'"),
        (f"{BASE} --normalization BatchNorm", "--normalization must be one of LayerNorm, RMSNorm"),
        (f"{BASE} --seq-length", "--seq-length expects 1 value, got 0"),
        (f"{BASE} --rampup-batch-size 1 2", "--rampup-batch-size expects 3 values, got 2"),
        (f"{BASE} --swiglu=true", "--swiglu takes no value"),
        (BASE.replace("--num-layers 4", ""), "has no --num-layers"),
        (
            BASE.replace("--vocab-size 1000", "--tokenizer-type HuggingFaceTokenizer"),
            "give --vocab-size N (Megatron reads the vocabulary from the HuggingFaceTokenizer",
        ),
        (
            f"torchrun --nnodes=1:4 pretrain_gpt.py {BASE}",
            "torchrun --nnodes '1:4' is not a fixed count",
        ),
        (f"torchrun --nproc_per_node $GPUS pretrain_gpt.py {BASE}", "--nproc_per_node uses $GPUS"),
        (
            f"torchrun --nproc_per_node 6 pretrain_gpt.py {BASE} --pipeline-model-parallel-size 4",
            "world size 6 is not divisible by TP·CP·PP = 4",
        ),
        (
            f"{BASE} --pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 3",
            "does not evenly split 4 layers over 2 pipeline stages",
        ),
        (
            f"{BASE} --num-layers-per-virtual-pipeline-stage 1 "
            "--num-virtual-stages-per-pipeline-rank 2",
            "Megatron accepts at most one of --num-layers-per-virtual-pipeline-stage",
        ),
        ("ARGS=(--num-layers 4\n", "an array's '(' is never closed"),
        ('python pretrain_gpt.py --split "99,1', "a quotation is never closed"),
    ],
)
def test_errors_name_the_problem(text, message):
    with pytest.raises(ConfigError) as info:
        load_megatron_command_line(text)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_unresolved_variable_of_an_unused_flag_is_fine():
    model, _ = load("--save $CKPT/run --lr $LR --data-path $DATA")
    assert model.num_layers == 4


def test_missing_script_file():
    with pytest.raises(ConfigError, match="cannot read"):
        load_megatron_script(DATA / "no_such_script.sh")


def test_null_tokenizer_vocab_and_layout_vpp_follow_megatron():
    text = (
        "pretrain_gpt.py --num-layers 8 --hidden-size 64 --num-attention-heads 4 "
        "--seq-length 128 --vocab-size 999 --tokenizer-type NullTokenizer "
        "--pipeline-model-parallel-size 2 --pipeline-model-parallel-layout 'Ett|tt|tt|ttL'"
    )
    recipe = load_megatron_command_line(text)
    assert recipe.model.vocab_size == 1000  # NullTokenizer: --vocab-size + end of document
    assert recipe.parallel.vpp == 2  # four stages on PP=2
    with pytest.raises(ConfigError, match="pipeline-model-parallel-layout"):
        load_megatron_command_line(text.replace("'Ett|tt|tt|ttL'", "'Etx|L'"))


def test_exports_carry_plain_values_and_name_what_has_none():
    script = "\n".join([
        "A=1", "export A",  # exported after it is set
        'export B=$(hostname) C="x y" D=${A}0',  # several on one line, quoted, referring
        "E=2",  # set, never exported
        "ARR=(1 2)", "export ARR",  # an array has no plain value to export
        "export F; F=3",  # exported before it is set, as bash allows
        f"torchrun pretrain_gpt.py {BASE}",
    ])  # fmt: skip
    recipe = load_megatron_command_line(script)
    assert recipe.environment == (("A", "1"), ("C", "x y"), ("D", "10"), ("F", "3"))
    assert recipe.unresolved_environment == ("ARR", "B")
    assert load_megatron_command_line(f"pretrain_gpt.py {BASE}").environment == ()


@given(
    st.dictionaries(
        st.from_regex(r"[A-Z_][A-Z0-9_]{0,12}", fullmatch=True),
        st.from_regex(r"[A-Za-z0-9_./:,-]{1,20}", fullmatch=True),
        max_size=5,
    )
)
def test_exported_plain_values_round_trip(exports):
    lines = [f"export {name}={shlex.quote(value)}" for name, value in exports.items()]
    recipe = load_megatron_command_line("\n".join([*lines, f"pretrain_gpt.py {BASE}"]))
    assert dict(recipe.environment) == exports and recipe.unresolved_environment == ()


def test_overrides_go_in_before_anything_is_checked():
    """The job's environment fills torchrun's --nnodes; a new PP drops the split it cannot keep."""
    script = (
        f"torchrun --nnodes $NN --nproc_per_node 4 pretrain_gpt.py {BASE.replace('4', '8', 1)} "
        "--pipeline-model-parallel-size 2 --decoder-first-pipeline-num-layers 3"
    )
    recipe = load_megatron_command_line(
        script, overrides=Overrides(environment={"NN": "2"}, sizes={"pp": 4})
    )
    assert (recipe.parallel.pp, recipe.parallel.dp) == (4, 2)  # 2 nodes x 4 = PP 4 x DP 2
    assert recipe.split == PipelineSplit()
    assert recipe.notes == (
        "--pp replaces the script's pipeline split (--decoder-first-pipeline-num-layers): "
        "no current layout",
    )
    kept = load_megatron_command_line(script, overrides=Overrides(sizes={"pp": 2, "dp": 1}))
    assert kept.split.first_stage_layers == 3  # the same PP keeps it
    assert kept.notes == ("command line: taken as empty, as bash does (never set): $NN",)


def test_a_size_override_stands_for_a_flag_the_environment_gives():
    text = BASE.replace("--seq-length 512", "--seq-length $S")
    recipe = load_megatron_command_line(
        f"python pretrain_gpt.py {text}", overrides=Overrides(sizes={"seq_length": 64, "dp": 3})
    )
    assert (recipe.model.seq_length, recipe.parallel.dp) == (64, 3)
    (left_out,) = recipe.unresolved_arguments
    assert (left_out.flag, left_out.text, left_out.where) == (
        "--seq-length",
        "--seq-length $S",
        "command line:1",
    )
    assert "$S, which the script does not set" in left_out.reason


def test_the_users_flags_are_carried_as_written_with_notes_on_what_is_not_megatrons():
    recipe = load_megatron_command_line(
        f"OMP_NUM_THREADS=4 python pretrain_gpt.py {BASE} --my-flag 3 --lr=1e-4 --bf16"
    )
    assert recipe.megatron_args == (*BASE.split(), "--my-flag", "3", "--lr=1e-4", "--bf16")
    assert recipe.environment == (("OMP_NUM_THREADS", "4"),)
    assert recipe.notes == (
        "command line: --my-flag unknown to Megatron core_v0.16.1's flag table: passed through "
        "as written (tune checks them against the cluster's own Megatron)",
        "command line: the launch line sets OMP_NUM_THREADS for the job: they go into every "
        "rank's environment, as its exports do",
    )


def test_a_script_is_named_after_its_file_and_a_model_file_asks_for_what_it_lacks(tmp_path):
    path = tmp_path / "my_model.sh"
    path.write_text(f"MODEL_ARGS=({BASE})\n")
    assert load_megatron_script(path).model.name == "my_model"
    path.write_text("MODEL_ARGS=(--num-layers 4 --num-attention-heads 8)\n")
    with pytest.raises(ConfigError, match=r"the model file has no --hidden-size$"):
        load_megatron_script(path)
    path.write_text("MODEL_ARGS=(--num-layers 4 --num-attention-heads 8 --hidden-size 64)\n")
    with pytest.raises(ConfigError, match=r": give --seq-length N and --vocab-size N$"):
        load_megatron_script(path)


@pytest.mark.parametrize("launcher", ["--nnodes=$NN", "--nnodes $NN", "--nnodes=${NN}"])
def test_a_torchrun_size_from_the_environment_names_the_variable(launcher):
    with pytest.raises(ConfigError) as info:
        load_megatron_command_line(f"torchrun {launcher} pretrain_gpt.py {BASE}")
    assert str(info.value) == (
        "command line:1: torchrun --nnodes uses $NN, which the script does not set "
        "(give --env NN=VALUE, or --dp)"
    )
    recipe = load_megatron_command_line(
        f"torchrun {launcher} --nproc_per_node 2 pretrain_gpt.py {BASE}",
        overrides=Overrides(environment={"NN": "3"}),
    )
    assert recipe.parallel.dp == 6


def test_a_torchrun_size_only_a_shell_has_asks_for_dp():
    with pytest.raises(
        ConfigError, match=r"uses \$\(nproc\) \(runs nproc \(line 1\), whose output"
    ):
        load_megatron_command_line(f"torchrun --nproc_per_node=$(nproc) pretrain_gpt.py {BASE}")
    with pytest.raises(ConfigError, match=r"needs a real shell\): give --dp$"):
        load_megatron_command_line(f"torchrun --nproc_per_node=$(nproc) pretrain_gpt.py {BASE}")


@pytest.mark.parametrize("flag", ["--seq-length=$S", "--seq-length=${S}", '--seq-length="$S"'])
def test_a_flag_whose_inline_value_the_environment_gives(flag):
    text = f"python pretrain_gpt.py {BASE.replace('--seq-length 512', flag)}"
    with pytest.raises(ConfigError) as info:
        load_megatron_command_line(text)
    assert str(info.value) == (
        "command line:1: --seq-length uses $S, which the script does not set (give --env S=VALUE)"
    )
    overridden = load_megatron_command_line(text, overrides=Overrides(sizes={"seq_length": 64}))
    assert overridden.model.seq_length == 64
    given = load_megatron_command_line(text, overrides=Overrides(environment={"S": "128"}))
    assert given.model.seq_length == 128


def test_a_passed_on_flag_with_an_unset_variable_is_what_bash_passes():
    recipe = load_megatron_command_line(f"python pretrain_gpt.py {BASE} --save $CKPT/run")
    assert recipe.megatron_args[-2:] == ("--save", "/run")


def test_quick_geglu_and_attention_sinks_read_off_a_command_line():
    """gpt-oss's flags: --quick-geglu is the gated MLP (without --swiglu, Megatron's default
    then), --softmax-type learnable the sinks, and both switches together are refused."""
    model, _ = load("--quick-geglu --softmax-type learnable")
    assert model.quick_geglu and not model.swiglu and model.gated_linear_unit
    assert model.softmax_type == "learnable"
    with pytest.raises(ConfigError, match="swiglu and quick_geglu are both set"):
        load("--quick-geglu --swiglu")
