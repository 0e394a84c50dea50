"""Which fork a command line is (``dialects/dialect.py`` and the package's ``dialect_of``): by the
flags or entry point only that fork has, Megatron-LM's when none, an error for two; a fork's
table in place of core's where it parses a flag otherwise; and its refusals."""

from __future__ import annotations

from collections import Counter

import pytest

from ray_layout.errors import ConfigError
from ray_layout.model.dialects import CORE, DIALECTS, dialect_of, table_of
from ray_layout.model.dialects.deepspeed_moe import DEEPSPEED_MOE
from ray_layout.model.dialects.dialect import refuse
from ray_layout.model.dialects.mindspeed import MINDSPEED
from ray_layout.model.dialects.pai import PAI
from ray_layout.model.megatron_args import megatron_flag_table


@pytest.mark.parametrize(
    ("words", "entry", "dialect"),
    [
        (["--num-layers", "2"], "pretrain_gpt.py", CORE),
        (["--noop-layers", "1"], "", MINDSPEED),
        (["--tokenizer-type", "PretrainedFromHF"], "", MINDSPEED),
        (["--tokenizer-type", "GPT2BPETokenizer"], "", CORE),
        (["--num-experts", "8", "16"], "", DEEPSPEED_MOE),  # a list: DeepSpeed's
        (["--num-experts", "8"], "", CORE),
        (["--deepspeed", "--deepspeed_config", "x.json"], "", DEEPSPEED_MOE),
        (["--extra-vocab-size", "0"], "", PAI),
        (["--num-layers", "2"], "examples/qwen2/pretrain_qwen2_moe.py", PAI),
        (["--expert-interval", "2", "--patch-tokenizer-type", "Qwen2Tokenizer"], "", PAI),
    ],
)
def test_the_fork_is_the_one_whose_own_flags_are_there(words, entry, dialect):
    assert dialect_of(words, entry, "t") is dialect


def test_flags_of_two_forks_are_one_line():
    with pytest.raises(ConfigError, match=r"more than one fork: MindSpeed-LLM \(--noop-layers\)"):
        dialect_of(["--noop-layers", "1", "--mlp-type", "residual"], "", "t")


def test_a_flag_two_forks_share_marks_one_at_most():
    names = Counter(f.name for d in DIALECTS for f in d.flags if f.marks)
    assert [name for name, forks in names.items() if forks > 1] == []


def test_a_shared_flag_gives_way_to_a_forks_own():
    """Pai's legacy --expert-interval is Megatron-DeepSpeed's too: Pai's own flags decide."""
    words = ["--expert-interval", "2", "--moe-expert-parallel-size", "2", "--train-mode", "x"]
    assert dialect_of(words, "", "t") is PAI
    assert dialect_of(words[:4], "", "t") is DEEPSPEED_MOE


def test_a_forks_table_replaces_cores_entry_where_it_parses_otherwise():
    core = megatron_flag_table()
    assert core["--num-experts"]["nargs"] is None
    assert table_of("Megatron-DeepSpeed")["--num-experts"]["nargs"] == "+"
    assert table_of("MindSpeed-LLM")["--moe-token-dispatcher-type"]["choices"] is None
    assert table_of("")["--num-experts"] is core["--num-experts"]


def test_refuse_names_the_flag_and_what_it_does_when_set():
    refuse(PAI.flags, {"use_normhead": False}, PAI.name, "t")  # not set: nothing to say
    with pytest.raises(ConfigError, match="--use-normhead is Pai-Megatron-Patch's a normalised"):
        refuse(PAI.flags, {"use_normhead": True}, PAI.name, "t")


def test_a_forks_command_line_keeps_its_flags_as_written_and_says_whose_it_is():
    """Through the loaders: the fork's table walks the words, so a list-valued --num-experts
    stays whole in the user's flags, and ``load_recipe``'s check takes the fork's table."""
    from ray_layout.model.loading import load_recipe
    from ray_layout.model.megatron_recipe import Overrides

    text = (
        "deepspeed pretrain_gpt.py --num-layers 4 --hidden-size 64 --num-attention-heads 4 "
        "--seq-length 64 --max-position-embeddings 64 --num-experts 4 8 --deepspeed"
    )
    recipe = load_recipe(text, Overrides(sizes={"vocab_size": 1000}))
    assert recipe.dialect == "Megatron-DeepSpeed"
    args = recipe.megatron_args
    assert args[args.index("--num-experts") : args.index("--num-experts") + 3] == (
        "--num-experts",
        "4",
        "8",
    )
    assert any("read as Megatron-DeepSpeed's command line (--deepspeed" in n for n in recipe.notes)


def test_an_unknown_flag_of_plain_megatron_named_after_the_shape_is_an_error_too():
    from ray_layout.model.megatron_recipe import load_megatron_command_line

    base = (
        "torchrun pretrain_gpt.py --num-layers 2 --hidden-size 64 --num-attention-heads 4 "
        "--seq-length 64 --max-position-embeddings 64 --vocab-size 1000"
    )
    with pytest.raises(ConfigError, match=r"--dense-ffn-width is not in Megatron core_v0\.16\.1's"):
        load_megatron_command_line(f"{base} --dense-ffn-width 128")
    kept = load_megatron_command_line(f"{base} --megatron-fsdp-grad-comm-dtype bf16")
    assert any("--megatron-fsdp-grad-comm-dtype unknown to Megatron" in n for n in kept.notes)
