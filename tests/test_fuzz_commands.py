"""Property: whatever a user types, every command ends in its output (exit 0) or in one line on
stderr (exit 2), within bounded memory and time, with no traceback and no file written by a
refused command, and no cluster started before every setting passed its check.

Each generated case runs isolated (tests/isolated_command.py). ``make test`` runs the ``ci``
profile: a few derandomized examples per property. ``RAY_LAYOUT_FUZZ=bench`` runs many more;
``RAY_LAYOUT_FUZZ_REPORT=PATH`` then writes the tally (cases, clean exits, accepted, left).
"""

from __future__ import annotations

import argparse
import json
import os
import re
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ray_layout.commands.main import build_parser
from ray_layout.commands.tune import build_parser as build_tune_parser
from tests.isolated_command import Outcome, run_isolated
from tests.malformed_inputs import COSTS, HANDBOOK, HARDWARE, LAYOUT, ROOT, write_inputs

settings.register_profile(
    "ci",
    max_examples=12,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.register_profile(
    "bench",
    max_examples=400,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
PROFILE = os.environ.get("RAY_LAYOUT_FUZZ", "ci")

# A valid, quick command line per command: the fuzz spoils one part of it at a time.
BASE = {
    "size": [HANDBOOK, "--pp", "4"],
    "layouts": [HANDBOOK, "--pp", "4", "--count"],
    "validate": [LAYOUT, "--pp", "4", "--num-layers", "16", "--mtp-layers", "1"],
    "plan": [HANDBOOK, "--pp", "4", "--costs", COSTS, "--samples", "4", "--top", "1",
             "--micro-batches", "8"],
    "simulate": [HANDBOOK, LAYOUT, "--costs", COSTS, "--samples", "4"],
    "profile-layouts": [HANDBOOK, "--pp", "4"],
    "ingest": [HANDBOOK, "--run", f"{LAYOUT}={{log}}", "--store", "store"],
    "fit": [HANDBOOK, "--run", f"{LAYOUT}={{log}}", "-o", "costs.json"],
    "profile": [HANDBOOK, "--pp", "4", "--store", "store", "--hardware", HARDWARE,
                "--layout", LAYOUT],
    "tune": [HANDBOOK, "--pp", "4", "--hardware", HARDWARE],
}  # fmt: skip
GOOD_FILES = {  # the kinds of file a user hands over, and the commands that read each
    "config.yaml": HANDBOOK,
    "config.json": str(ROOT / "tests/data/hf/DeepSeek-V3/config.json"),
    "launch.sh": str(ROOT / "tests/data/train_moe_16l.sh"),
    "costs.json": COSTS,
    "hardware.yaml": HARDWARE,
    "run.log": "{log}",
}

_TALLY: Counter[str] = Counter()
_LEFT: list[str] = []
_ACCEPTED: list[str] = []  # values the commands took: the report lists them for a reader to judge


def _flags(command: str) -> dict[str, argparse.Action]:
    """The command's flags by spelling, as its parser knows them."""
    parser = build_tune_parser() if command == "tune" else _subparser(command)
    return {
        action.option_strings[0]: action
        for action in parser._actions
        if action.option_strings and action.option_strings[0] not in ("-h", "--help")
    }


def _subparser(command: str) -> argparse.ArgumentParser:
    subparsers = next(
        a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)
    )
    return subparsers.choices[command]


COMMANDS = sorted(BASE)
FLAGS = {command: _flags(command) for command in COMMANDS}

INT_TEXT = st.one_of(
    st.integers(max_value=0).map(str),
    st.integers(min_value=10**4, max_value=10**40).map(str),
    st.sampled_from(["9" * 5000, "1.5", "nan", "inf", "-inf", "1e9", "0x10", "", " ", "٣", "+0"]),
)
FLOAT_TEXT = st.one_of(
    st.sampled_from(
        ["nan", "-nan", "inf", "-inf", "0", "-0", "-1", "1e400", "1e-400", "1e308", "", "x", "1,5"]
    ),
    st.floats(max_value=0).map(repr),
)
PATH_TEXT = st.sampled_from([
    "{folder}/missing", "{folder}", "{log}", HANDBOOK, "../x", "/proc/1/x", "/", "",
    "{folder}/" + "n" * 300, "x" * 5000, "-", "{folder}/no/such/x.json", "ray://h:1", "h:99999",
    "127.0.0.1:1", "127.0.0.1:0100000", "a|b", "Et*99999999|L", "(t*999999|)*999",
])  # fmt: skip
TEXT = st.text(  # braces doubled: arguments are str.format-ted with the inputs' paths
    alphabet=st.characters(blacklist_characters="\x00", codec="utf-8"), max_size=40
).map(lambda text: text.replace("{", "{{").replace("}", "}}"))
LAYOUT_TEXT = st.text(alphabet="EtmL|()*,0123456789x ", max_size=40)
POSITIONALS = {"validate": {0: LAYOUT_TEXT}, "simulate": {1: LAYOUT_TEXT}}  # by index in BASE


def _bad_value(action: argparse.Action) -> st.SearchStrategy[str]:
    if action.type is int:
        return INT_TEXT
    if action.type is float:
        return FLOAT_TEXT
    if action.choices:
        return st.one_of(TEXT, st.sampled_from(["", "EMULATED", "megatron "]))
    return st.one_of(PATH_TEXT, TEXT, INT_TEXT)


@st.composite
def spoiled_flag(draw: st.DrawFn) -> tuple[str, list[str]]:
    """A command line with one flag, or a layout argument, set to a generated (mostly bad)
    value."""
    command = draw(st.sampled_from(COMMANDS))
    if command in POSITIONALS and draw(st.booleans()):
        index, text = draw(st.sampled_from(sorted(POSITIONALS[command].items())))
        argv = list(BASE[command])
        argv[index] = draw(text)
        return command, argv
    flags = {name: a for name, a in FLAGS[command].items() if a.nargs != 0}  # not switches
    name = draw(st.sampled_from(sorted(flags)))
    value = draw(_bad_value(flags[name]))
    return command, [*BASE[command], f"{name}={value}"]


@st.composite
def mutated(draw: st.DrawFn, text: str) -> str:
    """``text`` spoiled the way files get spoiled: cut short, a number swapped for nonsense, a
    line lost or doubled, garbage or deep nesting inserted, or emptied."""
    lines = text.splitlines(keepends=True) or [""]
    how = draw(st.sampled_from(["truncate", "number", "drop", "double", "garbage", "nest",
                                "empty", "binary"]))  # fmt: skip
    at = draw(st.integers(0, max(len(lines) - 1, 0)))
    if how == "truncate":
        return text[: draw(st.integers(0, len(text)))]
    if how == "number":
        numbers = list(re.finditer(r"-?\d+(\.\d+)?(E[+-]?\d+)?", text))
        if numbers:
            match = numbers[draw(st.integers(0, len(numbers) - 1))]
            value = draw(st.one_of(INT_TEXT, FLOAT_TEXT, st.sampled_from(["[]", "{}", "null",
                                                                          '"x"'])))  # fmt: skip
            return text[: match.start()] + value + text[match.end() :]
    if how == "drop":
        return "".join(lines[:at] + lines[at + 1 :])
    if how == "double":
        return "".join(lines[: at + 1] + lines[at:] * draw(st.integers(1, 3)))
    if how == "garbage":
        return "".join([*lines[:at], draw(TEXT) + "\n", *lines[at:]])
    if how == "nest":
        depth = draw(st.sampled_from([50, 5_000, 100_000]))
        return "[" * depth + "]" * depth if draw(st.booleans()) else "a:\n" + "  " * depth + "b"
    if how == "binary":
        return bytes(draw(st.lists(st.integers(0, 255), max_size=64))).decode("latin-1")
    return ""


@st.composite
def spoiled_file(draw: st.DrawFn) -> tuple[str, list[str], str]:
    """A command line that hands over a file of one kind (``{spoiled}``), and the kind."""
    kind = draw(st.sampled_from(sorted(GOOD_FILES)))
    if kind.startswith(("config", "launch")):
        command = draw(st.sampled_from(["size", "layouts", "plan", "profile-layouts", "tune"]))
        argv = ["{spoiled}", *BASE[command][1:]]
    elif kind == "costs.json":
        command = draw(st.sampled_from(["plan", "simulate", "profile-layouts"]))
        argv = [*BASE[command], "--costs", "{spoiled}"]
    elif kind == "hardware.yaml":
        command = draw(st.sampled_from(["profile", "tune"]))
        argv = [*BASE[command], "--hardware", "{spoiled}"]
    else:
        command = draw(st.sampled_from(["ingest", "fit"]))
        argv = [arg.replace("{log}", "{spoiled}") for arg in BASE[command]]
    return command, argv, kind


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, str]:
    inputs = write_inputs(tmp_path_factory.mktemp("fuzz_inputs"))
    yield inputs
    report = os.environ.get("RAY_LAYOUT_FUZZ_REPORT")
    if report:
        Path(report).write_text(
            json.dumps({**_TALLY, "left": _LEFT, "accepted_cases": _ACCEPTED}, indent=2)
        )


