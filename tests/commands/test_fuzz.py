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
import math
import os
import re
import shutil
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ray_layout.commands.main import build_parser
from ray_layout.commands.tune import build_parser as build_tune_parser
from ray_layout.errors import MeasurementError
from ray_layout.measure.logs import parse_log
from ray_layout.measure.store import CostStore
from ray_layout.options.checks import flag_type
from tests.helpers.command_exits import UNWRITABLE, entry, with_unwritable_stdout
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
    if action.type in (int, flag_type(int)):
        return INT_TEXT
    if action.type in (float, flag_type(float)):
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


# --- hostile input files: each is refused in one line (or, where marked, may be
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


# --- every number of a log is read whole by one reader (thousands separators read as
# the value they print, any tail no number), values no run has are refused at their line, and
# container runtimes' records are read as the lines they hold.

_VALUE = re.compile(r"(rank +\d+: |\(ms\): |allocated: |reserved: )(\d+)(\.\d+)")
_TAILS = ["x", "ms", ",5", "%", "e", ".0.0", "1,2"]
_STAMP = "2026-12-05T10:31:07.123456789Z"


def _spoiled_numbers(draw: st.DrawFn, log: str) -> tuple[str, str]:
    """(text, expected): "same" (reads as ``log`` does), "dropped" (one more line skipped) or
    "refused" (one line naming the line)."""
    how = draw(st.sampled_from(["separators", "cri", "docker", "tail", "impossible"]))
    if how == "separators":
        return _VALUE.sub(lambda m: f"{m[1]}{int(m[2]):,}{m[3]}", log), "same"
    lines = log.splitlines()
    if how == "cri":
        cut = draw(st.integers(0, 60))
        records = [
            f"{_STAMP} stdout P {line[:cut]}\n{_STAMP} stdout F {line[cut:]}"
            if len(line) > cut
            else f"{_STAMP} stderr F {line}"
            for line in lines
        ]
        return "\n".join(records) + "\n", "same"
    if how == "docker":
        records = [json.dumps({"log": line + "\n", "stream": "stdout"}) for line in lines]
        return "\n".join(records) + "\n", "same"
    if how == "tail":
        match = draw(st.sampled_from(list(_VALUE.finditer(log))))
        return log[: match.end()] + draw(st.sampled_from(_TAILS)) + log[match.end() :], "dropped"
    old, new = draw(
        st.sampled_from(
            [
                (r"\(ms\): \d+\.\d+", "(ms): 0.0"),  # a step of no time
                (r"rank +3: ", "rank -3: "),  # a negative rank
                (r"iteration +3/", "iteration        9/"),  # past --train-iters 6
                (r"iteration +5/", "iteration        2/"),  # back from iteration 4
                (r"\[Rank \d+\]", "[Rank -1]"),
            ]
        )
    )
    return re.sub(old, new, log, count=1), "refused"


@settings(settings.get_profile(PROFILE))
@given(data=st.data())
def test_every_number_of_a_log_is_read_whole_or_its_line_refused(inputs, tmp_path_factory, data):
    good = Path(inputs["log"]).read_text()
    text, expected = _spoiled_numbers(data.draw, good)
    base = parse_log(good)
    if expected == "refused":
        with pytest.raises(MeasurementError, match=r": line \d+: "):
            parse_log(text)
    else:
        parsed = parse_log(text)
        read = (parsed.timers, parsed.iterations, parsed.memory)
        assert (read == (base.timers, base.iterations, base.memory)) == (expected == "same")
        assert parsed.skipped_lines == base.skipped_lines + (expected == "dropped")
    spoiled = tmp_path_factory.mktemp("numbers") / "run.log"
    spoiled.write_text(text)
    argv = [arg.format(**inputs).replace(inputs["log"], str(spoiled)) for arg in BASE["fit"]]
    outcome = run_isolated(["fit", *argv])
    _judge(["fit", *argv], outcome)
    if expected == "same":
        assert outcome.exit_code == 0, outcome.stderr[-400:]
    if expected == "refused":
        assert outcome.exit_code == 2 and re.search(r": line \d+: ", outcome.stderr)


# --- output that cannot be written ends in one line and a non-zero exit, never a
# traceback or exit 0 in silence, and what the command stored is complete.
@settings(settings.get_profile(PROFILE))
@given(
    command=st.sampled_from([c for c in COMMANDS if c not in ("profile", "tune")]),  # clusters
    where=st.sampled_from(sorted(UNWRITABLE)),
)
def test_output_that_cannot_be_written_is_one_line_and_what_is_stored_is_whole(
    inputs, tmp_path_factory, command, where
):
    folder = tmp_path_factory.mktemp("unwritable")
    argv = [arg.format(**inputs) if "{" in arg else arg for arg in BASE[command]]
    ended = with_unwritable_stdout(entry("ray_layout", command, *argv), where, cwd=folder)
    assert "Traceback" not in ended.stderr, ended
    if ended.status == 0:  # a short output goes into a pipe whole before its reader leaves
        assert where == "closed pipe", ended  # and its notes (stderr) are those of a success
        assert not re.search(r"^error:|cannot write", ended.stderr, re.MULTILINE), ended
        return
    assert ended.status == 1 and len(ended.stderr.splitlines()) == 1, ended
    assert ended.stderr.startswith("error: cannot write the output: "), ended
    if command == "ingest" and where == "full disk":  # stored before its summary was printed
        assert len(CostStore(folder / "store").read("runs")) == 1


