"""``python -m ray_layout`` itself: one parser for every command, one-line errors with exit 2,
and the entry as a user runs it (a subprocess, a pipe that closes early)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from ray_layout.commands.main import COMMANDS, build_parser, main
from tests.helpers.commands_cli import HANDBOOK


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
        (["size", HANDBOOK, "--pp", "four"], "invalid int value"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, argv, message):
    with pytest.raises(SystemExit) as exited:
        raise SystemExit(main(argv))
    assert exited.value.code == 2
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


def test_a_reader_that_leaves_early_ends_the_command_quietly():
    """``python -m ray_layout layouts ... | head -1``: no BrokenPipeError traceback."""
    command = [
        sys.executable,
        "-m",
        "ray_layout",
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
    done = subprocess.run(
        [
            "bash",
            "-c",
            'set -o pipefail; "$@" | head -1; echo "status ${PIPESTATUS[0]}"',
            "x",
            *command,
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.stderr == ""
    assert done.stdout.splitlines()[-1] == "status 141"


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
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: python -m ray_layout") and err.endswith("(see --help)\n")
    assert message in err and err.count("\n") == 1


@pytest.mark.parametrize("command", [command.name for command in COMMANDS])
def test_every_command_has_help_that_exits_0(capsys, command):
    with pytest.raises(SystemExit) as exited:
        main([command, "--help"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: python -m ray_layout {command}")
