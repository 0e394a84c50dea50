"""The bash reader runs a script's assignments as bash would: arithmetic and printf into
variables, control flow on plain values, what needs a real shell left unresolved with its line.
The lexer, the expansions, the grammar and the arithmetic have their own test files."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ray_layout.shell.refusal import ShellError
from ray_layout.shell.script import Unresolved, read_script
from tests.helpers.shell_bash import variable


def test_arithmetic_and_printf_on_plain_values():
    assert variable("A=3\nB=58\nN=$((A + B))", "N") == "61"
    assert variable("G=8\nN=2\nW=$(($G*$N))", "W") == "16"
    assert variable('printf -v F "[0]*%d+[1]*%d" 3 58', "F") == "[0]*3+[1]*58"


def test_what_needs_a_real_shell_is_unresolved_with_its_line():
    reading = read_script("H=$(hostname)\nfor i in 1 2; do N=$i; done\n", "t.sh")
    assert isinstance(reading.variables["H"], Unresolved)
    assert "command substitution" in reading.variables["H"].reason
    assert "line 2: a for block" in reading.variables["N"].reason
    filled = read_script("H=$(hostname)\n", "t.sh", {"H": "n1"}).variables["H"]
    assert filled.text == "n1"  # --env fills what the reader cannot follow


def test_an_if_on_plain_values_takes_its_branch_and_one_on_the_environment_takes_none():
    script = 'P=${PROFILE:-0}\nif [ "$P" = 1 ]; then C="nsys"; else C=""; fi\n'
    assert variable(script, "C") == ""
    assert variable(script, "C", PROFILE="1") == "nsys"
    unknown = variable('if [ -n "$KEY" ]; then A=1; else A=2; fi', "A")
    assert isinstance(unknown, Unresolved) and "$KEY" in unknown.reason
    assert variable('if [ -n "$KEY" ]; then A=1; else A=1; fi', "A") == "1"  # same either way
    assert variable('X=\n[ -z "$X" ] && X=5', "X") == "5"
    assert isinstance(variable('[ -z "$X" ] && X=5', "X"), Unresolved)  # X: the job's
    assert variable("X=1\n[ $X -eq 1 ] || X=5", "X") == "1"


def test_heredocs_are_data_and_a_launch_line_keeps_its_environment_prefixes():
    script = "cat > x.sh <<EOF\npython pretrain_gpt.py --num-layers 2\nDon't\nEOF\n"
    reading = read_script(script + "OMP_NUM_THREADS=8 torchrun pretrain_gpt.py\n", "t.sh")
    assert [c.words[0].text for c in reading.commands] == ["cat", "torchrun"]
    assert [n for n, _ in reading.commands[-1].environment] == ["OMP_NUM_THREADS"]


@given(st.text(max_size=200))
def test_any_text_reads_or_fails_with_one_config_error(text):
    try:
        read_script(text, "t.sh")
    except ShellError as exc:
        assert "\n" not in str(exc).replace("\\n", "")


@pytest.mark.parametrize(
    ("script", "expected"),
    [
        ("cmd --vocab-size 1000 > log 2>&1", [["cmd", "--vocab-size", "1000"]]),
        ("cmd --n 8 >> log 2> err < in", [["cmd", "--n", "8"]]),
        ("cmd --n 8 &>> log", [["cmd", "--n", "8"]]),
        ("cmd --n 8 >| log", [["cmd", "--n", "8"]]),  # >| is one operator, not a pipe
        ("cmd --n 8 2>&1 |& tee -a log", [["cmd", "--n", "8"], ["tee", "-a", "log"]]),
        ("cmd --n 8 > >(tee log) 2>&1", [["cmd", "--n", "8"]]),
        ("cmd --n 8 <<EOF\nDon't\nEOF", [["cmd", "--n", "8"]]),
    ],
)
def test_redirections_and_their_targets_are_no_words_of_the_command(script, expected):
    commands = read_script(script, "t.sh").commands
    assert [[w.text for w in c.words] for c in commands] == expected


def test_a_process_substitution_as_an_argument_needs_a_real_shell():
    (command,) = read_script("diff <(a) b", "t.sh").commands
    assert command.words[1].unresolved == "<(a) (a process substitution, which needs a real shell)"


def test_a_test_on_a_variable_nothing_set_inside_a_word_is_undecided():
    reading = read_script("if [ x$FLAG = x1 ]; then A=1; else A=2; fi", "t.sh")
    assert "$FLAG, which the script does not set" in reading.variables["A"].reason
