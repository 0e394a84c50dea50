"""Property: whatever a user types, every command ends in its output (exit 0) or in one line on
stderr (exit 2), within bounded memory and time, with no traceback and no file written by a
refused command, and no cluster started before every setting passed its check.

Each generated case runs isolated (tests/helpers/isolated_command.py). ``make test`` runs the ``ci``
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
from tests.helpers.isolated_command import Outcome, run_isolated
from tests.helpers.malformed_inputs import COSTS, HANDBOOK, HARDWARE, LAYOUT, ROOT, write_inputs

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


# --- the hostile classes of issue 20: each is refused in one line (or, where marked, may be
# read right); a hidden set of new cases of the same classes is run the same way.

_TIMER_VALUE = re.compile(r"(rank +\d+: )(\d+\.\d+)")
_ELAPSED = re.compile(r"(elapsed time per iteration \(ms\): )(\d+\.\d+)")
NON_FINITE = ["nan", "inf", "-inf", "NaN", "-3.0", "1e300", "-0.5"]


def _hostile_log(draw: st.DrawFn, log: str) -> tuple[str, bool]:
    """A log spoiled in one of the ways that once stored wrong rows: (text, may be accepted)."""
    how = draw(st.sampled_from(["timer", "elapsed", "restart", "blanks", "long"]))
    if how in ("timer", "elapsed"):
        pattern = _TIMER_VALUE if how == "timer" else _ELAPSED
        matches = list(pattern.finditer(log))
        match = matches[draw(st.integers(0, len(matches) - 1))]
        value = draw(st.sampled_from(NON_FINITE))
        return log[: match.start(2)] + value + log[match.end(2) :], False
    if how == "restart":  # a restarted job appended to the same file: split or refused
        cut = draw(st.integers(1, len(log.splitlines()) - 1))
        return log + "".join(log.splitlines(keepends=True)[:cut]), True
    if how == "blanks":  # linear regexes: a line of blanks is read in time
        return log.replace("\n", "\n" + " " * draw(st.sampled_from([20_000, 150_000])), 1), True
    return log + "x" * draw(st.sampled_from([10**6, 3 * 10**6])) + "\n", True


# Values each file kind must refuse: absurd costs, and sizes past every bound.
ABSURD = {
    "costs.json": ['"mtp_standalone_factor": 1e-300', '"jitter_cv": 9e6', '"t": 5e-324'],
    "config.json": ['"num_hidden_layers": 1000000000', '"n_routed_experts": -1'],
    "config.yaml": ["parallel: false", "num_layers: 1000000000"],
    "hardware.yaml": ["hbm_gib: 1e-300", "time_scale: -1"],
}


def _hostile_mapping(draw: st.DrawFn, text: str, kind: str) -> str:
    """A YAML/JSON file with a duplicate key, an alias bomb, a non-string key or an absurd
    value."""
    how = draw(st.sampled_from(["duplicate", "aliases", "int_key", "absurd"]))
    if text.lstrip().startswith("{"):  # JSON: no aliases; keys must be strings
        body = text.lstrip()[1:]
        key = re.search(r'"([^"]+)"\s*:\s*([^,{}\[\]]+)', body)
        if how == "duplicate" and key:
            return "{" + f'"{key[1]}": {key[2].strip()}, ' + body
        if how == "absurd" and kind in ABSURD:
            key, _, value = draw(st.sampled_from(ABSURD[kind])).partition(": ")
            replaced = re.sub(rf"{key}\s*:\s*[^,}}\n]+", f"{key}: {value}", body, count=1)
            return "{" + (replaced if replaced != body else f"{key}: {value}, " + body)
        return "{1: 2, " + body
    if how == "duplicate":
        first = next(line for line in text.splitlines() if re.match(r"^\w+:\s*\S", line))
        return text + first + "\n"
    if how == "aliases":
        bomb = 'a: &a ["x","x","x","x","x","x","x","x","x"]\n'
        for level in "bcdefghi":
            previous = chr(ord(level) - 1)
            bomb += f"{level}: &{level} [" + ",".join([f"*{previous}"] * 9) + "]\n"
        return bomb + text
    if how == "absurd" and kind in ABSURD:
        key, _, value = draw(st.sampled_from(ABSURD[kind])).partition(": ")
        replaced = re.sub(rf"^{key}:.*$", f"{key}: {value}", text, count=1, flags=re.M)
        return replaced if replaced != text else f"{key}: {value}\n" + text
    return "1: 2\n" + text


@st.composite
def hostile_file(
    draw: st.DrawFn, inputs: dict[str, str]
) -> tuple[str, list[str], str, bytes, bool]:
    """(command, argv, kind, content, may be accepted): a file of one kind made hostile."""
    command, argv, kind = draw(spoiled_file())
    good = Path(GOOD_FILES[kind].format(**inputs)).read_text()
    if kind == "run.log":
        text, acceptable = _hostile_log(draw, good)
    elif kind == "launch.sh":
        text, acceptable = good.replace("\n", "\ncat <<EOF\nDon't\nEOF\n", 1), True
    else:
        text, acceptable = _hostile_mapping(draw, good, kind), False
    content = text.encode("utf-8")
    if draw(st.integers(0, 5)) == 0:  # bytes that are not UTF-8, anywhere in the file
        at = draw(st.integers(0, len(content)))
        content = content[:at] + b"\xff\xfe\xc3" + content[at:]
        acceptable = acceptable and kind == "run.log"  # a log's stray bytes are replaced
    return command, argv, kind, content, acceptable


def _run_filled(command: str, argv: list[str]) -> Outcome:
    return run_isolated(argv, entry="tune") if command == "tune" else run_isolated([command, *argv])


@settings(settings.get_profile(PROFILE))
@given(data=st.data())
def test_every_hostile_file_class_is_one_line_or_read_right(inputs, tmp_path_factory, data):
    command, argv, kind, content, acceptable = data.draw(hostile_file(inputs))
    spoiled = tmp_path_factory.mktemp("hostile") / kind
    spoiled.write_bytes(content)
    filled = [arg.format(**inputs, spoiled=str(spoiled)) for arg in argv]
    outcome = _run_filled(command, filled)
    _judge([command, *filled], outcome)
    assert acceptable or outcome.exit_code != 0, f"{kind} accepted: {_shown([command, *filled])}"


@pytest.mark.parametrize("special", ["fifo", "/dev/zero", "folder", "sparse"])
@pytest.mark.parametrize("kind", sorted(GOOD_FILES))
def test_a_special_file_in_place_of_any_file_is_refused_at_once(inputs, tmp_path, special, kind):
    """FIFOs, devices, folders and huge sparse files: one line, never a hang or MemoryError."""
    path = tmp_path / kind
    if special == "fifo":
        os.mkfifo(path)
    elif special == "folder":
        path.mkdir()
    elif special == "sparse":
        with open(path, "wb") as sparse:
            sparse.truncate(9 * 2**30)
    else:
        path = Path(special)
    command, argv = SPECIAL_FILE_CASES[kind]
    outcome = _run_filled(command, [arg.format(**inputs, spoiled=str(path)) for arg in argv])
    assert outcome.exit_code == 2 and len(outcome.stderr_lines) == 1, outcome.stderr[-400:]
    assert outcome.stderr.startswith("error: ") and "Traceback" not in outcome.stderr


SPECIAL_FILE_CASES = {  # one command that reads each kind of file
    "config.yaml": ("plan", ["{spoiled}", *BASE["plan"][1:]]),
    "config.json": ("size", ["{spoiled}", *BASE["size"][1:]]),
    "launch.sh": ("size", ["{spoiled}", *BASE["size"][1:]]),
    "costs.json": ("plan", [*BASE["plan"], "--costs", "{spoiled}"]),
    "hardware.yaml": ("profile", [*BASE["profile"], "--hardware", "{spoiled}"]),
    "run.log": ("fit", [arg.replace("{log}", "{spoiled}") for arg in BASE["fit"]]),
}
