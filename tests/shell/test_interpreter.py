"""The interpreter runs a script as bash would: functions, loops, ``case``, ``(( ))``, ``eval``,
``set --``, what needs a real shell left unresolved with its line, unset variables taken as
empty and remembered, and every construct bounded.  The whole-script comparisons with real bash
are in test_against_bash.py; here each rule on its own."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ray_layout.shell.interpreter import MAX_DEPTH, MAX_STEPS, run_script
from ray_layout.shell.refusal import ShellError
from ray_layout.shell.values import Unresolved, not_set
from tests.helpers.shell_bash import variable, words


def test_arithmetic_and_printf_on_plain_values():
    assert variable("A=3\nB=58\nN=$((A + B))", "N") == "61"
    assert variable("G=8\nN=2\nW=$(($G*$N))", "W") == "16"
    assert variable('printf -v F "[0]*%d+[1]*%d" 3 58', "F") == "[0]*3+[1]*58"
    assert variable("N=8\n(( N += 8 ))\nlet 'N *= 2'", "N") == "32"


def test_functions_loops_and_case_run_as_bash_runs_them():
    script = (
        "add() { local n=$1; TOTAL=$((TOTAL + n)); }\n"
        "TOTAL=0\nfor i in 1 2 3; do add $i; done\n"
        "i=0\nwhile (( i < 4 )); do i=$((i + 1)); [[ $i == 2 ]] && continue; A+=($i); done\n"
        'case "$TOTAL" in 6|7) K=six;; *) K=other;; esac\n'
        "for ((j = 0; j < 2; j++)); do B+=(x$j); done\n"
        'cmd "$TOTAL" "${A[@]}" $K "${B[@]}" "$n"'
    )
    assert words(script) == ["cmd", "6", "1", "3", "4", "six", "x0", "x1", ""]


def test_the_argument_parsing_idiom_takes_the_scripts_arguments():
    script = (
        "PP=1\nwhile [[ $# -gt 0 ]]; do case $1 in\n"
        "  --pp) PP=$2; shift 2;;\n  --nodes=*) N=${1#*=}; shift;;\n  *) shift;;\n"
        "esac; done\ncmd $PP $N"
    )
    run = run_script(script, "t.sh", arguments=["--pp", "4", "x", "--nodes=2"])
    assert run.commands[-1].argv == ("cmd", "4", "2")
    assert variable("set -- a b c\nshift\nX=$1$#", "X") == "b2"


def test_what_needs_a_real_shell_is_unresolved_with_its_line():
    run = run_script("H=$(hostname)\nfor i in $(ls); do N=$i; done\n", "t.sh")
    assert run.variables["H"].unresolved == (
        "$H (line 1) holds $(hostname) (runs hostname (line 1), whose output needs a real "
        "shell); give --env H=VALUE"
    )
    assert "N is set in a for loop at line 2 over $(ls)" in run.variables["N"].reason
    filled = run_script("H=$(hostname)\n", "t.sh", {"H": "n1"}).variables["H"]
    assert filled.text == "n1"  # --env fills what the reader cannot follow


def test_a_builtin_only_command_substitution_needs_no_hint():
    script = (
        "A=(1 2 3)\nS=$(IFS=', '; echo \"${A[*]}\")\n"
        "D=$(dirname /a/b/c.sh)\nB=$(basename /x/y.sh .sh)"
    )
    assert [variable(script, name) for name in ("S", "D", "B")] == ["1,2,3", "/a/b", "y"]
    here = 'DIR=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" &> /dev/null && pwd)'
    assert run_script(here, "/work/s/run.sh").variables["DIR"].text == "/work/s"


def test_an_if_on_plain_values_takes_its_branch_and_one_on_an_outcome_takes_both():
    script = 'P=${PROFILE:-0}\nif [ "$P" = 1 ]; then C="nsys"; else C=""; fi\n'
    assert variable(script, "C") == ""
    assert variable(script, "C", PROFILE="1") == "nsys"
    unknown = variable('if [ -f "$K" ]; then A=1; else A=2; fi', "A", K="/k")
    assert isinstance(unknown, Unresolved) and "a test on the file system" in unknown.reason
    assert variable("if [ -f /k ]; then A=1; else A=1; fi", "A") == "1"  # the same either way
    assert variable('X=\n[ -z "$X" ] && X=5', "X") == "5"
    assert variable("X=1\n[ $X -eq 1 ] || X=5", "X") == "1"


def test_an_unset_variable_is_empty_as_in_bash_and_what_it_decides_is_remembered():
    run = run_script('if [ -z "$BIG" ]; then L=4; else L=8; fi\ncmd --num-layers $L', "t.sh")
    (command,) = run.commands
    assert command.argv == ("cmd", "--num-layers", "4")
    assert command.words[2].unknown.startswith("$BIG, which the script does not set")
    run = run_script('if [ -n "$BIG" ]; then L=8; fi\ncmd $L', "t.sh")
    lone = run.commands[0].words[1]  # bash passes no word; kept as written, for its flag
    assert (lone.text, lone.unknown) == ("$L", not_set("L") + ", and on $BIG")
    stopped = run_script('[ -z "$BASE" ] && exit 1\ncmd', "t.sh")
    assert stopped.commands == () and "because $BASE is not set" in stopped.stopped


def test_eval_runs_known_text_and_an_unknown_one_leaves_everything_after_unknown():
    assert variable("eval NUM_LAYERS=24", "NUM_LAYERS") == "24"
    run = run_script('L=4\neval "$(cat extra.sh)"\ncmd $L', "t.sh")
    assert "the eval at line 2" in run.commands[-1].words[1].unresolved
    held = run_script('T=$(date)\nC="torchrun x.py --num-layers 4 --log log-$T"\neval $C', "t.sh")
    assert held.commands[-1].argv[:4] == ("torchrun", "x.py", "--num-layers", "4")
    assert held.commands[-1].words[-1].unresolved.startswith("$T (line 1) holds $(date)")


def test_set_e_and_set_u_decide_what_runs():
    assert run_script("set -e\nfalse\ncmd", "t.sh").commands == ()
    assert len(run_script("set -e\nfalse || true\ncmd", "t.sh").commands) == 1
    stopped = run_script("set -euo pipefail\nX=$NOPE\ncmd", "t.sh")
    assert "$NOPE is not set, so set -u stops" in stopped.stopped
    assert len(run_script("set -u\nX=${NOPE:-}\ncmd", "t.sh").commands) == 1


def test_heredocs_are_data_and_a_launch_line_keeps_its_environment_prefixes():
    script = "cat > x.sh <<EOF\npython pretrain_gpt.py --num-layers 2\nDon't\nEOF\n"
    reading = run_script(script + "OMP_NUM_THREADS=8 torchrun pretrain_gpt.py\n", "t.sh")
    assert [c.words[0].text for c in reading.commands] == ["cat", "torchrun"]
    assert [n for n, _ in reading.commands[-1].environment] == ["OMP_NUM_THREADS"]


def test_a_here_document_given_to_sbatch_is_the_script_it_runs():
    script = (
        'CMD="python pretrain_gpt.py --num-layers 4"\nsbatch <<EOF\nsrun bash -c "${CMD}"\nEOF\n'
    )
    argvs = [c.argv for c in run_script(script, "t.sh").commands]
    assert argvs[-1] == ("python", "pretrain_gpt.py", "--num-layers", "4")


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
    commands = run_script(script, "t.sh").commands
    assert [[w.text for w in c.words] for c in commands] == expected


def test_a_process_substitution_as_an_argument_needs_a_real_shell():
    (command,) = run_script("diff <(a) b", "t.sh").commands
    assert command.words[1].unresolved == "<(a) (a process substitution, which needs a real shell)"


@pytest.mark.parametrize(
    ("script", "message"),
    [
        ("while :; do :; done", f"runs more than {MAX_STEPS:,} commands"),
        ("f() { f; }; f", f"function f nests more than {MAX_DEPTH} calls deep"),
        ("X=ab; while :; do X=$X$X; done", "a value of more than 1,000,000 characters"),
        ('A=(x); while :; do A+=("${A[@]}"); done', "an array of more than 100,000 elements"),
    ],
)
def test_work_is_bounded_and_a_runaway_script_is_one_line(script, message):
    with pytest.raises(ShellError, match=message) as caught:
        run_script(script, "t.sh")
    assert "\n" not in str(caught.value)


@settings(max_examples=200, deadline=None)
@given(
    st.text(
        alphabet=st.sampled_from(list("abX$=(){}[];|&<>'\"\\ \n#-+*0159`!?:,.@ifthenfidonecase")),
        max_size=120,
    )
)
def test_any_text_reads_or_fails_with_one_shell_error(text):
    try:
        run_script(text, "t.sh")
    except ShellError as exc:
        assert "\n" not in str(exc).replace("\\n", "")
