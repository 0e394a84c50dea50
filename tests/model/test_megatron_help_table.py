"""A flag table from argparse's help: argparse itself, on random parsers and at any width, is
the judge of the option strings, arity and choices read back; the bundled entry is kept only for
a flag with the same option strings and arity.  (The cluster's own Megatron, read on a worker:
tests/runtime/test_megatron_help_probe.py.)"""

from __future__ import annotations

import argparse

from hypothesis import example, given, settings
from hypothesis import strategies as st

from ray_layout.model.megatron_help_table import merge_with_bundled, parse_help

_NAMES = st.from_regex(r"--[a-z][a-z0-9]{0,6}(-[a-z0-9]{1,6}){0,3}", fullmatch=True)
_ARITIES = st.sampled_from([None, 0, 1, 2, 3, "?", "*", "+", "bool"])
_CHOICE = st.from_regex(r"[a-z][a-z0-9_.-]{0,8}", fullmatch=True)
_CHOICES = st.none() | st.lists(_CHOICE, min_size=1, max_size=4, unique=True)
_HELP = st.none() | st.text(st.sampled_from("ab -x,."), max_size=120)


def _add(parser: argparse.ArgumentParser, flags: list[str], arity, choices, text) -> None:
    if arity == 0:
        parser.add_argument(*flags, action="store_true", help=text)
    elif arity == "bool":
        parser.add_argument(flags[0], action=argparse.BooleanOptionalAction, help=text)
    else:
        parser.add_argument(*flags, nargs=arity, choices=choices, help=text)


options = st.lists(
    st.tuples(st.lists(_NAMES, min_size=1, max_size=2), _ARITIES, _CHOICES, _HELP),
    max_size=8,
    unique_by=lambda option: option[0][0],
)


@settings(max_examples=60, deadline=None)
@given(options, st.integers(30, 200))
@example([(["--a"], None, ["a..."], None)], 30)  # a choice's own "..." is not argparse's
def test_help_reads_back_as_the_parser_that_printed_it(chosen, width):
    parser = argparse.ArgumentParser(
        prog="pretrain_gpt.py",
        formatter_class=lambda prog: argparse.HelpFormatter(prog, width=width),
    )
    expected: dict[str, tuple] = {"-h": (["-h", "--help"], "help", 0, None)}
    for flags, arity, choices, text in chosen:
        taken = parser._option_string_actions
        flags = [f for f in dict.fromkeys(flags) if f not in taken]
        if not flags or (arity == "bool" and "--no-" + flags[0][2:] in taken):
            continue
        _add(parser, flags, arity, choices, text)
        if arity == "bool":
            flags = [flags[0], "--no-" + flags[0][2:]]
        nargs = {"bool": 0, 1: None}.get(arity, arity)
        # '[{a,b}]' and '[{a,b} ...]' (nargs ? and *) are read without their choices: a value
        # then goes to Megatron unchecked, and Megatron checks it
        shown = choices if arity not in (0, "bool", "?", "*") else None
        expected[flags[0]] = (flags, taken[flags[0]].dest, nargs, shown)
    entries = parse_help(parser.format_help())
    got = {e["flags"][0]: (e["flags"], e["dest"], e["nargs"], e["choices"]) for e in entries}
    assert got == expected


BUNDLED = {
    "--seed": {"flags": ["--seed"], "dest": "seed", "nargs": None, "type": "int"},
    "--pair": {"flags": ["--pair"], "dest": "pair", "nargs": 2, "type": "int"},
    "--one": {"flags": ["--one"], "dest": "one", "nargs": 1, "type": "int"},
    "--fuse": {"flags": ["--fuse", "--no-fuse"], "dest": "fuse", "nargs": 0, "type": None},
    "--no-fuse": {"flags": ["--fuse", "--no-fuse"], "dest": "fuse", "nargs": 0, "type": None},
    "--gone": {"flags": ["--gone"], "dest": "gone", "nargs": 0, "type": None},
}


def test_a_flag_keeps_its_bundled_entry_only_with_the_same_option_strings_and_arity():
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--seed")  # same: the bundled entry, with its type
    parser.add_argument("--pair", nargs=3)  # another arity: help's entry
    parser.add_argument("--one", nargs=1)  # nargs=1 prints as one value: the same arity
    parser.add_argument("--fuse", action="store_true")  # lost its --no-fuse: help's entry
    parser.add_argument("--new", nargs="+")
    table = merge_with_bundled(parse_help(parser.format_help()), BUNDLED)
    assert table["--seed"] is BUNDLED["--seed"] and table["--one"] is BUNDLED["--one"]
    assert table["--pair"]["nargs"] == 3 and table["--pair"]["type"] is None
    assert table["--fuse"]["flags"] == ["--fuse"] and "--no-fuse" not in table
    new = {"flags": ["--new"], "dest": "new", "nargs": "+", "type": None, "choices": None}
    assert table["--new"] == new | {"default": None}
    assert "--gone" not in table  # not in the help: that Megatron does not know it
