"""Assignments as bash makes them, judged by bash: appends, array elements, negative indices,
declarations and their options, integers; a value the reader lacks stays a named hole."""

from __future__ import annotations

import pytest

from ray_layout.shell.interpreter import run_script
from ray_layout.shell.values import Unresolved
from tests.helpers.shell_bash import bash_words, needs_bash, variable, words


@needs_bash
@pytest.mark.parametrize(
    "setup",
    [
        "A=(a b c); A[1]=x; A[3]=d; A+=(e); A[-1]=z",
        "LS=(8 16); LS[0]=24; B=$LS; LS=q",
        "S=a; S+=b; A=(x y); A+=z",
        "f() { local X=in; declare Y=in2; G=g; }; X=out; Y=out2; f",
        "declare -i N=2+3; N+=4; export E=1 F; readonly R=r",
        "declare -a D=(1 2); typeset T='a b'",
        "i=1; A=(p q r); A[$i]=Q; A[i+1]=R",
    ],
)
def test_assignments_give_what_bash_gives(setup):
    command = '"${A[@]}" "${LS[@]}" "$B" "$S" "$X" "$Y" "$G" "$N" "$E" "$R" "${D[@]}" "$T"'
    assert words(f"{setup}\ncmd {command}") == bash_words(setup, command)


def test_what_the_reader_cannot_hold_is_unresolved_not_guessed():
    assert words("A=(); A[5]=x; A[2]=y\ncmd ${#A[@]} ${A[@]} ${!A[@]}") == [
        "cmd",
        "2",
        "y",
        "x",
        "2",
        "5",
    ]
    assert isinstance(variable("declare -A M=([k]=v)", "M"), Unresolved)
    assert isinstance(variable("A=([3]=x)", "A"), Unresolved)
    run = run_script("T=$(date)-x\n", "t.sh")
    assert run.variables["T"].unresolved.startswith("$T (line 1) holds $(date)")
