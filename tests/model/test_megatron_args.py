"""Megatron's argparse over a command's words: the flag walk (lenient for scripts, strict for
argument lists) and the bundled flag table."""

from __future__ import annotations

import pytest

from ray_layout.errors import ConfigError
from ray_layout.model.megatron_args import (
    check_arguments,
    megatron_flag_table,
    parse_flags,
    walk_flags,
)


def test_one_walk_for_scripts_and_argument_lists():
    """The loader skips the words a launch script leaves around; an argument list is strict."""
    words = ["2", "--seed", "7", "--data-path", "--lr=0.5", "--bf16"]
    uses = [(use.flag, use.values) for use in walk_flags(words, "x", strict=False)]
    assert uses == [("--seed", ("7",)), ("--data-path", ()), ("--lr", ("0.5",)), ("--bf16", ())]
    assert parse_flags(words, "x") == {"seed": 7, "data_path": [], "lr": 0.5, "bf16": True}
    with pytest.raises(ConfigError, match=r"^x: argument '2' is not a flag"):
        list(walk_flags(words, "x", strict=True))
    with pytest.raises(ConfigError, match=r"^x: unknown Megatron flag -s$"):
        list(walk_flags(["-s"], "x", strict=True))
    assert list(walk_flags(["-s"], "x", strict=False)) == []


def test_flag_table_is_cached_and_complete():
    table = megatron_flag_table()
    assert table is megatron_flag_table()
    assert table["--disable-bias-linear"]["dest"] == "add_bias_linear"
    assert table["--num-virtual-stages-per-pipeline-rank"]["type"] == "int"


@pytest.mark.parametrize(
    ("words", "message"),
    [
        (["--num-layers", "1_6"], "--num-layers needs a value of type int, got '1_6' (an integer"),
        (["--num-layers", "٣"], "--num-layers needs a value of type int, got '٣'"),
        (["--num-layers", "+16"], "--num-layers needs a value of type int, got '+16'"),
        (["--seed", "9" * 400], "--seed needs a value of type int, got '9999"),
        (["--lr", "nan"], "--lr needs a value of type float, got 'nan' (a finite decimal number)"),
        (["--lr", "1e400"], "--lr needs a value of type float, got '1e400'"),
        (["--lr", "1_0.5"], "--lr needs a value of type float, got '1_0.5'"),
    ],
)
def test_numbers_are_read_as_every_number_written_as_text_is(words, message):
    """Megatron's own int() and float() take 1_6, +16, nan and 1e400 (inf); the tuner reasons
    with these values and writes them back, so it reads them as the command line's flags."""
    with pytest.raises(ConfigError) as info:
        check_arguments(words, "x")
    assert str(info.value).startswith(f"x: {message}") and "\n" not in str(info.value)
    assert len(str(info.value)) < 200


def test_plain_numbers_keep_their_values():
    words = ["--num-layers", "16", "--seed", "-1", "--lr", "3e-4", "--min-lr", ".5"]
    parsed = parse_flags(words, "x")
    assert (parsed["num_layers"], parsed["seed"], parsed["lr"], parsed["min_lr"]) == (
        16, -1, 3e-4, 0.5,
    )  # fmt: skip