def _shown(argv: list[str]) -> str:
    return " ".join(arg if len(arg) < 80 else arg[:60] + f"…({len(arg)} chars)" for arg in argv)


def _judge(argv: list[str], outcome: Outcome) -> None:
    """Tally the case and hold it to the property (the bench profile tallies every case first,
    and test_nothing_left fails it after)."""
    _TALLY["cases"] += 1
    clean = (
        outcome.exit_code == 2
        and len(outcome.stderr_lines) == 1
        and outcome.stderr.startswith("error: ")
        and not outcome.files_left
    )
    accepted = outcome.exit_code == 0 or outcome.reached_cluster
    held = (clean or accepted) and "Traceback" not in outcome.stderr
    _TALLY[("clean_exit_2" if clean else "accepted") if held else "left"] += 1
    if accepted:
        _ACCEPTED.append(_shown(argv))
    if held:
        return
    what = f"{_shown(argv)} -> exit {outcome.exit_code}: {outcome.stderr[-600:]}"
    _LEFT.append(what)
    assert PROFILE == "bench", what


def _run(command: str, argv: list[str], inputs: dict[str, str]) -> None:
    filled = [arg.format(**inputs) if "{" in arg else arg for arg in argv]
    if command == "tune":
        _judge(["tune", *filled], run_isolated(filled, entry="tune"))
    else:
        _judge([command, *filled], run_isolated([command, *filled]))


@settings(settings.get_profile(PROFILE))
@given(case=spoiled_flag())
def test_every_flag_takes_any_value_without_a_traceback(inputs, case):
    _run(*case, inputs)


@settings(settings.get_profile(PROFILE))
@given(case=spoiled_file(), data=st.data())
def test_every_file_kind_malformed_is_one_line(inputs, tmp_path_factory, case, data):
    command, argv, kind = case
    good = Path(GOOD_FILES[kind].format(**inputs)).read_text()
    spoiled = tmp_path_factory.mktemp("spoiled") / kind
    spoiled.write_text(data.draw(mutated(good)), encoding="utf-8")
    _run(command, argv, inputs | {"spoiled": str(spoiled)})


def test_nothing_left():
    """After a bench run: every case tallied above held (ci fails at the case itself)."""
    assert not _LEFT, "\n".join(_LEFT)
