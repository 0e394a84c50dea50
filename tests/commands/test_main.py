"""``python -m ray_layout`` itself: one parser for every command, one-line errors with exit 2,
and the entry as a user runs it (a subprocess, a pipe that closes early)."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ray_layout.commands.common import STOPPED
from ray_layout.commands.main import COMMANDS, build_parser, main
from ray_layout.measure.store import CostStore
from ray_layout.model.costs import load_costs
from ray_layout.model.layout import Layout
from ray_layout.model.loading import load_recipe
from tests.helpers.command_exits import UNWRITABLE, entry, interrupted, with_unwritable_stdout
from tests.helpers.commands_cli import COSTS, HANDBOOK
from tests.helpers.paths import ROOT
from tests.helpers.synthetic_runs import synthetic_log


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            [
                "validate",
                "Et*4|t*4|t*4|t*4L",
                "--pp",
                "4",
                "--num-layers",
                "16",
                "--mtp-layers",
                "1",
            ],
            "0 MTP layers m, the model has 1",
        ),
        (["validate", "Etx|L", "--pp", "2", "--num-layers", "1"], "invalid symbol 'x'"),
        (
            [
                "validate",
                "Ett|tt|tt|ttL",
                "--pp",
                "2",
                "--num-layers",
                "8",
                "--no-overlap-p2p-communication",
            ],
            "needs PP > 2",
        ),
        (["size", "no/such/file.yaml"], "cannot read"),
        (["size", HANDBOOK, "--tp", "3"], "not divisible by TP 3"),
        (["size", HANDBOOK, "--pp", "4", "--layout", "Et*4|t*4|t*4|t*4L"], "MTP layers"),
        (["layouts", HANDBOOK, "--pp", "0"], "must be >= 1"),
        (["size", HANDBOOK, "--pp", "four"], "'four'"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, argv, message):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err
    assert err.count("\n") == 1 and err.startswith("error: ")


def test_module_entry_point_runs_as_a_user_would():
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "ray_layout",
            "validate",
            "Et*5|t*6|t*5|mL",
            "--pp",
            "4",
            "--num-layers",
            "16",
            "--mtp-layers",
            "1",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "valid: Megatron accepts" in done.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "ray_layout", "size", "tests/data/train_moe_16l.sh", "--tp", "5"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert bad.returncode == 2 and "Traceback" not in bad.stderr


LISTING = [
    "layouts",
    HANDBOOK,
    "--pp",
    "4",
    "--vpp",
    "2",
    "--allow-standalone-mtp",
    "--limit",
    "5000",
]


# A short output goes into a pipe whole before its reader leaves: only the listing meets a
# closed pipe.
UNWRITTEN = [
    *((LISTING, where) for where in UNWRITABLE),
    *((argv, where) for argv in (["size", HANDBOOK], ["--help"]) for where in UNWRITABLE),
]


@pytest.mark.parametrize(
    ("argv", "where"),
    [case for case in UNWRITTEN if case[0] == LISTING or case[1] != "closed pipe"],
    ids=lambda value: value if isinstance(value, str) else value[0],
)
def test_output_that_cannot_be_written_is_one_line_and_exit_1(argv, where):
    """``> /dev/full``, ``>&-``, ``| head -c1``: never a traceback, never exit 0 in silence."""
    ended = with_unwritable_stdout(entry("ray_layout", *argv), where)
    assert ended.status == 1, ended
    assert (
        ended.stderr.startswith("error: cannot write the output: ")
        and ended.stderr.count("\n") == 1
    )


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_plan_ends_in_one_line_and_130(signum):
    """Ctrl-C, ``kill``: the exact search of a 61-layer model on 8 x 4 stages runs for seconds."""
    plan = ["plan", str(ROOT / "configs" / "deepseek_v3_zoo_h100.yaml"), "--costs", "flops"]
    ended = interrupted(entry("ray_layout", *plan), signum)
    assert ended.status == 130, ended
    assert ended.stderr == f"interrupted: {STOPPED}\n" and ended.stdout == ""


def test_help_lists_every_command_once_in_the_order_they_are_declared(capsys):
    names = [command.name for command in COMMANDS]
    assert len(set(names)) == len(names)
    assert "tune" not in names  # the tune has its own entry, python -m ray_layout.tune
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["--help"])
    assert exited.value.code == 0
    listing = capsys.readouterr().out.partition("positional arguments:")[2]
    assert re.findall(r"^    (\S+)", listing, re.MULTILINE) == names


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "the following arguments are required: COMMAND"),
        (["sise", HANDBOOK], "invalid choice: 'sise'"),
        (["size", HANDBOOK, "--frobnicate"], "unrecognized arguments: --frobnicate"),
    ],
)
def test_a_command_line_argparse_refuses_is_one_line_naming_the_program(capsys, argv, message):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: python -m ray_layout") and err.endswith("(see --help)\n")
    assert message in err and err.count("\n") == 1


@pytest.mark.parametrize("command", [command.name for command in COMMANDS])
def test_every_command_has_help_that_exits_0(capsys, command):
    assert main([command, "--help"]) == 0
    assert capsys.readouterr().out.startswith(f"usage: python -m ray_layout {command}")


def ingest_argv(logs: list[str], store: Path) -> list[str]:
    return ["ingest", HANDBOOK, *logs, "--store", str(store), "--study", "s"]


def stored(store: Path) -> dict[str, int]:
    """Timer rows per stored run (a run is stored when its ``runs`` row is)."""
    runs = CostStore(store).read("runs", "s")
    timers = CostStore(store).read("timers", "s")
    return {run: int((timers["run_id"] == run).sum()) for run in runs["run_id"]}


def test_an_interrupted_ingest_stores_each_run_whole_or_not_at_all(tmp_path):
    """Ctrl-C in the middle: one line and 130; what is stored is whole, so that the same
    command again stores the rest and the store ends as an uninterrupted ingest's."""
    recipe, truth = load_recipe(HANDBOOK), load_costs(COSTS)
    logs = []
    for seed, text in enumerate(("Et*3|t*7|t*6m|L", "Et|t*15|m|L", "Et*4|t*4|t*4|t*4mL")):
        layout = Layout.parse(text, 4)
        log = synthetic_log(recipe.model, recipe.parallel, layout, truth, 16, 150, 0.01, seed)
        (tmp_path / f"{seed}.log").write_text(log)
        logs += ["--run", f"{text}={tmp_path / f'{seed}.log'}"]
    assert main(ingest_argv(logs, tmp_path / "whole")) == 0
    argv = ingest_argv(logs, tmp_path / "store")
    ended = interrupted(entry("ray_layout", *argv), signal.SIGINT, after_s=0.5)
    assert ended.status == 130 and ended.stderr == f"interrupted: {STOPPED}\n", ended
    assert set(stored(tmp_path / "store").items()) <= set(stored(tmp_path / "whole").items())
    assert main(argv) == 0
    assert stored(tmp_path / "store") == stored(tmp_path / "whole")
