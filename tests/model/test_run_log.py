"""A Megatron run log as CONFIG: the arguments block as Megatron prints it, the blocks of a log,
the recipe built from one, and the three real run logs in ``../shared/data/real_megatron_logs``
read in place (every expected value below was read off the log by hand)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ray_layout.commands.main import main
from ray_layout.errors import ConfigError
from ray_layout.model.loading import load_recipe
from ray_layout.model.megatron_recipe import Overrides
from ray_layout.model.run_log import (
    arguments_blocks,
    holds_arguments_block,
    load_run_log,
    parse_arguments,
)
from ray_layout.model.sizing import gpu_params, parameter_count, stage_sizes
from ray_layout.model.spec import Recipe
from ray_layout.model.split import current_layout, default_layout
from tests.helpers.commands_cli import run_json
from tests.helpers.paths import SHARED_DATA

REAL_LOGS = SHARED_DATA / "real_megatron_logs"
MDS_MOE = "args_01_mds_gpt125m_moe64_2022.log"
GPT2 = "args_02_megatron_gpt2_345m_tp2pp2_2023.log"
MDS_LLAMA = "args_03_mds_llama_tp2pp2_2023.log"
HEADER = "------------------------ arguments ------------------------"
END = "-------------------- end of arguments ---------------------"
TINY = {
    "num_layers": "4",
    "hidden_size": "256",
    "num_attention_heads": "8",
    "seq_length": "512",
    "max_position_embeddings": "512",
    "vocab_size": "1000",
    "tensor_model_parallel_size": "1",
    "pipeline_model_parallel_size": "2",
    "data_parallel_size": "2",
    "world_size": "4",
    "micro_batch_size": "1",
    "global_batch_size": "8",
}


def real(name: str) -> Path:
    path = REAL_LOGS / name
    if not path.exists():
        pytest.skip(f"{path} is not on this machine (the shared real-log fixtures)")
    return path


def printed(entries: dict[str, str], prefix: str = "") -> str:
    """A block as Megatron's ``_print_args`` prints it: dots fill a name to 48 characters."""
    rows = [f"{prefix}  {name} {'.' * (48 - len(name))} {value}" for name, value in entries.items()]
    return "\n".join([HEADER, *rows, END]) + "\n"


def write(tmp_path: Path, text: str, name: str = "run.log") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def rank_params(recipe: Recipe) -> list[int]:
    """What each pipeline rank's GPU holds of the layout the run had: Megatron's ``number of
    parameters on (tensor, pipeline) model parallel rank (0, p)``."""
    m, p = recipe.model, recipe.parallel
    layout = current_layout(
        m.num_layers, m.mtp_num_layers, p.pp, p.vpp, recipe.split, tied_embeddings=True
    ) or default_layout(m.num_layers, m.mtp_num_layers, p.pp, p.vpp, recipe.split)
    return [int(sum(gpu_params(s.params, p)[:2])) for s in stage_sizes(m, p, layout.stages)]


# -- the block ------------------------------------------------------------------------------------

NAMES = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,59}", fullmatch=True)
VALUES = st.text(st.characters(blacklist_characters="\n\r", blacklist_categories=("Cs",)))


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(NAMES, VALUES.map(str.strip), max_size=12),
    st.sampled_from(["", "[default0]:", "[rank0]: ", "2024-07-16 10:00:01 INFO "]),
    st.lists(st.integers(1, 60), min_size=12, max_size=12),
    st.booleans(),
)
def test_a_printed_block_reads_back(entries, prefix, leaders, megatrons_own):
    """Random names, values and dot leaders (Megatron's fill to 48, or any a fork prints),
    after any launcher prefix: every entry reads back, at its line."""
    if any("arguments" in value for value in entries.values()):
        return  # a value that prints a header line is another block
    rows = []
    for (name, value), dots in zip(entries.items(), leaders, strict=False):
        count = max(48 - len(name), 0) if megatrons_own or len(name) >= 48 else dots
        rows.append(f"{prefix}  {name} {'.' * count} {value}")
    text = "\n".join(["banner", HEADER, *rows, END, "after"]) + "\n"
    (block,) = arguments_blocks(text)
    assert dict(block.values) == entries and list(block.values) == list(entries)
    assert dict(block.lines) == {name: 3 + i for i, name in enumerate(entries)}
    assert (block.line, block.end_line) == (2, 3 + len(entries))


def test_a_name_of_48_characters_or_more_has_no_dots():
    long, almost = "n" * 48, "m" * 47
    (block,) = arguments_blocks(printed({long: "1", almost: "2", "short": ""}))
    assert printed({long: "1"}).splitlines()[1] == f"  {long}  1"  # two blanks, as Megatron's
    assert dict(block.values) == {long: "1", almost: "2", "short": ""}


