"""The builtins a launch script uses do to the reader's state what they do to bash's: ``set``,
``shift``, ``unset``, ``let``, ``eval``, ``source``, ``command``, ``exec``; what a builtin would
read from outside (``read``, ``getopts``) is unresolved."""

from __future__ import annotations

import pytest

from ray_layout.shell.interpreter import run_script
from ray_layout.shell.values import Unresolved
from tests.helpers.shell_bash import bash_words, needs_bash, variable, words


@needs_bash
@pytest.mark.parametrize(
    "setup",
    [
        'set -- a b c d; shift 2; P="$*"',
        "set -- x; set -euxo pipefail; P=$#$1",
        "A=1; B=2; unset A; P=${A:-gone}$B",
        "let 'P = 3 * 4' 'Q = P + 1'; P=$P$Q",
        "eval 'P=$((2 + 3))'; eval \"Q=\\$P\"; P=$Q",
        "true && P=t || P=f; false || P+=x",
        "if [ $UNSET = raw ]; then P=raw; else P=other; fi",  # bash: `[ = raw ]`, status 2
        "command eval 'P=ran'",
        "f() { P=func; }; command f 2>/dev/null; P=${P:-builtin-only}",
    ],
)
def test_builtins_change_the_state_as_in_bash(setup):
    assert words(f'{setup}\ncmd "$P"') == bash_words(setup, '"$P"')


def test_source_reads_a_file_next_to_the_script_with_its_own_arguments():
    files = {"/w/models/m.sh": 'L=$1\nMODEL=(--num-layers "$L")\n'}
    run = run_script(
        'source "$(dirname "$0")/models/m.sh" 24\ncmd "${MODEL[@]}"',
        "/w/run.sh",
        read_file=files.get,
    )
    assert run.commands[-1].argv == ("cmd", "--num-layers", "24")


def test_exec_runs_its_command_and_ends_the_script():
    run = run_script("exec torchrun x.py\ncmd never\n", "t.sh")
    assert [c.argv for c in run.commands] == [("torchrun", "x.py")]


def test_what_a_builtin_reads_from_outside_is_unresolved():
    assert isinstance(variable("read -r NAME", "NAME"), Unresolved)
    assert isinstance(variable("while getopts 'n:' o; do N=$OPTARG; done", "N"), Unresolved)