# --- a store part damaged (a claim, a Parquet part or one value of a row, what a crash,
# a disk or an older version leaves): `fit --store`, `ingest` and `store rm` each read it right
# or say one line naming it; rows stored twice are read once.

_ROW_VALUES = {
    pa.string(): [None, "", "Et*zz", "x" * 5000],
    pa.int64(): [None, 0, -1, 2**40],
    pa.float64(): [None, 0.0, -1.0, math.nan, math.inf],
}


@pytest.fixture(scope="module")
def stored(inputs, tmp_path_factory) -> tuple[Path, str]:
    """A store the good log was ingested into (its claim's writer gone): folder and run id."""
    store = tmp_path_factory.mktemp("fuzz_store") / "store"
    argv = [arg.format(**inputs) for arg in BASE["ingest"]]
    argv[argv.index("store")] = str(store)
    outcome = run_isolated(["ingest", *argv, "--json"])
    assert outcome.exit_code == 0, outcome.stderr
    return store, json.loads(outcome.stdout)[0]["run_id"]


def _spoil_row(draw: st.DrawFn, part: Path) -> None:
    """One value of one row set to a null, an empty, absurd or impossible one of its type."""
    data = pq.read_table(part)
    index = draw(st.integers(0, data.num_columns - 1))
    field = data.schema.field(index)
    values = data.column(index).to_pylist()
    values[draw(st.integers(0, len(values) - 1))] = draw(st.sampled_from(_ROW_VALUES[field.type]))
    spoiled = pa.array(values, field.type)
    pq.write_table(data.set_column(index, pa.field(field.name, field.type), spoiled), part)


def _spoil_store(draw: st.DrawFn, store: Path) -> str:
    """Damage one file of ``store``; what was done, for the report."""
    parts = sorted(path for path in store.rglob("*") if path.is_file())
    part = draw(st.sampled_from(parts))
    how = draw(st.sampled_from(["cut", "garbage", "empty", "folder", "fifo", "twice", "row"]))
    if "_claims" in part.parts:  # read by an ingest whose run has no runs row (it died first)
        for runs in store.glob("table=runs/study=*/part-*.parquet"):
            runs.unlink()
        how = "garbage" if how in ("twice", "row") else how
    content = part.read_bytes()
    if how == "twice":
        shutil.copy(part, part.with_name("part-twice.parquet"))
    elif how == "row":
        _spoil_row(draw, part)
    elif how in ("folder", "fifo"):
        part.unlink()
        part.mkdir() if how == "folder" else os.mkfifo(part)
    else:
        at = draw(st.integers(0, len(content)))
        noise = draw(st.binary(min_size=1, max_size=32)) if how == "garbage" else b""
        part.write_bytes(b"" if how == "empty" else content[:at] + noise)
    return f"{how} {part.relative_to(store)}"


@settings(settings.get_profile(PROFILE))
@given(data=st.data())
def test_every_damaged_store_part_is_one_line_or_read_right(inputs, stored, tmp_path_factory, data):
    good, run_id = stored
    store = tmp_path_factory.mktemp("damaged") / "store"
    shutil.copytree(good, store)
    damage = _spoil_store(data.draw, store)
    ingest = [arg.format(**inputs) for arg in BASE["ingest"]]
    ingest[ingest.index("store")] = str(store)
    argv = data.draw(
        st.sampled_from(
            [
                ["fit", HANDBOOK, "--store", str(store), "-o", "costs.json"],
                ["ingest", *ingest],
                ["store", "rm", run_id, "--store", str(store)],
            ]
        )
    )
    _judge([*argv, f"({damage})"], run_isolated(argv))


# --- numbers past a float, integers that are not digits, absurd costs, rope
# scalings Megatron cannot train, layouts at the limits and names with terminal escapes: each is
# one line (or a warning, or a note), by the one reader every path goes through.

NOT_DIGITS = ["1_0", "٣", "+4", " 4", "4 ", "0x10", "1e3", "9" * 400]
NOT_DECIMAL = ["1_0.5", "nan", "-inf", "1e400", " 2", "0x1p3"]
_HUGE = int("9" * 400)


def _number_flag(draw: st.DrawFn) -> tuple[str, list[str]]:
    """A command line with one int or float flag given a number Python reads but no one means."""
    command = draw(st.sampled_from(COMMANDS))
    numbers = {
        name: action
        for name, action in FLAGS[command].items()
        if action.type in (flag_type(int), flag_type(float))
    }
    name = draw(st.sampled_from(sorted(numbers)))
    texts = NOT_DIGITS if numbers[name].type is flag_type(int) else NOT_DECIMAL
    return command, [*BASE[command], f"{name}={draw(st.sampled_from(texts))}"]


