"""load_recipe: which loader each kind of CONFIG reaches."""

from __future__ import annotations

import json
import os

import pytest

from ray_layout.errors import ConfigError
from ray_layout.model.loading import load_recipe
from tests.helpers.paths import TEST_DATA

DATA = TEST_DATA
FIELDS = {
    "num_layers": 4,
    "hidden_size": 256,
    "num_attention_heads": 8,
    "seq_length": 512,
    "vocab_size": 1000,
}
COMMAND = (
    "pretrain_gpt.py --num-layers 4 --hidden-size 256 --num-attention-heads 8 "
    "--seq-length 512 --vocab-size 1000"
)


@pytest.mark.parametrize("suffix", [".yaml", ".yml", ".YAML"])
def test_yaml_is_this_projects_schema(tmp_path, suffix):
    path = tmp_path / f"tiny{suffix}"
    path.write_text("".join(f"{key}: {value}\n" for key, value in FIELDS.items()))
    model = load_recipe(str(path)).model
    assert (model.name, model.num_layers, model.swiglu) == ("tiny", 4, True)  # project defaults


def test_json_without_hf_keys_is_this_projects_schema(tmp_path):
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(FIELDS | {"parallel": {"tp": 2}}))
    recipe = load_recipe(str(path))
    assert (recipe.model.name, recipe.parallel.tp) == ("tiny", 2)


def test_json_with_model_type_is_a_hugging_face_config():
    recipe = load_recipe(str(DATA / "hf" / "OLMoE-1B-7B-0924" / "config.json"))
    assert (recipe.model.name, recipe.model.num_experts) == ("OLMoE-1B-7B-0924", 64)


def test_json_with_only_architectures_is_a_hugging_face_config(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(ConfigError, match="model_type None is not supported"):
        load_recipe(str(path))


def test_shell_script_is_a_megatron_launch_script():
    recipe = load_recipe(str(DATA / "train_moe_16l.sh"))
    assert (recipe.model.name, recipe.parallel.dp) == ("train_moe_16l", 2)


def test_any_other_file_is_a_megatron_launch_script(tmp_path):
    path = tmp_path / "args.txt"
    path.write_text(COMMAND)
    assert load_recipe(str(path)).model.name == "args"


def test_text_with_num_layers_is_a_megatron_command_line():
    model = load_recipe(COMMAND).model
    assert (model.name, model.num_layers, model.normalization) == (
        "megatron-cmdline",
        4,
        "LayerNorm",
    )


@pytest.mark.parametrize("source", ["missing.yaml", "configs/nothing_here", "--hidden-size 8"])
def test_anything_else_is_an_error(source):
    with pytest.raises(ConfigError, match=r"cannot read CONFIG .*: not a file"):
        load_recipe(source)


def test_a_very_long_command_line_is_not_taken_for_a_path():
    long_command = COMMAND + " --lr 1e-4" * 1000
    assert load_recipe(long_command).model.num_layers == 4


def test_an_upper_case_json_suffix_is_json_tabs_and_all(tmp_path):
    path = tmp_path / "QWEN.JSON"
    raw = json.loads((DATA / "hf" / "Qwen3-30B-A3B" / "config.json").read_text())
    path.write_text(json.dumps(raw, indent="\t"))
    assert load_recipe(str(path)).model.num_experts == raw["num_experts"]


@pytest.mark.parametrize("name", ["config.yaml", "config.json", "train.sh"])
def test_a_fifo_as_config_is_refused_at_once(tmp_path, name):
    fifo = tmp_path / name
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match=r"a FIFO, not a regular file .* at most [\d,]+ bytes"):
        load_recipe(str(fifo))


def test_a_folder_or_a_device_as_config_says_what_it_is(tmp_path):
    with pytest.raises(ConfigError, match="a folder, not a regular file"):
        load_recipe(str(tmp_path))
    with pytest.raises(ConfigError, match="/dev/zero: a character device"):
        load_recipe("/dev/zero")
