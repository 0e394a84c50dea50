"""Megatron's argparse over a command's words: the flag walk (lenient for scripts, strict for
argument lists) and the bundled flag table."""

from __future__ import annotations

import pytest

from ray_layout.errors import ConfigError
from ray_layout.model.megatron_args import megatron_flag_table, parse_flags, walk_flags


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