def _absurd_file(draw: st.DrawFn, inputs: dict[str, str], folder: Path) -> tuple[str, list[str]]:
    """A config, config.json or COSTS.json holding a number past a float, an integer that is
    no digits, or a rope scaling Megatron cannot train."""
    kind = draw(st.sampled_from(["hf", "costs", "yaml", "megatron_args"]))
    if kind == "hf":
        raw = json.loads(Path(GOOD_FILES["config.json"]).read_text())
        key = draw(st.sampled_from(["rope_theta", "rms_norm_eps", "routed_scaling_factor",
                                    "first_k_dense_replace", "num_hidden_layers"]))  # fmt: skip
        raw[key] = draw(
            st.sampled_from([_HUGE, -_HUGE, 1e308 * 10, "1_0", 62 if key[0] == "f" else 0])
        )
        path = folder / "config.json"
        path.write_text(json.dumps(raw))
        return "size", [str(path), "--pp", "4"]
    if kind == "costs":
        raw = json.loads(Path(COSTS).read_text())
        key = draw(st.sampled_from(["p2p_inter_node_ms", "tail_fixed_ms", "a2a_ms", "tp"]))
        raw[key] = draw(st.sampled_from([_HUGE, -_HUGE, 2e7, float("nan")]))
        path = folder / "costs.json"
        path.write_text(json.dumps(raw, allow_nan=True))
        return "plan", [*BASE["plan"][:3], "--costs", str(path), *BASE["plan"][5:]]
    text = Path(HANDBOOK).read_text()
    if kind == "yaml":
        value = draw(
            st.sampled_from(["1_6", "016", "0x10", "0:16", str(_HUGE), "1.0e+400", ".nan"])
        )
        text = text.replace("num_layers: 16", f"num_layers: {value}")
    else:
        value = draw(st.sampled_from([*NOT_DIGITS, "nan"]))
        text += f"megatron_args: [--seed, '{value}']\n"
    path = folder / "config.yaml"
    path.write_text(text)
    return "size", [str(path), "--pp", "4"]


@settings(settings.get_profile(PROFILE))
@given(data=st.data())
def test_numbers_no_one_means_are_one_line_wherever_they_are_read(inputs, tmp_path_factory, data):
    """A flag's 1_0 or nan, a config's 400-digit rope_theta, YAML's 016, a COSTS.json transfer past
    the distributed timeout: one line naming it, exit 2, never an OverflowError or a silent 10."""
    if data.draw(st.booleans()):
        command, argv = _number_flag(data.draw)
        argv = [arg.format(**inputs) if "{" in arg else arg for arg in argv]
    else:
        command, argv = _absurd_file(data.draw, inputs, tmp_path_factory.mktemp("absurd"))
    outcome = _run_filled(command, argv)
    _judge([command, *argv], outcome)
    assert outcome.exit_code == 2, f"accepted: {_shown([command, *argv])}"


def test_legal_but_absurd_costs_and_untrainable_rope_are_said_in_one_line(tmp_path):
    """A backward 10,000x its forward or a step tail of hours plans with one warning line; a
    longrope scaling sizes with one note; a name's terminal escapes are shown, never acted on."""
    raw = json.loads(Path(COSTS).read_text())
    raw["backward_ms"]["t"], raw["tail_fixed_ms"] = 1e5, 7.2e6
    costs = tmp_path / "absurd.json"
    costs.write_text(json.dumps(raw))
    outcome = _run_filled("plan", [*BASE["plan"][:3], "--costs", str(costs), *BASE["plan"][5:]])
    warnings = [line for line in outcome.stderr_lines if line.startswith("warning: ")]
    assert outcome.exit_code == 0 and len(warnings) == 1, outcome.stderr[-600:]
    assert "backward_ms.t is 10,000x forward_ms.t" in warnings[0]
    assert "tail_fixed_ms is 7.2e+06 ms" in warnings[0]
    hf = json.loads(Path(GOOD_FILES["config.json"]).read_text())
    hf |= {"rope_scaling": {"rope_type": "longrope", "factor": 4.0}}
    hf |= {"_name_or_path": "org/\x1b[31mred\rname"}
    config = tmp_path / "config.json"
    config.write_text(json.dumps(hf))
    outcome = _run_filled("size", [str(config), "--pp", "1"])
    assert outcome.exit_code == 0, outcome.stderr[-600:]
    assert not {"\x1b", "\r"} & set(outcome.stdout + outcome.stderr)
    assert "its longrope RoPE scaling has no Megatron" in outcome.stdout + outcome.stderr


@pytest.mark.parametrize(
    "layout",
    ["(" * 100_000 + "t", "(t)*1" * 20_000, "t*" + "9" * 5000, "(" * 30_000 + "t)*2" * 30_000],
)
def test_a_layout_at_the_limits_is_one_line_in_time(layout):
    """Runs of parentheses took Megatron's regex minutes; every such string is one line."""
    argv = [*BASE["validate"]]
    argv[0] = layout
    outcome = _run_filled("validate", argv)
    assert outcome.exit_code == 2 and len(outcome.stderr_lines) == 1, outcome.stderr[-400:]
    assert outcome.stderr.startswith("error: ") and "Traceback" not in outcome.stderr
