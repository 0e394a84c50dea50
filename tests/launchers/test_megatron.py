"""The Megatron launch of one rank: arguments checked against Megatron's flag table and loaded
back into the same recipe, the command, and the environment torchrun would have set."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import replace

import pytest

from launchers.megatron import (
    MegatronRunSettings,
    environment_notes,
    megatron_arguments,
    megatron_command,
    rank_environment,
)
from ray_layout.errors import ConfigError
from ray_layout.model.hf_config import load_hf_config
from ray_layout.model.layout import Layout
from ray_layout.model.megatron_args import check_arguments
from ray_layout.model.megatron_recipe import load_megatron_command_line
from ray_layout.model.spec import (
    ParallelConfig,
    Recipe,
    build_parallel,
    build_recipe,
    load_recipe_file,
    with_parallel,
)
from ray_layout.model.split import PipelineSplit
from tests.helpers.paths import HF_CONFIGS, ROOT

HF = HF_CONFIGS
FLAG_TABLE = ROOT / "ray_layout" / "model" / "data" / "megatron_args_core_v0.16.1.json"
LAYOUT_FLAG = "--pipeline-model-parallel-layout"


def handbook() -> tuple[Recipe, Layout | None]:
    """TP 1, PP 4, EP 2, DP 2; the published pick for this recipe on 4 stages."""
    return load_recipe_file(ROOT / "configs" / "handbook_7b_a1b.yaml"), Layout.parse(
        "Et*5|t*6|t*5|mL", 4
    )


def deepseek_v3() -> tuple[Recipe, Layout | None]:
    """MLA, 3 dense layers first, MTP, untied output layer; TP 2 needs sequence parallelism."""
    model = load_hf_config(HF / "DeepSeek-V3" / "config.json").model
    parallel = build_parallel(
        model, {"tp": 2, "pp": 8, "ep": 8, "dp": 4, "micro_batch_size": 1, "global_batch_size": 64}
    )
    return Recipe(model, parallel), Layout.parse("Et*7|(t*8|)*6t*6mL", 8)


def mixtral() -> tuple[Recipe, Layout | None]:
    """Every layer MoE, no MTP; VPP 2 without a layout string."""
    model = load_hf_config(HF / "Mixtral-8x7B-v0.1" / "config.json").model
    sizes = {"tp": 2, "pp": 4, "vpp": 2, "ep": 8, "dp": 4, "global_batch_size": 32}
    return Recipe(model, build_parallel(model, sizes)), None


def dense_gpt() -> tuple[Recipe, Layout | None]:
    """GPT-2 style: LayerNorm, biases, GeLU, learned positions, tied embeddings; TP and CP."""
    model = {
        "name": "gpt",
        "num_layers": 12,
        "hidden_size": 768,
        "num_attention_heads": 12,
        "seq_length": 1024,
        "vocab_size": 50257,
        "swiglu": False,
        "normalization": "LayerNorm",
        "add_bias_linear": True,
        "position_embedding_type": "learned_absolute",
    }
    sizes = {"tp": 2, "cp": 2, "pp": 2, "dp": 2, "global_batch_size": 16}
    return build_recipe(model, sizes | {"use_distributed_optimizer": False}, source="gpt"), None


CASES = [handbook, deepseek_v3, mixtral, dense_gpt]
SETTINGS = MegatronRunSettings()


def arguments(case, user_args: tuple[str, ...] = ()) -> list[str]:
    """The rank's arguments for a case, with ``user_args`` as the user's own flags."""
    recipe, layout = case()
    return argv(replace(recipe, megatron_args=user_args), layout)


def argv(
    recipe: Recipe, layout: Layout | None, settings: MegatronRunSettings = SETTINGS
) -> list[str]:
    return list(megatron_arguments(recipe, layout, settings).argv)


def values(args: list[str], flag: str) -> list[str]:
    """Every value given to ``flag`` (a switch counts as an empty string)."""
    found = []
    for i, word in enumerate(args):
        if word == flag:
            following = args[i + 1] if i + 1 < len(args) else "--"
            found.append("" if following.startswith("--") else following)
    return found


def value(args: list[str], flag: str) -> str:
    (only,) = values(args, flag)
    return only


@pytest.mark.parametrize("case", CASES)
def test_arguments_pass_the_checker(case):
    args = arguments(case)
    assert all(isinstance(word, str) for word in args)
    check_arguments(args, "test")


@pytest.mark.parametrize("case", CASES)
def test_every_flag_and_value_against_the_table(case):
    """An independent walk over the JSON dump of Megatron's parser: each flag exists and appears
    once, switches take nothing, every other flag takes one value of its type and choices."""
    table = {flag: entry for entry in json.loads(FLAG_TABLE.read_text()) for flag in entry["flags"]}
    args = arguments(case)
    flags = [word for word in args if word.startswith("--")]
    assert len(flags) == len(set(flags))
    i = 0
    while i < len(args):
        entry = table[args[i]]
        if entry["nargs"] == 0:
            i += 1
            continue
        assert entry["nargs"] is None, args[i]
        text = args[i + 1]
        if entry["type"] == "moe_freq_type":
            assert re.fullmatch(r"\d+|\((\[[01]\]\*\d+)(\+\[[01]\]\*\d+)*\)", text)
        else:
            typed = {"int": int, "float": float, "str": str}[entry["type"]](text)
            assert entry["choices"] is None or typed in entry["choices"], (args[i], text)
        i += 2


@pytest.mark.parametrize("case", CASES)
def test_round_trip_through_the_command_line_loader(case):
    recipe, layout = case()
    args = argv(recipe, layout)
    # torchrun's process count gives the loader the world size, hence DP.
    world = str(recipe.parallel.world_size)
    text = shlex.join(["torchrun", "--nproc_per_node", world, "pretrain_gpt.py", *args])
    loaded = load_megatron_command_line(text)
    # the loader adds back the end-of-document token the NullTokenizer puts on --vocab-size
    model = replace(loaded.model, name=recipe.model.name)
    assert model == recipe.model
    assert loaded.parallel == recipe.parallel


def test_model_flags():
    ds = arguments(deepseek_v3)
    assert value(ds, "--moe-layer-freq") == "([0]*3+[1]*58)"
    assert value(ds, "--mtp-num-layers") == "1"
    assert value(ds, "--q-lora-rank") == "1536"
    assert value(ds, "--moe-shared-expert-intermediate-size") == "2048"
    for switch in ("--untie-embeddings-and-output-weights", "--multi-latent-attention"):
        assert value(ds, switch) == ""
    assert values(ds, "--group-query-attention") == []  # 128 query groups for 128 heads
    hb = arguments(handbook)
    assert value(hb, "--moe-layer-freq") == "1"
    assert value(hb, "--num-query-groups") == "2"
    assert value(hb, "--vocab-size") == "128255"
    assert value(hb, "--moe-token-dispatcher-type") == "alltoall"
    assert values(hb, "--moe-shared-expert-intermediate-size") == []
    assert values(hb, "--sequence-parallel") == []  # TP 1
    gpt = arguments(dense_gpt)
    assert value(gpt, "--max-position-embeddings") == "1024"
    assert value(gpt, "--sequence-parallel") == ""
    for absent in ("--swiglu", "--disable-bias-linear", "--num-experts", "--moe-layer-freq"):
        assert values(gpt, absent) == []


@pytest.mark.parametrize(
    ("freq", "expected"), [(2, "2"), ([1, 1, 0, 0, 1, 1, 0, 0], "([1]*2+[0]*2+[1]*2+[0]*2)")]
)
def test_moe_layer_freq_int_or_list_expression(freq, expected):
    model = {"num_layers": 8, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 128}
    model |= {"vocab_size": 1000, "num_experts": 4, "moe_layer_freq": freq}
    recipe = build_recipe(model, source="test")
    args = argv(recipe, None)
    assert value(args, "--moe-layer-freq") == expected
    loaded = load_megatron_command_line(shlex.join(["pretrain_gpt.py", *args]))
    assert loaded.model.moe_layer_pattern == recipe.model.moe_layer_pattern


def test_training_flags_for_a_mock_data_profile_run():
    args = arguments(handbook)
    for switch in ("--mock-data", "--bf16", "--log-throughput", "--use-distributed-optimizer"):
        assert value(args, switch) == ""
    assert value(args, "--tokenizer-type") == "NullTokenizer"
    assert value(args, "--train-iters") == "20"
    assert value(args, "--eval-iters") == "0"
    assert value(args, "--log-interval") == "1"
    assert value(args, "--timing-log-level") == "2"
    assert value(args, "--timing-log-option") == "all"
    assert value(args, "--lr-decay-style") == "constant"
    assert values(args, "--save") == []


def test_layout_string_verbatim_and_parses_back():
    recipe, _ = handbook()
    layout = Layout.parse("Ett|tt|tt|tt|tt|tt|tt|ttmL", 4)
    args = argv(with_parallel(recipe, vpp=2), layout)
    assert value(args, LAYOUT_FLAG) == str(layout)
    assert Layout.parse(value(args, LAYOUT_FLAG), 4) == layout
    for split in ("--num-virtual-stages-per-pipeline-rank", "--decoder-first-pipeline-num-layers"):
        assert values(args, split) == []


def test_vpp_without_layout_uses_virtual_stages():
    args = arguments(mixtral)
    assert value(args, "--num-virtual-stages-per-pipeline-rank") == "2"
    assert values(args, LAYOUT_FLAG) == []


@pytest.mark.parametrize(
    ("text", "pp", "vpp", "message"),
    [
        ("Et*8|t*8mL", 2, 1, "PP=2 VPP=1, the recipe has PP=4 VPP=1"),
        ("Ett|tt|tt|tt|tt|tt|tt|ttmL", 4, 1, "PP=4 VPP=2, the recipe has PP=4 VPP=1"),
        ("Et*5|t*6|t*6|mL", 4, 1, "17 decoder layers t, the model has 16"),
    ],
)
def test_layout_for_other_sizes_or_rejected_by_megatron(text, pp, vpp, message):
    recipe, _ = handbook()
    with pytest.raises(ConfigError, match=re.escape(message)):
        argv(recipe, Layout.parse(text, pp))


def test_the_users_flags_pass_through_and_the_tuners_replace_theirs():
    extra = ("--train-iters", "50", "--moe-grouped-gemm", "--lr", "3e-4", "--save", "/ckpt")
    recipe, _ = handbook()
    merged = megatron_arguments(replace(recipe, megatron_args=extra), None, SETTINGS)
    args = list(merged.argv)
    assert values(args, "--train-iters") == ["20"]  # the tuner's iterations
    assert values(args, "--lr") == ["3e-4"] and values(args, "--moe-grouped-gemm") == [""]
    assert values(args, "--save") == []
    assert merged.notes == (
        "replaced --train-iters 50 with 20",
        "removed --save /ckpt (checkpoint: the tuner's)",
    )


def test_a_flag_the_bundled_table_does_not_know_goes_through_as_written():
    """Megatron moves fast (``--megatron-fsdp-*``): the cluster's own table decides in tune."""
    args = arguments(handbook, ("--moe-grouped-gem", "--enable-gpt-oss-x", "on"))
    assert args[-3:] == ["--moe-grouped-gem", "--enable-gpt-oss-x", "on"]