def test_a_real_log_states_its_arguments():
    arguments = parse_arguments(real("05_ms_swift_mcore_2024.log").read_text())
    assert len(arguments) == 319
    assert (arguments["hidden_size"], arguments["num_layers"]) == ("896", "24")
    assert arguments["virtual_pipeline_model_parallel_size"] == "None"


def test_measure_reads_the_last_block_and_a_cut_off_one_to_the_end():
    def block(hidden: int, end: str = END) -> str:
        return (
            f"{HEADER}\n"
            f"[default0]:  hidden_size ..................................... {hidden}\n"
            "  pipeline_model_parallel_layout .................. Et*3|t*7|t*6m|L  \n"
            f"{end}\n"
            "  not_an_argument ....... 1\n"
        )

    arguments = parse_arguments(block(2048) + "restarted\n" + block(4096))
    layout = "Et*3|t*7|t*6m|L"
    assert dict(arguments) == {"hidden_size": "4096", "pipeline_model_parallel_layout": layout}
    assert parse_arguments("no arguments here\n") == {}
    cut = arguments_blocks(block(1024, end="(killed)"))
    assert cut[0].end_line is None and cut[0].values["not_an_argument"] == "1"


def test_a_run_log_is_a_file_with_a_header_line():
    assert holds_arguments_block("log\n" + HEADER + "\n")
    assert holds_arguments_block("[default0]:" + HEADER + "  \r\n")
    assert not holds_arguments_block(f'echo "{HEADER}"\npython pretrain_gpt.py\n')


# -- the recipe -----------------------------------------------------------------------------------


def test_a_small_log_of_any_name_is_config(tmp_path):
    path = write(tmp_path, "start\n" + printed(TINY) + "iteration 1\n", name="job.out.txt")
    recipe = load_recipe(path)
    m, p = recipe.model, recipe.parallel
    assert (m.name, m.num_layers, m.hidden_size, m.vocab_size) == ("job.out", 4, 256, 1000)
    assert (p.tp, p.pp, p.dp, p.micro_batch_size, p.global_batch_size) == (1, 2, 2, 1, 8)
    # Megatron's defaults where the block is silent: LayerNorm, GELU, biases, learned positions
    assert (m.normalization, m.swiglu, m.add_bias_linear) == ("LayerNorm", False, True)


def test_a_log_over_the_input_cap_is_read_from_its_opening(tmp_path):
    lines = " iteration 1/ 10 | elapsed time per iteration (ms): 1.0 |\n" * 80_000
    path = write(tmp_path, printed(TINY) + lines)
    assert Path(path).stat().st_size > 4_000_000
    assert load_recipe(path).model.num_layers == 4


def test_two_blocks_read_the_first_and_say_which_keys_differ(tmp_path):
    later = printed(TINY | {"hidden_size": "512"})
    recipe = load_recipe(write(tmp_path, printed(TINY) + "restart\n" + later))
    assert recipe.model.hidden_size == 256
    (note,) = [n for n in recipe.notes if "arguments blocks" in n]
    assert "2 arguments blocks (lines 1, 16): the first is read" in note
    assert "differ in hidden_size" in note


def test_a_cut_off_block_is_one_line_naming_its_header(tmp_path):
    path = write(tmp_path, "x\n" + printed(TINY).replace(END, "Traceback (most recent call last)"))
    with pytest.raises(ConfigError, match=rf"^{path}:2: the arguments block is cut off"):
        load_recipe(path)


def test_dp_is_the_world_s_and_stays_the_world_s_under_another_pp(tmp_path):
    path = write(tmp_path, printed(TINY))
    assert load_recipe(path).parallel.dp == 2
    assert load_recipe(path, Overrides(sizes={"pp": 4})).parallel.dp == 1
    assert load_recipe(path, Overrides(sizes={"dp": 8})).parallel.dp == 8
    with pytest.raises(
        ConfigError, match=r"run\.log:\d+: the run's world of 4 GPUs .* TP·CP·PP = 8"
    ):
        load_recipe(path, Overrides(sizes={"pp": 8}))
    bad = write(tmp_path, printed(TINY | {"data_parallel_size": "3"}), "bad.log")
    with pytest.raises(ConfigError, match=r"bad\.log:\d+: data_parallel_size 3 x TP·CP·PP 2"):
        load_recipe(bad)


