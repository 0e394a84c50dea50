"""MindSpeed-LLM's flags read into the model (``dialects/mindspeed.py``): short command lines of
our own through ``load_megatron_command_line``, and its two real launch scripts, run by bash with
every command stubbed, sized to their published counts."""

from __future__ import annotations

import pytest

from ray_layout.errors import ConfigError
from ray_layout.model.megatron_recipe import Overrides, load_megatron_command_line
from ray_layout.model.sizing import decoder_layer_params, parameter_count
from tests.helpers.paths import SHARED_DATA
from tests.helpers.recorded_argv import launch_line, recorded_commands

BASE = (
    "torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers 4 --hidden-size 64 "
    "--num-attention-heads 4 --seq-length 128 --max-position-embeddings 128 --vocab-size 1000 "
    "--swiglu --normalization RMSNorm --position-embedding-type rope --disable-bias-linear "
    "--use-fused-rmsnorm"
)
MOE = "--num-experts 4 --moe-ffn-hidden-size 32 --moe-router-topk 2"


def load(extra: str = "", **sizes: int):
    return load_megatron_command_line(f"{BASE} {extra}", "t.sh", Overrides(sizes=sizes))


@pytest.mark.parametrize(
    ("flags", "pattern"),
    [
        ("--first-k-dense-replace 1 --moe-layer-freq 1", (False, True, True, True)),
        ("--first-k-dense-replace 1", (False, True, True, True)),  # core's frequency 1
        ("--first-k-dense-replace 1 --moe-layer-freq 2", (False, False, True, False)),
        ("--first-k-dense-replace -1 --moe-layer-freq -1", (True,) * 4),  # the Mixtral script's
        ("--moe-layer-freq 2", (True, False, True, False)),  # megatron-core's own meaning
    ],
)
def test_the_first_k_dense_layers_and_the_frequency_give_mindspeeds_pattern(flags, pattern):
    recipe = load(f"{MOE} {flags}")
    assert recipe.dialect == "MindSpeed-LLM"
    assert recipe.model.moe_layer_pattern == pattern


def test_shared_experts_are_each_as_wide_as_a_routed_expert():
    model = load(f"{MOE} --n-shared-experts 2").model
    assert model.moe_shared_expert_intermediate_size == 2 * 32
    given = load(f"{MOE} --n-shared-experts 2 --moe-shared-expert-intermediate-size 40").model
    assert given.moe_shared_expert_intermediate_size == 40  # the explicit size wins


def test_noop_layers_have_no_parameters():
    with_noop = load(f"{MOE} --noop-layers 1,3")
    plain = load(MOE)
    assert with_noop.model.noop_layers == (1, 3)
    layer = decoder_layer_params(plain.model, True).total
    assert parameter_count(with_noop.model).total == parameter_count(plain.model).total - 2 * layer
    assert any("--noop-layers 1,3" in note for note in with_noop.notes)
    assert "--noop-layers" in with_noop.megatron_args  # passed on as written


def test_a_noop_layer_outside_the_model_is_one_line():
    with pytest.raises(ConfigError, match="noop_layers entries must be integers in"):
        load(f"{MOE} --noop-layers 1,9")


def test_deprecated_spellings_set_the_new_flags():
    model = load(f"{MOE} --moe-intermediate-size 48").model
    assert model.moe_ffn_hidden_size == 48
    mla = (
        "--multi-head-latent-attention --kv-lora-rank 16 --v-head-dim 16 --qk-nope-head-dim 24 "
        "--qk-rope-head-dim 8 --noop-layers 0"
    )
    model = load(mla).model
    assert model.mla is not None
    assert (model.mla.qk_head_dim, model.mla.qk_pos_emb_head_dim) == (24, 8)