def test_the_users_split_flags_give_way_to_a_layout_and_stay_without_one():
    extra = ("--decoder-first-pipeline-num-layers", "3", "--decoder-last-pipeline-num-layers", "5")
    args = arguments(handbook, extra)
    assert values(args, "--decoder-first-pipeline-num-layers") == []
    assert value(args, LAYOUT_FLAG) == "Et*5|t*6|t*5|mL"
    recipe, _ = handbook()
    split = PipelineSplit(first_stage_layers=3, last_stage_layers=5)
    args = argv(replace(recipe, megatron_args=extra, split=split), None)  # Megatron's own split
    assert value(args, "--decoder-first-pipeline-num-layers") == "3"
    assert values(args, "--decoder-first-pipeline-num-layers") == ["3"]  # given once
    assert values(args, LAYOUT_FLAG) == []


def test_the_default_arm_of_a_vpp_script_never_gets_both_vpp_flags():
    recipe, _ = handbook()
    recipe = replace(recipe, parallel=replace(recipe.parallel, vpp=2),
                     megatron_args=("--num-layers-per-virtual-pipeline-stage", "2"),
                     split=PipelineSplit(layers_per_virtual_stage=2))  # fmt: skip
    args = argv(recipe, None)
    assert values(args, "--num-layers-per-virtual-pipeline-stage") == []
    assert value(args, "--num-virtual-stages-per-pipeline-rank") == "2"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--num-layer", "4"], "unknown Megatron flag --num-layer"),
        (["--bf16", "yes"], "argument 'yes' is not a flag"),
        (["--bf16=1"], "--bf16 takes no value"),
        (["--seed"], "--seed expects 1 value, got 0"),
        (["--seed", "--bf16"], "--seed expects 1 value, got 0"),
        (["--train-iters", "ten"], "--train-iters needs a value of type int, got 'ten'"),
        (["--lr", "$LR"], "--lr needs a value of type float, got '$LR'"),
        (["--timing-log-level", "3"], "--timing-log-level must be one of 0, 1, 2, got '3'"),
        (["--moe-router-load-balancing-type", "aux_loss", "bogus"], "got 'bogus'"),
        (["--rampup-batch-size", "16", "16"], "--rampup-batch-size expects 3 values, got 2"),
    ],
)
def test_check_arguments_errors(args, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        check_arguments(args, "test")


def test_check_arguments_follows_argparse():
    check_arguments(
        [
            "--lr=3e-4",
            "--min-lr",
            "-0",  # a negative number is a value, not a flag
            "--moe-router-load-balancing-type",
            "aux_loss",
            "seq_aux_loss",
            "--data-path",  # nargs '*': no value is fine
            "--rampup-batch-size",
            "16",
            "16",
            "1000",
            "--no-rl-use-sequence-packing",
        ],
        "test",
    )


def test_profile_settings():
    with pytest.raises(ConfigError, match="train_iters and log_interval must be >= 1"):
        MegatronRunSettings(train_iters=0)
    recipe, layout = handbook()
    with pytest.raises(ConfigError, match="--timing-log-option must be one of max, minmax, all"):
        argv(recipe, layout, MegatronRunSettings(timing_log_option="sum"))


def test_megatron_command(tmp_path):
    with pytest.raises(ConfigError, match=r"pretrain_gpt.py not found: .*/opt/megatron-lm"):
        megatron_command("python3", tmp_path, ["--bf16"])
    (tmp_path / "pretrain_gpt.py").touch()
    command = megatron_command("python3", tmp_path, ["--bf16"])
    assert command == ["python3", str(tmp_path / "pretrain_gpt.py"), "--bf16"]


def test_environment_notes_say_what_became_of_each_export():
    recipe, _ = handbook()
    assert environment_notes(recipe) == ()
    exported = replace(recipe, environment=(("MASTER_PORT", "6000"), ("NCCL_IB_TIMEOUT", "19")),
                       unresolved_environment=("NODE_RANK",))  # fmt: skip
    assert environment_notes(exported) == (
        "exports carried into every rank: NCCL_IB_TIMEOUT=19",
        "exports the launch sets per rank instead: MASTER_PORT",
        "exports left out, without a plain value in the script: NODE_RANK (set them in the "
        "cluster's environment)",
    )


def test_rank_environment():
    parallel = ParallelConfig(tp=2, pp=2, dp=2)
    base = {"PATH": "/usr/bin", "RANK": "7", "CUDA_VISIBLE_DEVICES": "0,1", "OMP_NUM_THREADS": "4"}
    env = rank_environment(5, 8, "10.0.0.1", 29500, [3], parallel, base)
    assert env == {
        "PATH": "/usr/bin",
        "RANK": "5",
        "WORLD_SIZE": "8",
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29500",
        "CUDA_DEVICE_MAX_CONNECTIONS": "1",
        "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": "4",  # the caller's own setting stays
    }
    assert base["RANK"] == "7"  # not modified
    env = rank_environment(0, 2, "host", 6000, [0, 1], ParallelConfig(dp=2))
    assert "CUDA_VISIBLE_DEVICES" not in env  # the device view is placement.device_env's alone
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in env
    env = rank_environment(0, 2, "host", 6000, [0], ParallelConfig(cp=2))
    assert env["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"


@pytest.mark.parametrize(
    ("rank", "world", "port", "gpus", "message"),
    [
        (4, 4, 6000, [0], "rank 4 is outside the world of 4 ranks"),
        (-1, 4, 6000, [0], "rank -1 is outside the world of 4 ranks"),
        (0, 8, 6000, [0], "world size 8 differs from TP·CP·DP·PP = 4"),
        (0, 4, 70000, [0], "master port 70000 is not a TCP port"),
        (0, 4, 6000, [-1], "GPU ids must be >= 0, got [-1]"),
    ],
)
def test_rank_environment_errors(rank, world, port, gpus, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        rank_environment(rank, world, "host", port, gpus, ParallelConfig(pp=4))
