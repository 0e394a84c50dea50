"""Pai-Megatron-Patch's entry points and flags read into the model (``dialects/pai.py``): short
command lines of our own through ``load_megatron_command_line`` (the vocabulary plus
--extra-vocab-size unpadded, deepseek_v2's --moe-layer-freq, the qwen2 MoE's gated shared expert),
and its three real run scripts, run by bash with every command stubbed and the positional
arguments of their READMEs, sized to the published counts."""

from __future__ import annotations

import pytest

from ray_layout.errors import ConfigError
from ray_layout.model.megatron_recipe import Overrides, load_megatron_command_line
from ray_layout.model.sizing import parameter_count
from tests.helpers.paths import SHARED_DATA
from tests.helpers.recorded_argv import launch_line, recorded_commands

BASE = (
    "--num-layers 4 --hidden-size 64 --num-attention-heads 4 --seq-length 128 "
    "--max-position-embeddings 128 --swiglu --normalization RMSNorm "
    "--position-embedding-type rope --disable-bias-linear --untie-embeddings-and-output-weights "
    "--patch-tokenizer-type Qwen2Tokenizer --extra-vocab-size 293 --train-mode pretrain"
)
MOE = "--num-experts 4 --moe-ffn-hidden-size 32 --moe-router-topk 2"


def load(entry: str, extra: str = "", **sizes: int):
    text = f"torchrun --nproc_per_node 8 {entry} {BASE} {extra}"
    return load_megatron_command_line(text, "run.sh", Overrides(sizes=sizes))


def test_the_vocabulary_is_the_tokenizers_plus_the_extra_rows_unpadded():
    recipe = load("pretrain_qwen.py", vocab_size=151643)
    assert recipe.dialect == "Pai-Megatron-Patch"
    assert recipe.model.padded_vocab_size() == 151643 + 293  # 151,936: Qwen2's, not padded


def test_without_a_vocabulary_it_asks_for_the_tokenizers():
    with pytest.raises(ConfigError, match=r"give --vocab-size N: Pai's Qwen2Tokenizer .* 293"):
        load("pretrain_qwen.py")


def test_an_extra_vocabulary_that_tp_cannot_split_is_one_line():
    with pytest.raises(ConfigError, match="not divisible by TP 2"):
        load("pretrain_qwen.py", "--tensor-model-parallel-size 2", vocab_size=1000)


def test_the_deepseek_v2_entry_reads_the_frequency_as_dense_layers_first():
    mla = f"{MOE} --multi-latent-attention --kv-lora-rank 16 --v-head-dim 16 --moe-layer-freq 1"
    v2 = load("examples/deepseek_v2/pretrain_deepseek.py", mla, vocab_size=1000)
    assert v2.model.moe_layer_pattern == (False, True, True, True)
    assert any("deepseek_v2 pretrain_deepseek.py builds the first 1 layer dense" in n
               for n in v2.notes)  # fmt: skip
    v3 = load("../deepseek_v3/pretrain_deepseek.py", mla, vocab_size=1000)
    assert v3.model.moe_layer_pattern == (True,) * 4  # megatron-core's: every layer


def test_the_qwen2_moe_entry_gates_its_shared_expert():
    shared = f"{MOE} --moe-shared-expert-intermediate-size 48"
    gated = load("pretrain_qwen2_moe.py", shared, vocab_size=1000).model
    plain = load("pretrain_qwen.py", shared, vocab_size=1000).model
    assert gated.moe_shared_expert_gate and not plain.moe_shared_expert_gate
    assert parameter_count(gated).total - parameter_count(plain).total == 4 * 64  # (1, h) each
    legacy = load("pretrain_qwen.py", f"{MOE} --enable-shared-expert "
                  "--shared-moe-ffn-hidden-size 48", vocab_size=1000).model  # fmt: skip
    assert parameter_count(legacy).total == parameter_count(gated).total


def test_the_mla_widths_pai_converts_with_are_noted_where_core_builds_others():
    mla = f"{MOE} --multi-latent-attention --kv-lora-rank 16 --v-head-dim 16"
    recipe = load("pretrain_deepseek.py", f"{mla} --qk-nope-head-dim 96", vocab_size=1000)
    assert any("--qk-nope-head-dim 96 is read by Pai's converters" in n for n in recipe.notes)