def test_pretrained_from_hf_takes_the_padded_vocabulary_as_built():
    hf = "--tokenizer-type PretrainedFromHF --tokenizer-name-or-path /t"
    model = load(f"{hf} --padded-vocab-size 1001").model  # not padded further
    assert model.padded_vocab_size() == 1001
    recipe = load(hf)  # the script's --vocab-size is taken for the tokenizer's, with a note
    assert recipe.model.padded_vocab_size() == 1024
    assert any("PretrainedFromHF" in note and "1000" in note for note in recipe.notes)
    ours = load(hf, vocab_size=2000)  # our --vocab-size is the tokenizer's: no note
    assert ours.model.vocab_size == 2000 and not any("PretrainedFromHF" in n for n in ours.notes)


def test_pretrained_from_hf_without_a_vocabulary_asks_for_one():
    text = BASE.replace("--vocab-size 1000 ", "") + " --tokenizer-type PretrainedFromHF"
    with pytest.raises(ConfigError, match=r"give --vocab-size N .*PretrainedFromHF"):
        load_megatron_command_line(text, "t.sh")


def test_the_layer_list_is_the_scripts_split():
    text = "--pipeline-model-parallel-size 2 --num-layer-list 1,3"
    assert load(text).split.layout == "Et|t*3L"
    replaced = load(text, pp=4)  # our --pp drops it, with a note
    assert replaced.split.layout is None
    assert any(
        "--pp replaces the script's split (--num-layer-list 1,3)" in n for n in replaced.notes
    )
    with pytest.raises(ConfigError, match="must give each of PP 2 stages its layers, 4 in all"):
        load("--pipeline-model-parallel-size 2 --num-layer-list 2,3")


@pytest.mark.parametrize("flag", ["--geglu", "--embed-layernorm", "--cla-share-factor 2"])
def test_a_flag_that_changes_the_model_unmodelled_is_refused(flag):
    with pytest.raises(ConfigError, match=f"{flag.split()[0]} is MindSpeed-LLM's"):
        load(f"{MOE} {flag}")


def test_an_unknown_flag_named_after_the_models_shape_is_an_error():
    with pytest.raises(ConfigError, match="--extra-hidden-width is not in MindSpeed-LLM's flags"):
        load("--extra-hidden-width 3")
    noted = load("--npu-magic-switch")  # not a shape: passed on with the note
    assert any("--npu-magic-switch" in note for note in noted.notes)


SCRIPTS = SHARED_DATA / "real_launch_scripts"


def real_launch(name: str) -> str:
    path = SCRIPTS / name
    if not path.exists():
        pytest.skip(f"{path} is not here (../shared/data holds the real scripts)")
    return launch_line(recorded_commands(path))


def within(value: float, published: float, tolerance: float = 0.015) -> bool:
    return abs(value / published - 1) <= tolerance


def test_the_real_deepseek_v2_script_sizes_to_236b_21b():
    """60 layers, the first dense, 160 experts top-6 with 2 shared, MLA; the vocabulary is the
    script's --padded-vocab-size (PretrainedFromHF).  DeepSeek counts 21B active without the
    input embedding: the count ``size`` shows as gpt-oss's."""
    recipe = load_megatron_command_line(real_launch("mindspeed_pretrain_deepseek2_236b_8k_ptd.sh"))
    count = parameter_count(recipe.model)
    assert recipe.dialect == "MindSpeed-LLM"
    assert recipe.model.moe_layer_pattern == (False,) + (True,) * 59
    assert recipe.model.moe_shared_expert_intermediate_size == 2 * 1536
    assert within(count.total / 1e9, 236)
    assert within(count.active_without_input_embedding / 1e9, 21)


def test_the_real_mixtral_8x22b_script_sizes_to_141b_39b():
    """--moe-layer-freq -1 --first-k-dense-replace -1: every layer MoE."""
    recipe = load_megatron_command_line(real_launch("mindspeed_pretrain_mixtral_8x22b_32k_ptd.sh"))
    count = parameter_count(recipe.model)
    assert recipe.model.moe_layer_pattern == (True,) * 56
    assert within(count.total / 1e9, 141) and within(count.active / 1e9, 39)