def test_the_vocabulary_comes_from_the_padded_vocab_line(tmp_path):
    padded = " > padded vocab (size: 50257) with 47 dummy tokens (new size: 50304)\n"
    text = printed(TINY | {"vocab_size": "None", "tokenizer_type": "GPT2BPETokenizer"})
    assert load_recipe(write(tmp_path, text + padded)).model.vocab_size == 50257
    with pytest.raises(ConfigError, match=r"give --vocab-size N"):
        load_recipe(write(tmp_path, text, "novocab.log"))
    wrong = padded.replace("50304", "50432")  # padded for TP 2, in a TP 1 block
    with pytest.raises(ConfigError, match=r"wrong\.log:\d+: the run's vocabulary is padded to "):
        load_recipe(write(tmp_path, text + wrong, "wrong.log"))


def test_errors_name_the_file_and_the_line_of_the_key(tmp_path):
    """A key's own value, and a contradiction of the whole model (at its first key's line)."""
    gqa = write(
        tmp_path, printed(TINY | {"group_query_attention": "True", "num_query_groups": "3"})
    )
    with pytest.raises(ConfigError) as caught:
        load_recipe(gqa)
    assert (
        str(caught.value)
        == f"{gqa}:4: num_attention_heads 8 is not divisible by num_query_groups 3"
    )
    typo = write(tmp_path, printed(TINY | {"hidden_size": "1O24"}), "typo.log")
    with pytest.raises(ConfigError, match=rf"^{typo}:3: --hidden-size needs a value of type int"):
        load_recipe(typo)


def test_the_split_is_the_run_s(tmp_path):
    layout = load_recipe(
        write(tmp_path, printed(TINY | {"pipeline_model_parallel_layout": "Et|tttL"}))
    )
    assert layout.split.layout == "Et|tttL"
    uneven = {"decoder_first_pipeline_num_layers": "1", "decoder_last_pipeline_num_layers": "3"}
    recipe = load_recipe(write(tmp_path, printed(TINY | uneven), "uneven.log"))
    assert (recipe.split.first_stage_layers, recipe.split.last_stage_layers) == (1, 3)
    m, p = recipe.model, recipe.parallel
    current = current_layout(4, 0, p.pp, p.vpp, recipe.split, tied_embeddings=m.tied_embeddings)
    assert str(current) == "Et|t*3L"


def test_a_vpp_megatron_printed_is_the_split_s(tmp_path):
    vpp = {
        "num_layers_per_virtual_pipeline_stage": "1",
        "virtual_pipeline_model_parallel_size": "2",
    }
    assert load_recipe(write(tmp_path, printed(TINY | vpp))).parallel.vpp == 2
    fork = {"virtual_pipeline_model_parallel_size": "2"}  # no flag of core's says it
    assert load_recipe(write(tmp_path, printed(TINY | fork), "fork.log")).parallel.vpp == 2


def test_load_run_log_takes_text_and_names_the_model():
    recipe = load_run_log(printed(TINY), "a.log", "named")
    assert recipe.model.name == "named" and recipe.parallel.pp == 2


# -- the three real logs --------------------------------------------------------------------------


def gpt2_345m_params(vocab: int) -> int:
    """GPT-2 (Megatron's 345M: 24 layers, hidden 1024, 1024 positions, biases, LayerNorm, GELU
    MLP of 4h, tied output layer) by its formula."""
    h, layers, positions = 1024, 24, 1024
    layer = 4 * h * h + 4 * h + 2 * h + 8 * h * h + 5 * h + 2 * h  # attention, LN, MLP, LN
    return vocab * h + positions * h + layers * layer + 2 * h


def test_gpt2_345m_megatron_lm_2023():
    recipe = load_recipe(str(real(GPT2)))
    m, p = recipe.model, recipe.parallel
    assert (m.num_layers, m.hidden_size, m.num_attention_heads, m.ffn_hidden_size) == (
        24, 1024, 16, 4096,
    )  # fmt: skip
    assert (m.kv_channels, m.seq_length, m.max_position_embeddings) == (64, 1024, 1024)
    assert (m.vocab_size, m.padded_vocab_size(2)) == (50257, 50432)  # "padded vocab" line
    assert (m.position_embedding_type, m.normalization, m.add_bias_linear) == (
        "learned_absolute", "LayerNorm", True,
    )  # fmt: skip
    assert (m.swiglu, m.untie_embeddings_and_output_weights, m.num_experts) == (False, False, 0)
    assert (p.tp, p.pp, p.vpp, p.cp, p.dp, p.micro_batch_size, p.global_batch_size) == (
        2, 2, 1, 1, 1, 4, 16,
    )  # fmt: skip
    assert recipe.split.layout is None and "--sequence-parallel" in recipe.megatron_args
    counts = parameter_count(m)
    # 354.9M: the 345M of its name is GPT-2 medium's old estimate; Megatron pads the vocabulary
    # (50,257 -> 50,304 for one TP rank, the count this tool states for the model)
    assert counts.total == 354_871_296 == gpt2_345m_params(50304)
    # the run's own, TP 2: padded to 50,432, and each rank's lines (0, 0) and (0, 1) of the log
    assert gpt2_345m_params(50432) == 355_002_368
    assert rank_params(recipe) == [102_483_968, 101_437_440]
    replicated = 1024 * 1024 + 24 * 6 * 1024 + 2 * 1024  # positions, norms, row biases, final
    tied_copy = 50432 * 1024
    assert 2 * (102_483_968 + 101_437_440) - replicated - tied_copy == 355_002_368


