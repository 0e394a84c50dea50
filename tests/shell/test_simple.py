"""A simple command: prefixes set its environment (and the shell's variables while a function or
builtin runs), ``$?`` of an assignment is its substitution's, functions get their own
arguments and locals — each judged by bash."""

from __future__ import annotations

import pytest

from ray_layout.shell.interpreter import run_script
from tests.helpers.shell_bash import bash_words, needs_bash, words


@needs_bash
@pytest.mark.parametrize(
    "setup",
    [
        "X=1; f() { P=$X; }; X=2 f",
        "X=1; X=2 eval 'P=$X'; Q=$X; P=$P$Q",
        "f() { return 3; }; X=$(f); P=$?",
        "X=$(false); P=$?",
        "g() { local P=inner; }; P=outer; g",
        'h() { P="$# $2"; }; h a b c',
    ],
)
def test_a_simple_command_runs_as_bash_runs_it(setup):
    assert words(f'{setup}\ncmd "$P"') == bash_words(setup, '"$P"')


def test_a_prefix_on_an_external_command_is_its_environment_only():
    (command,) = run_script("X=1\nX=2 torchrun x.py\n", "t.sh").commands
    assert [(name, word.text) for name, word in command.environment] == [("X", "X=2")]
    assert run_script("X=1\nX=2 torchrun x.py\n", "t.sh").variables["X"].text == "1"


def test_an_unset_variable_before_the_command_is_no_word():
    (command,) = run_script("$PROFILER torchrun x.py --num-layers 2\ncmd $X", "t.sh").commands[:1]
    assert command.argv == ("torchrun", "x.py", "--num-layers", "2")
    assert run_script("$PROFILER torchrun x.py\nY=1", "t.sh").variables["Y"].text == "1"


def test_a_command_substitution_in_the_command_name_runs_once():
    run = run_script("$(which python) pretrain_gpt.py --num-layers 2", "t.sh")
    assert [c.argv for c in run.commands][:-1] == [("which", "python")]