@pytest.mark.parametrize("flag", ["--moe-topk 2", "--use-normhead", "--vision-tower x"])
def test_legacy_and_multimodal_flags_are_refused(flag):
    with pytest.raises(ConfigError, match=f"{flag.split()[0]} is Pai-Megatron-Patch's"):
        load("pretrain_qwen.py", flag, vocab_size=1000)


def test_the_qwen3_next_entry_is_refused():
    with pytest.raises(ConfigError, match="gated DeltaNet"):
        load("pretrain_qwen3_next.py", vocab_size=1000)


SCRIPTS = SHARED_DATA / "real_launch_scripts"
DATA = ("/mnt/data", "/mnt/data", "/mnt/ckpt")  # DATASET_PATH VALID_DATASET_PATH CHECKPOINT
DLC = {"RANK": "0", "KUBERNETES_CONTAINER_RESOURCE_GPU": "8"}


def real_launch(name: str, args: tuple[str, ...], nodes: int) -> str:
    path = SCRIPTS / name
    if not path.exists():
        pytest.skip(f"{path} is not here (../shared/data holds the real scripts)")
    return launch_line(recorded_commands(path, args, DLC | {"WORLD_SIZE": str(nodes)}))


def sized(text: str, vocab: int):
    recipe = load_megatron_command_line(text, overrides=Overrides(sizes={"vocab_size": vocab}))
    assert recipe.dialect == "Pai-Megatron-Patch"
    return recipe, parameter_count(recipe.model)


def test_the_real_qwen2_57b_a14b_script_sizes_to_57_41b():
    """README_moe.md's example (TP4 PP2 ETP4 EP4: 4 nodes x 8); Qwen2's tokenizer has 151,643
    tokens, to which the script adds 293.  57.41B counted from the weights; 14B active is the
    model's name, to the billion."""
    args = ("dlc", "A14B", "1", "8", "1e-5", "1e-6", "128", "128", "bf16", "4", "2", "1", "4",
            "4", "true", "true", "true", "false", "sel", "false", "100000", *DATA, "10000",
            "100", "/mnt/out")  # fmt: skip
    recipe, count = sized(real_launch("pai_qwen2_run_mcore_qwen2_moe.sh", args, 4), 151643)
    assert recipe.model.vocab_size == 151936 and recipe.model.moe_shared_expert_gate
    assert abs(count.total / 57.41e9 - 1) <= 0.015
    assert round(count.active / 1e9) == 14


def test_the_real_deepseek_v2_script_sizes_to_236b_21b():
    """README.md's arguments with A21B (TP1 PP4 EP2 on 8 GPUs); DeepSeek's tokenizer has 100,000
    tokens (+2,400 = 102,400).  --moe-layer-freq 1 is this entry's one dense layer first; 21B
    active leaves the input embedding out."""
    args = ("dlc", "A21B", "1", "8", "1e-5", "1e-6", "1024", "1024", "bf16", "1", "4", "1", "2",
            "true", "true", "true", "false", "sel", "false", "100000", *DATA, "1000000000",
            "10000", "/mnt/out")  # fmt: skip
    recipe, count = sized(real_launch("pai_deepseek_v2_run_mcore_deepseek.sh", args, 1), 100000)
    assert recipe.model.moe_layer_pattern == (False,) + (True,) * 59
    assert abs(count.total / 236e9 - 1) <= 0.015
    assert abs(count.active_without_input_embedding / 21e9 - 1) <= 0.015


def test_the_real_moonlight_script_sizes_to_16b_3b():
    """README.md's example (26 arguments, EP 8 on 8 GPUs); Moonlight's tokenizer: 163,840 with
    no extra rows.  3B active, to the billion."""
    args = ("dlc", "A3B", "1", "8", "1e-5", "1e-6", "1024", "1024", "bf16", "1", "1", "1", "1",
            "8", "true", "true", "false", "none", "false", "100000", *DATA, "10000", "100",
            "/mnt/out")  # fmt: skip
    recipe, count = sized(real_launch("pai_moonlight_run_mcore_moonlight.sh", args, 1), 163840)
    assert recipe.model.mla is not None and recipe.model.mla.q_lora_rank is None
    assert abs(count.total / 16e9 - 1) <= 0.015
    assert round(count.active / 1e9) == 3
