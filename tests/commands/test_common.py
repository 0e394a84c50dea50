"""What every command shares: the model settings and their overrides, the one-line error
parser and messages, ``execute``'s exit statuses and the JSON-or-print output."""

from __future__ import annotations

import argparse
import errno
import io
import json
import sys
from pathlib import Path

import pytest
from rich.console import Console

from ray_layout.commands.common import (
    STOPPED,
    Command,
    ModelSettings,
    OneLineErrorParser,
    ParallelFlags,
    command_line,
    command_parser,
    emit,
    execute,
    terminal,
)
from ray_layout.commands.flags import from_args
from ray_layout.errors import ConfigError, OutputError, RunFailure, one_line
from tests.helpers.commands_cli import HANDBOOK


def parsed(*argv: str) -> argparse.Namespace:
    return command_parser(ModelSettings, "m", "").parse_args(list(argv))


def model_settings(*argv: str) -> ModelSettings:
    """``ModelSettings`` as a command line gives them."""
    return from_args(ModelSettings, parsed(*argv))


def test_a_usage_mistake_names_the_program_and_points_at_help(capsys):
    parser = OneLineErrorParser(prog="python -m ray_layout size")
    with pytest.raises(SystemExit) as exited:
        parser.error("argument --pp: invalid int value: 'a\nb'")
    assert exited.value.code == 2
    assert capsys.readouterr().err == (
        "error: python -m ray_layout size: argument --pp: invalid int value: 'a\\nb' (see --help)\n"
    )


def test_only_the_sizes_given_override_the_configs():
    assert ParallelFlags().sizes_given() == {}
    flags = ParallelFlags(pp=8, ep=4, global_batch_size=64)
    assert flags.sizes_given() == {"pp": 8, "ep": 4, "global_batch_size": 64}


def test_overrides_gather_sizes_lengths_and_environment_and_take_replacements():
    settings = model_settings(
        HANDBOOK,
        "--pp",
        "8",
        "--seq-length",
        "1024",
        "--env",
        "NUM_NODES=4",
        "--env",
        "1=/ckpt",
        "--env",
        "EMPTY=",
    )
    overrides = settings.overrides()
    assert overrides.sizes == {"pp": 8, "seq_length": 1024}
    assert overrides.environment == {"NUM_NODES": "4", "1": "/ckpt", "EMPTY": ""}
    assert settings.overrides(pp=2, vpp=2).sizes == {"pp": 2, "vpp": 2, "seq_length": 1024}


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (["NOEQUALS"], "--env must be NAME=VALUE with a shell variable's name, got 'NOEQUALS'"),
        (["A-B=1"], "got 'A-B=1'"),
        (["=1"], "got '=1'"),
        (["ÄB=1"], "got 'ÄB=1'"),
        (["A=1", "B=2", "A=3"], "--env sets A twice"),
    ],
)
def test_each_env_assignment_names_one_shell_variable_once(env, message):
    argv = [HANDBOOK, *(word for text in env for word in ("--env", text))]
    with pytest.raises(ConfigError) as refused:
        model_settings(*argv)
    assert message in str(refused.value)


def test_the_recipe_takes_the_overrides_and_says_its_notes_on_stderr(capsys, tmp_path):
    config = tmp_path / "with_flag.yaml"
    config.write_text(Path(HANDBOOK).read_text() + "megatron_args: [--frobnicate-widgets]\n")
    recipe = model_settings(str(config), "--pp", "2", "--dp", "4").recipe()
    assert (recipe.parallel.pp, recipe.parallel.dp) == (2, 4)
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"note: {config}: --frobnicate-widgets unknown")


def failing(error: BaseException) -> Command:
    def run(settings: ModelSettings, console: Console) -> None:
        raise error

    return Command("failing", "raises", ModelSettings, run)


ARGS = parsed(HANDBOOK)


@pytest.mark.parametrize(
    ("error", "code"),
    [(ConfigError("bad\nvalue"), 2), (RunFailure("2 of 3 runs did not finish"), 1)],
)
def test_an_error_the_user_can_act_on_is_one_line_with_its_kinds_status(capsys, error, code):
    assert execute(failing(error), ARGS) == code
    assert capsys.readouterr().err == f"error: {one_line(str(error))}\n"


def test_settings_that_fail_their_checks_never_reach_the_command(capsys):
    ran = []
    command = Command("c", "", ModelSettings, lambda settings, console: ran.append(settings))
    assert execute(command, parsed(HANDBOOK, "--env", "x")) == 2
    assert not ran and capsys.readouterr().err.startswith("error: --env must be NAME=VALUE")
    assert execute(command, ARGS) == 0 and ran == [ModelSettings(config=HANDBOOK)]


def test_output_that_cannot_be_written_is_one_line_and_exit_1(capsys):
    assert execute(failing(OutputError("cannot write the output: stdout is closed")), ARGS) == 1
    assert capsys.readouterr().err == "error: cannot write the output: stdout is closed\n"


class Gone(io.StringIO):
    """A pipe whose reader left."""

    def write(self, text: str) -> int:
        raise BrokenPipeError(errno.EPIPE, "Broken pipe")


def line(command: Command, *argv: str) -> int:
    return command_line(command_parser(ModelSettings, "m", ""), argv, lambda args: command)


def test_a_reader_that_went_away_is_one_line_through_rich_too(capsys, monkeypatch):
    """rich's console would exit 1 in silence (its on_broken_pipe); the guard says why."""
    monkeypatch.setattr(sys, "stdout", Gone())

    def run(settings: ModelSettings, console: Console) -> None:
        console.print("a table")

    assert line(Command("c", "", ModelSettings, run), HANDBOOK) == 1
    assert capsys.readouterr().err == "error: cannot write the output: its reader closed the pipe\n"


def test_a_command_line_is_parsed_checked_and_run_inside_the_guard(capsys):
    ran = []
    command = Command("c", "", ModelSettings, lambda settings, console: ran.append(settings))
    assert line(command, HANDBOOK, "--pp", "2") == 0 and ran[0].parallel.pp == 2
    assert line(command, HANDBOOK, "--pp", "x") == 2  # argparse's exit, a status here
    assert line(command, HANDBOOK, "--env", "x") == 2 and len(ran) == 1
    assert capsys.readouterr().err.count("\n") == 2


def test_an_interrupt_says_what_the_command_it_stopped_left(capsys):
    def run(settings: ModelSettings, console: Console) -> None:
        raise KeyboardInterrupt

    assert Command("c", "", ModelSettings, run).stopped == STOPPED
    assert line(Command("c", "", ModelSettings, run, "the runs stopped"), HANDBOOK) == 130
    assert capsys.readouterr().err == "interrupted: the runs stopped\n"


def test_a_report_is_json_or_what_its_show_prints(capsys):
    report = {"layout": "Et|tL", "ms": [1.5]}
    emit(report, True, lambda r, c: pytest.fail("shown"), Console())
    assert json.loads(capsys.readouterr().out) == report
    emit(report, False, lambda r, c: print(f"shown {r['layout']}"), Console())
    assert capsys.readouterr().out == "shown Et|tL\n"
    assert terminal().width >= 120  # a table is never squeezed below a readable width