def test_llama_style_megatron_deepspeed_2023():
    recipe = load_recipe(str(real(MDS_LLAMA)))
    m, p = recipe.model, recipe.parallel
    assert (m.num_layers, m.hidden_size, m.num_attention_heads, m.num_query_groups) == (
        24, 2048, 16, 16,
    )  # fmt: skip
    assert (m.ffn_hidden_size, m.kv_channels, m.seq_length) == (5504, 128, 2048)
    assert (m.vocab_size, m.padded_vocab_size(2)) == (32000, 32000)
    assert (m.swiglu, m.normalization, m.position_embedding_type, m.add_bias_linear) == (
        True, "RMSNorm", "rope", False,
    )  # fmt: skip
    assert m.untie_embeddings_and_output_weights and m.num_experts == 0
    assert (p.tp, p.pp, p.dp, p.micro_batch_size, p.global_batch_size) == (2, 2, 2, 4, 32)
    h, ffn, vocab = 2048, 5504, 32000
    layer = 4 * h * h + 3 * h * ffn + 2 * h  # attention, SwiGLU MLP, two RMSNorms
    assert parameter_count(m).total == 1_345_423_360 == 2 * vocab * h + 24 * layer + h
    assert rank_params(recipe) == [336_379_904, 336_381_952]  # the log's (0, 0) and (0, 1)


def test_megatron_deepspeed_moe_2022():
    """64 experts on every other layer (expert_interval 2), top-1, EP 4: not megatron-core's
    top-2 on every layer.  Sized by the model layer's Megatron-DeepSpeed reading; were it to read
    a key otherwise, loading refuses in one line naming the key."""
    recipe = load_recipe(str(real(MDS_MOE)))
    m, p = recipe.model, recipe.parallel
    assert (m.num_layers, m.hidden_size, m.num_attention_heads, m.ffn_hidden_size) == (
        12, 768, 12, 3072,
    )  # fmt: skip
    assert (m.seq_length, m.vocab_size, m.padded_vocab_size(1)) == (2048, 50257, 50304)
    assert m.experts_per_layer == (0, 64) * 6 and m.moe_router_topk == 1
    assert (p.tp, p.pp, p.ep, p.dp, p.micro_batch_size, p.global_batch_size) == (
        1, 1, 4, 4, 4, 256,
    )  # fmt: skip
    h, vocab, norm = 768, 50304, 2 * 768
    attention = 4 * h * h + 4 * h + norm  # QKV and projection with biases, its LayerNorm
    mlp = 8 * h * h + 5 * h  # an expert is the dense MLP
    dense, moe = attention + norm + mlp, attention + norm + h * 64 + 64 * mlp  # gate: no bias
    embedding = vocab * h + 2048 * h
    assert parameter_count(m).total == 1_910_636_544 == embedding + 6 * (dense + moe) + 2 * h
    assert rank_params(recipe) == [550_576_128]  # the log's rank (0, 0): 16 of 64 experts


def test_size_and_plan_of_the_gpt2_log(capsys):
    log = str(real(GPT2))
    report = run_json(capsys, "size", log)
    assert report["model"] == "args_02_megatron_gpt2_345m_tp2pp2_2023"
    assert report["parameters"]["total"] == 354_871_296
    assert report["layout"] == "Et*12|t*12L"
    assert main(["size", log]) == 0
    out = capsys.readouterr().out
    assert "args_02_megatron_gpt2_345m_tp2pp2_2023" in out and "TP=2 PP=2" in out
    assert main(["plan", log, "--costs", "flops"]) == 0
    out = capsys.readouterr().out
    assert "args_02_megatron_gpt2_345m_tp2pp2_2023: PP=2" in out and "flag to paste" in out


def test_megatron_command_of_the_gpt2_log_keeps_the_run_s_flags(capsys):
    argv = run_json(capsys, "megatron-command", str(real(GPT2)))["argv"]
    assert "--sequence-parallel" in argv and argv[argv.index("--transformer-impl") + 1] == "local"
    assert argv[argv.index("--tensor-model-parallel-size") + 1] == "2"
