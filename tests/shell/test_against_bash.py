"""The shell reader against real bash (tests/helpers/bash_oracle.py), construct by construct:
each small script below exercises one construct the reader evaluates on known values and ends
in a launch line; bash runs it with every external command stubbed, and the reader's commands must
be exactly the ones bash ran (same count, same argv), every one of them known.  Then a property
test builds scripts from the same constructs and judges them the same way."""

from __future__ import annotations

import tempfile
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers.bash_oracle import (
    differences_from_bash,
    needs_bash,
    read_existing,
    run_bash,
    write_script,
)

pytestmark = needs_bash

L = "torchrun --nproc_per_node 8 pretrain_gpt.py"


@dataclass(frozen=True)
class Case:
    script: str
    arguments: tuple[str, ...] = ()
    environment: Mapping[str, str] = field(default_factory=dict)
    files: Mapping[str, str] = field(default_factory=dict)  # beside the script
    ran: int = 1  # commands bash must record (helpers such as dirname left out): the case's sanity
    # a construct of section 3: read, every command known and bash's.  Past that list: a one-line
    # refusal, or words marked unknown, are allowed; a reading that differs from bash is not.
    core: bool = True


def case(script: str, **kwargs) -> Case:
    return Case(textwrap.dedent(script).lstrip("\n"), **kwargs)


CASES: dict[str, Case] = {
    # functions: arguments, local, globals they set, "$@", $#, return, exit
    "function_echo_arithmetic": case(
        f"""
        layers() {{ echo $(( $1 * $2 )); }}
        N=$(layers 4 6)
        {L} --num-layers $N
        """
    ),
    "function_local_and_global": case(
        f"""
        h=7
        set_size() {{ local h=$1; HIDDEN=$((h * 2)); }}
        set_size 512
        {L} --hidden-size $HIDDEN --seed $h
        """
    ),
    "function_appends_its_arguments": case(
        f"""
        ARGS=()
        add() {{ ARGS+=("$@"); }}
        add --num-layers 24
        add --name "two words"
        {L} "${{ARGS[@]}}"
        """
    ),
    "function_shift_and_count": case(
        f"""
        f() {{ shift; echo "$#:$*:$1"; }}
        R=$(f a b c)
        {L} --tag "$R"
        """
    ),
    "function_keyword_form": case(
        f"""
        function build {{ OUT="--num-layers $1"; }}
        build 32
        {L} $OUT
        """
    ),
    "function_return_status": case(
        f"""
        f() {{ if [ "$1" = a ]; then return 3; fi; echo no; }}
        f a
        R=$?
        {L} --status $R
        """
    ),
    "function_exit_stops_the_script": case(
        f"""
        die() {{ echo "$1"; exit 0; }}
        {L} --first 1
        die bye
        {L} --second 2
        """
    ),
    "function_calls_function": case(
        f"""
        twice() {{ echo $(( $1 * 2 )); }}
        quad() {{ twice $(twice $1); }}
        {L} --num-layers $(quad 6)
        """
    ),
    "function_recursion_bounded": case(
        f"""
        fact() {{ if (( $1 <= 1 )); then echo 1; else echo $(( $1 * $(fact $(( $1 - 1 ))) )); fi; }}
        {L} --n $(fact 5)
        """
    ),
    "function_runs_the_launch": case(
        f"""
        launch() {{ {L} "$@"; }}
        launch --num-layers 8 --hidden-size 64
        """
    ),
    # loops
    "for_over_words": case(
        f"""
        FLAGS=""
        for f in a b c; do FLAGS="$FLAGS --$f"; done
        {L} $FLAGS
        """
    ),
    "for_over_array": case(
        f"""
        A=(1 2 3)
        S=0
        for x in "${{A[@]}}"; do S=$((S + x)); done
        {L} --sum $S
        """
    ),
    "for_over_positional": case(
        f"""
        OUT=()
        for a in "$@"; do OUT+=(--x "$a"); done
        for b; do OUT+=("$b!"); done
        {L} "${{OUT[@]}}"
        """,
        arguments=("a b", "c"),
    ),
    "for_c_style": case(
        f"""
        L=""
        for ((i=0; i<3; i++)); do L="$L$i,"; done
        {L} --list "$L" --i $i
        """
    ),
    "while_counter": case(
        f"""
        i=0
        L=
        while [ $i -lt 3 ]; do L="$L $i"; i=$((i + 1)); done
        {L} --list "$L"
        """
    ),
    "until_counter": case(
        f"""
        n=1
        until (( n >= 100 )); do n=$(( n * 3 )); done
        {L} --n $n
        """
    ),
    "break_and_continue": case(
        f"""
        L=()
        for i in 1 2 3 4 5; do
          [ $i = 2 ] && continue
          [ $i = 4 ] && break
          L+=($i)
        done
        {L} "${{L[@]}}"
        """
    ),
    "loop_runs_commands": case(
        """
        for n in 8 16; do
          torchrun --nproc_per_node $n pretrain_gpt.py --num-layers $n
        done
        """,
        ran=2,
    ),
    "argument_parsing_idiom": case(
        f"""
        PP=1
        N=1
        while [[ $# -gt 0 ]]; do
          case $1 in
            --pp) PP=$2; shift 2;;
            --nnodes=*) N=${{1#*=}}; shift;;
            *) shift;;
          esac
        done
        {L} --pipeline-model-parallel-size $PP --nnodes $N
        """,
        arguments=("--foo", "--pp", "4", "--nnodes=2", "bar"),
    ),
    # case, if, tests
    "case_globs_and_alternatives": case(
        f"""
        MODEL=llama-7b
        case $MODEL in
          gpt*|opt*) N=12;;
          llama-7?) N=32;;
          *) N=1;;
        esac
        case x$MODEL in [a-w]*) K=no;; x[l]*) K=yes;; esac
        {L} --num-layers $N --k $K
        """
    ),
    "if_elif_else": case(
        f"""
        X=b
        if [ "$X" = a ]; then N=1
        elif [ "$X" = b ]; then N=2
        else N=3
        fi
        {L} --num-layers $N
        """
    ),
    "double_bracket_globs_and_logic": case(
        f"""
        M=llama-70b
        N=2
        if [[ $M == llama* && ! $N -gt 3 || $Z == y ]]; then R=a; else R=b; fi
        [[ $M != *7b ]] && S=one || S=two
        [[ -z $UNSET && -n $M && $N -eq 2 ]] && T=t
        {L} --r $R --s $S --t $T
        """
    ),
    "single_bracket_tests": case(
        f"""
        A=5
        [ -z "$EMPTY" ] && B=empty
        [ "$A" -ge 5 -a "$A" -le 9 ] && C=range
        [ ! "$A" = 4 ] && D=not
        test "$A" -ne 2 && E=ne
        {L} --b $B --c $C --d $D --e $E
        """
    ),
    "and_or_chains": case(
        """
        [ -z "$PP" ] && PP=2 || PP=3
        false && torchrun pretrain_gpt.py --a 1 || torchrun pretrain_gpt.py --pp $PP
        true && torchrun pretrain_gpt.py --b 2
        """,
        ran=2,
    ),
    "arithmetic_command_as_condition": case(
        f"""
        N=4
        if (( N > 3 && N % 2 == 0 )); then R=big; fi
        (( N++ ))
        {L} --r $R --n $N
        """
    ),
    # arithmetic
    "arithmetic_operators": case(
        f"""
        a=7; b=3
        {L} --v $((a + b * 2)) $((a / b)) $((a % b)) $((a ** 2)) $((a > b ? a : b)) \\
            $((0x10 + 8#17 + 2#101)) $((-a)) $((a << 2)) $((a & b | 8)) $(( (a + 1) / 2 ))
        """
    ),
    "arithmetic_names_resolve": case(
        f"""
        a=b
        b=3
        c='b + 1'
        {L} --v $((a + 1)) $((c * 2)) $((unset_name + 5))
        """
    ),
    "arithmetic_compound_assignment": case(
        f"""
        NUM_LAYERS=16
        (( NUM_LAYERS += 8 ))
        (( X = NUM_LAYERS * 2, Y = X - 1 ))
        {L} --num-layers $NUM_LAYERS --x $X --y $Y
        """
    ),
    "let": case(
        f"""
        let "N = 4 * 6" M=3 M++
        let N+=1
        {L} --num-layers $N --m $M
        """
    ),
    # declarations
    "declare_forms": case(
        f"""
        declare -i N=3+4
        N+=2
        declare -a A=(x y)
        declare -x E=1
        declare S="a b"
        {L} --n $N --a "${{A[@]}}" --e $E --s "$S"
        """
    ),
    "readonly_and_export": case(
        f"""
        readonly R=5
        export A=1 B
        B=2
        export C="three words here"
        {L} --r $R --a $A --b $B $C
        """
    ),
    "local_shadows_only_inside": case(
        f"""
        V=outer
        f() {{ local V=inner; W=$V; }}
        f
        {L} --v $V --w $W
        """
    ),
    # positional parameters
    "set_and_shift": case(
        f"""
        set -- a b c d
        shift
        shift 2
        {L} --rest "$@" --count $#
        """
    ),
    "set_then_first": case(
        f"""
        set -- 24
        NUM_LAYERS=$1
        {L} --num-layers $NUM_LAYERS
        """
    ),
    "tenth_parameter": case(
        f"""
        {L} --tenth ${{10}} --not-tenth $10 --eleventh "${{11}}" --count $#
        """,
        arguments=tuple("abcdefghijk"),
    ),
    "positional_slices_and_append": case(
        f"""
        set -- "$@" extra
        {L} --from2 "${{@:2}}" --two "${{@:1:2}}" --star "$*"
        """,
        arguments=("x y", "z", "w"),
    ),
    "default_from_argument": case(
        f"""
        TP=${{1:-1}}
        PP=${{2:-4}}
        {L} --tp $TP --pp $PP
        """,
        arguments=("2",),
    ),
    # arrays
    "array_element_assignment": case(
        f"""
        A=(a b)
        A[5]=z
        LS=(8 8)
        LS[0]=16
        {L} --count ${{#A[@]}} "${{A[@]}}" --ls ${{LS[@]}} --first ${{LS}}
        """
    ),
    "array_length_negative_index_slice": case(
        f"""
        a=(10 20 30 40 50)
        {L} --n ${{#a[@]}} --last ${{a[-1]}} --slice ${{a[@]:1:2}} --tail "${{a[@]: -2}}" \\
            --len0 ${{#a[0]}} --idx "${{!a[@]}}"
        """
    ),
    "array_append_and_unset": case(
        f"""
        A=(x)
        A+=(y "z w")
        S=ab
        S+=cd
        unset 'A[1]'
        unset NOPE
        {L} "${{A[@]}}" --count ${{#A[@]}} --s $S
        """
    ),
    "array_from_split_string": case(
        f"""
        S="1 2  3"
        A=($S)
        {L} --count ${{#A[@]}} --star "${{A[*]}}" --at "${{A[@]}}"
        """
    ),
    "loop_appends_flag_used_in_launch": case(
        f"""
        ARGS=(--num-layers 12 --hidden-size 1024)
        for x in once; do ARGS+=(--num-layers 24); done
        {L} "${{ARGS[@]}}"
        """
    ),
    # parameter expansions
    "replace_patterns": case(
        f"""
        V=banana
        {L} ${{V//a/o}} ${{V/a/o}} ${{V/#b/B}} ${{V/%a/A}} ${{V//an}} "${{V//[bn]/_}}"
        """
    ),
    "trim_patterns": case(
        f"""
        V=a.b.c.d
        P=/opt/models/gpt/pretrain_gpt.py
        {L} ${{V#*.}} ${{V##*.}} ${{V%.*}} ${{V%%.*}} ${{P##*/}} ${{P%/*}}
        """
    ),
    "substrings_and_length": case(
        f"""
        V=abcdefgh
        {L} ${{V:2:3}} ${{V: -2}} ${{V:1}} ${{V:0:-3}} --len ${{#V}}
        """
    ),
    "case_modification": case(
        f"""
        V="hello World"
        W=mixed-Case
        {L} ${{V^^}} ${{W,,}} ${{W^}} ${{W~~}}
        """,
        core=False,  # ${W~~} is undocumented
    ),
    "defaults_and_alternatives": case(
        f"""
        SET=x
        EMPTY=
        : ${{ASSIGNED:=given}}
        {L} ${{UNSET:-d1}} ${{EMPTY:-d2}} ${{EMPTY-d3}} ${{SET:+alt}} ${{UNSET:+no}} \\
            $ASSIGNED ${{SET:=no}}
        """
    ),
    "quoting": case(
        f"""
        A=$'a\\tb'
        B='single $quoted'
        C="double \\$ \\" \\\\ $B"
        {L} "$A" "$B" "$C" 'x'"y"z $'\\x41'
        """
    ),
    "ifs_splitting": case(
        f"""
        L="a,b,,c"
        IFS=,
        {L} $L
        """
    ),
    # command substitution of builtins, printf, nesting
    "slime_moe_layer_freq": case(
        f"""
        arr=()
        for ((i=0; i<6; i++)); do
          if (( i < 2 )); then arr+=(0); else arr+=(1); fi
        done
        printf -v MOE_LAYER_FREQ "[%s]" "$(IFS=', '; echo "${{arr[*]}}")"
        {L} --moe-layer-freq "$MOE_LAYER_FREQ"
        """
    ),
    "printf_substitution": case(
        f"""
        N=$(printf '%s-%03d' run 7)
        printf -v M '%d' 0x1f
        {L} --name $N --m $M --x "$(printf '%s,' a b c)"
        """
    ),
    "nested_echo_substitution": case(
        f"""
        X=$(echo $(echo inner) "$(echo 'two  spaces')")
        Y=`echo back`
        {L} --x "$X" --y $Y
        """
    ),
    "subshell_and_group": case(
        f"""
        X=1
        ( X=5 )
        {{ X=$((X + 1)); }}
        {L} --x $X
        """
    ),
    "here_string_read": case(
        f"""
        read -r A B <<< "first second third"
        read -ra ARR <<< "1 2 3"
        {L} --a $A --b "$B" --n ${{#ARR[@]}}
        """
    ),
    # eval, source, bash -c
    "eval_known_assignment": case(
        f"""
        NUM_LAYERS=12
        eval NUM_LAYERS=24
        Y=7
        eval "X=\\$Y"
        {L} --num-layers $NUM_LAYERS --x $X
        """
    ),
    "eval_of_built_command": case(
        """
        TRAINING_CMD="torchrun --nproc_per_node 8 pretrain_gpt.py"
        TRAINING_CMD+=" --num-layers 4 --name 'two words'"
        [[ -n "$TRAINING_CMD" ]] && TRAINING_CMD+=" --flag"
        eval "${TRAINING_CMD}"
        """
    ),
    "source_beside_the_script": case(
        f"""
        DIR="$(cd "$(dirname "$0")" && pwd)"
        source "$DIR/model.sh"
        . "$(dirname "${{BASH_SOURCE[0]}}")/more.sh"
        {L} "${{MODEL_ARGS[@]}}" --more $MORE
        """,
        files={"model.sh": "MODEL_ARGS=(--num-layers 12 --hidden-size 768)\n", "more.sh": "MORE=1"},
    ),
    "script_directory_idiom": case(
        f"""
        SCRIPT_DIR="$(cd -- "$(dirname -- "${{BASH_SOURCE[0]}}")" &>/dev/null && pwd)"
        {L} --dir "$SCRIPT_DIR" --name "$(basename "$0")"
        """
    ),
    "bash_c_of_variable": case(
        f"""
        CMD="{L} --num-layers 6 --name 'a b'"
        bash -c "$CMD"
        """,
        ran=2,
    ),
    # set -e / set -u
    "set_e_stops_at_failing_arithmetic": case(
        f"""
        set -e
        X=1
        if false; then :; fi
        false || true
        {L} --first 1
        (( X - 1 ))
        {L} --never 1
        """
    ),
    "set_u_stops_at_unset": case(
        f"""
        set -u
        echo ${{UNSET:-fine}}
        {L} --first 1
        {L} --x $UNSET_VARIABLE
        """
    ),
    "unset_variable_expands_to_nothing": case(
        f"""
        {L} --num-layers 4 $EXTRA_ARGS "${{MORE[@]}}"
        """
    ),
    "environment_value": case(
        f"""
        NNODES=${{NNODES:-1}}
        {L} --nnodes $NNODES --rank $NODE_RANK
        """,
        environment={"NNODES": "4", "NODE_RANK": "0"},
    ),
    # constructs of section 3 in the forms real scripts write them
    "quoted_trim_patterns": case(
        f"""
        arg=--nnodes=4
        P=/opt/models/gpt/pretrain_gpt.py
        N="${{arg#*=}}"
        {L} --nnodes "$N" "${{arg%%=*}}" "${{P##*/}}" "${{P%/*}}" "${{P%.py}}" "${{arg#--?}}"
        """
    ),
    "quoted_replace_patterns": case(
        f"""
        V=banana
        {L} "${{V//[bn]/_}}" "${{V//?/x}}" "${{V/a*/X}}" "${{V/#/pre}}" "${{V/%/post}}"
        """
    ),
    "quoted_default_inside_quotes": case(
        f"""
        {L} "${{MEGATRON_PATH:-"/opt/megatron"}}" "${{TP:-'1'}}"
        """
    ),
    "positional_offsets": case(
        f"""
        {L} --from2 "${{@:2}}" --from1 "${{@:1}}" --two "${{@:1:2}}" --star "${{*:2}}"
        """,
        arguments=("p q", "r", "s"),
    ),
    "array_name_alone_is_its_first_element": case(
        f"""
        A=(first second)
        {L} --a ${{A}} --quoted "$A"
        """
    ),
    "unset_array_element": case(
        f"""
        A=(x y z)
        unset 'A[1]'
        B=(x y z)
        unset B[0]
        {L} "${{A[@]}}" --n ${{#A[@]}} "${{B[@]}}"
        """
    ),
    "unset_and_empty_arrays_in_the_launch_line": case(
        f"""
        EMPTY=()
        {L} --num-layers 4 "${{EMPTY[@]}}" "${{LOGGING_ARGS[@]}}" ${{MORE_ARGS[@]}} --end
        """
    ),
    "set_u_stops_at_the_unset_word": case(
        f"""
        set -u
        {L} --first 1
        {L} --x "$NOT_SET" --never 1
        {L} --never 2
        """
    ),
    "set_e_is_off_in_an_or_list": case(
        f"""
        set -e
        f() {{ false; {L} --inside 1; }}
        f || true
        {L} --after 1
        """,
        ran=2,
    ),
    "set_e_and_a_failing_substitution": case(
        f"""
        set -e
        X=$(false)
        {L} --never 1
        """,
        ran=0,
    ),
    "declare_integer_then_assign": case(
        f"""
        declare -i N
        N="2+3"
        N+=1
        {L} --num-layers $N
        """
    ),
    # past section 3's list: reading them is welcome, a one-line refusal or an unknown allowed
    "brace_expansion_in_a_loop": case(
        """
        for n in {1..2}; do torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers $n; done
        """,
        ran=2,
        core=False,
    ),
    "arithmetic_error_discards_its_line": case(
        f"""
        X=08
        {L} --x $((X + 1)); {L} --same-line 1
        {L} --next-line 1
        """,
        core=False,
    ),
    "required_value": case(
        f"""
        {L} --first 1
        : "${{DATA_PATH:?set DATA_PATH}}"
        {L} --never 1
        """,
        core=False,
    ),
    "lowercase_and_uppercase_attributes": case(
        f"""
        declare -l LOW=ABC
        declare -u UP=abc
        {L} --low $LOW --up $UP
        """,
        core=False,
    ),
    "prefix_assignment_for_a_function_and_eval": case(
        f"""
        f() {{ {L} --x "$X"; }}
        X=tmp f
        X=one
        X=two eval '{L} --y $X'
        """,
        ran=2,
        core=False,
    ),
    "nested_backquotes": case(
        f"""
        X=`echo \\`echo nested\\``
        {L} --x "$X"
        """,
        core=False,
    ),
    "posix_class_in_case": case(
        f"""
        case A in [[:upper:]]) {L} --upper 1;; *) {L} --other 1;; esac
        """,
        core=False,
    ),
    "return_and_break_outside_their_place": case(
        f"""
        return 2
        break
        {L} --after 1
        """,
        core=False,
    ),
    "variables_bash_sets_itself": case(
        f"""
        f() {{ {L} --function "$FUNCNAME" --line $LINENO; }}
        f
        """,
        core=False,
    ),
    "extglob": case(
        f"""
        shopt -s extglob
        X=aaab
        {L} --x ${{X##+(a)}}
        """,
        core=False,
    ),
    "deprecated_arithmetic": case(
        f"""
        {L} --x $[ 2 + 2 ]
        """,
        core=False,
    ),
    "command_substitution_in_a_here_document": case(
        """
        cat <<EOF
        $(torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers 2)
        EOF
        """,
        ran=2,
        core=False,
    ),
    # past section 3's list: reading them is welcome, a one-line refusal allowed
    "case_fallthrough": case(
        f"""
        X=a
        R=
        case $X in a) R+=1;& b) R+=2;;& *) R+=3;; esac
        {L} --r $R
        """,
        core=False,
    ),
    "regex_match": case(
        f"""
        V=llama-70b
        [[ $V =~ ^llama-([0-9]+)b$ ]] && N=${{BASH_REMATCH[1]}}
        {L} --n $N
        """,
        core=False,
    ),
    "brace_expansion": case(
        f"""
        {L} --x a{{b,c}} {{1..3}}
        """,
        core=False,
    ),
    "associative_array": case(
        f"""
        declare -A M=([a]=1 [b]=2)
        M[c]=3
        {L} --b ${{M[b]}} --c ${{M[c]}}
        """,
        core=False,
    ),
    "indirection": case(
        f"""
        NAME=TARGET
        TARGET=42
        {L} --v ${{!NAME}}
        """,
        core=False,
    ),
}


def read_and_run(
    text: str,
    folder: Path,
    *,
    arguments: tuple[str, ...] = (),
    environment: Mapping[str, str] | None = None,
    files: Mapping[str, str] | None = None,
):
    """The reader's run (or its ShellError) and bash's, on the same script file."""
    from ray_layout.shell.interpreter import run_script
    from ray_layout.shell.refusal import ShellError

    path = write_script(folder, text, files=files)
    bash = run_bash(path, arguments, environment or {})
    assert bash.status is not None, f"bash did not end: {bash.stderr}"
    try:
        run = run_script(
            text,
            str(path),
            environment=dict(environment or {}),
            arguments=list(arguments),
            read_file=read_existing,
        )
    except ShellError as error:
        return error, bash
    return run, bash


@pytest.mark.parametrize("name", list(CASES))
def test_the_reader_runs_what_bash_runs(name, tmp_path):
    from ray_layout.shell.refusal import ShellError

    c = CASES[name]
    run, bash = read_and_run(
        c.script, tmp_path, arguments=c.arguments, environment=c.environment, files=c.files
    )
    assert len(bash.without_helpers()) == c.ran, (bash.commands, bash.stderr)  # the case's sanity
    if isinstance(run, ShellError):
        assert "\n" not in str(run)
        assert not c.core, f"refused a construct the reader must read: {run}"
        return
    assert differences_from_bash(run.commands, bash.commands, complete=False, exhaustive=True) == []
    if c.core:
        assert differences_from_bash(run.commands, bash.commands, complete=True) == []


# ---- the property test: scripts built from the constructs above, on known values ----------------

INTS = ("I", "J", "K")  # integer variables (arithmetic operands)
WORDS = ("S", "T")  # word variables (may hold spaces)
ARRAYS = ("A", "B")
PREAMBLE = "I=1 J=2 K=3\nS=ab T='x y'\nA=(a 'b c') B=()\n"

small = st.integers(min_value=0, max_value=9)
word_text = st.text(alphabet="abc.-_ 1", min_size=0, max_size=6)
glob = st.sampled_from(["a*", "*b", "?b", "[ab]*", "ab", "*", "x*|a*", "*.*", "*-*"])
trim = st.sampled_from(["a", "*.", ".*", "b*", "*b", "?"])


def quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


@st.composite
def int_expression(draw, depth: int = 0) -> str:
    if depth > 2 or draw(st.booleans()):
        return draw(st.one_of(st.sampled_from(INTS), small.map(str)))
    op = draw(st.sampled_from(["+", "-", "*", "<", "==", "&&", "||", "%", "/"]))
    left = draw(int_expression(depth + 1))
    if op in "%/":
        return f"({left} {op} {draw(st.integers(1, 5))})"
    return f"({left} {op} {draw(int_expression(depth + 1))})"


@st.composite
def word_expansion(draw) -> str:
    """One word of a command line (quoted or not)."""
    s = draw(st.sampled_from(WORDS))
    a = draw(st.sampled_from(ARRAYS))
    i = draw(st.sampled_from(INTS))
    choices = [
        f"${i}",
        f'"${s}"',
        f"${s}",
        f"$(({draw(int_expression())}))",
        f'"${{{a}[@]}}"',
        f"${{{a}[*]}}",
        f"${{#{a}[@]}}",
        f'"${{{a}[-1]}}"' if draw(st.booleans()) else f'"${{{a}[0]}}"',
        f'"${{{a}[@]:1:2}}"',
        f'"${{{s}#{draw(trim)}}}"',
        f'"${{{s}##{draw(trim)}}}"',
        f'"${{{s}%{draw(trim)}}}"',
        f'"${{{s}%%{draw(trim)}}}"',
        f'"${{{s}//a/z}}"',
        f'"${{{s}/#a/Z}}"',
        f'"${{{s}:1:2}}"',
        f"${{#{s}}}",
        f'"${{{s}^^}}"',
        f'"${{{s}:-def}}"',
        f'"${{{s}:+alt}}"',
        f'"$(echo "${s}")"',
        f'"$(IFS=,; echo "${{{a}[*]}}")"',
        f'"$(printf %s- "${{{a}[@]}}")"',
        quote(draw(word_text)),
        '"$1"',
        "$#",
    ]
    return draw(st.sampled_from(choices))


@st.composite
def launch(draw) -> str:
    words = draw(st.lists(word_expansion(), min_size=1, max_size=5))
    return f"{L} --num-layers $I " + " ".join(f"--w {w}" for w in words)


@st.composite
def condition(draw) -> str:
    s = draw(st.sampled_from(WORDS))
    i = draw(st.sampled_from(INTS))
    return draw(
        st.sampled_from(
            [
                f"[[ ${s} == {draw(glob).split('|')[0]} ]]",
                f"(( {draw(int_expression())} ))",
                f'[ "${s}" = {quote(draw(word_text))} ]',
                f"[ ${i} -ge {draw(small)} ]",
                f"[[ -n ${s} && ${i} -lt {draw(small)} ]]",
                f"! [[ ${s} == *a* ]]",
                f"[[ ${{#{draw(st.sampled_from(ARRAYS))}[@]}} -gt 1 || ${i} -eq 2 ]]",
            ]
        )
    )


@st.composite
def statement(draw, depth: int, counter: list[int]) -> str:
    simple = [
        lambda: f"{draw(st.sampled_from(INTS))}=$(({draw(int_expression())}))",
        lambda: f"(( {draw(st.sampled_from(INTS))} += {draw(small)} ))",
        lambda: f"let {draw(st.sampled_from(INTS))}={draw(small)}*2",
        lambda: f"{draw(st.sampled_from(WORDS))}={draw(word_expansion())}",
        lambda: f"{draw(st.sampled_from(WORDS))}+={quote(draw(word_text))}",
        lambda: f"{draw(st.sampled_from(ARRAYS))}+=({draw(word_expansion())})",
        lambda: (
            f"{draw(st.sampled_from(ARRAYS))}=({draw(word_expansion())} {draw(word_expansion())})"
        ),
        lambda: f"{draw(st.sampled_from(ARRAYS))}[{draw(small)}]={quote(draw(word_text))}",
        lambda: f"set -- {draw(word_expansion())} {draw(word_expansion())}",
        lambda: "shift",
        lambda: draw(launch()),
    ]
    if depth >= 2 or draw(st.integers(0, 2)) > 0:
        return draw(st.sampled_from(simple))()
    counter[0] += 1
    n = counter[0]

    def body() -> str:
        parts = draw(st.lists(statement(depth + 1, counter), min_size=1, max_size=3))
        return "\n".join(parts)

    kind = draw(st.sampled_from(["if", "case", "for", "cfor", "while", "function"]))
    if kind == "if":
        text = f"if {draw(condition())}; then\n{body()}\n"
        if draw(st.booleans()):
            text += f"elif {draw(condition())}; then\n{body()}\n"
        if draw(st.booleans()):
            text += f"else\n{body()}\n"
        return text + "fi"
    if kind == "case":
        s = draw(st.sampled_from(WORDS))
        arms = "".join(f"{draw(glob)}) {body()};;\n" for _ in range(draw(st.integers(1, 3))))
        return f'case "${s}" in\n{arms}esac'
    if kind == "for":
        items = draw(st.sampled_from(['"${A[@]}"', "${B[@]}", "1 2 3", '"$@"', "$S", "$T"]))
        return f"for v{n} in {items}; do\n{body()}\ndone"
    if kind == "cfor":
        return f"for ((c{n}=0; c{n}<{draw(st.integers(0, 3))}; c{n}++)); do\n{body()}\ndone"
    if kind == "while":
        limit = draw(st.integers(0, 3))
        return f"w{n}=0\nwhile [ $w{n} -lt {limit} ]; do\n{body()}\nw{n}=$((w{n} + 1))\ndone"
    local = f"local {draw(st.sampled_from(WORDS))}=$1\n" if draw(st.booleans()) else ""
    return f"f{n}() {{\n{local}{body()}\n}}\nf{n} {draw(word_expansion())} {draw(word_expansion())}"


@st.composite
def scripts(draw) -> str:
    counter = [0]
    parts = draw(st.lists(statement(0, counter), min_size=1, max_size=6))
    return PREAMBLE + "\n".join(parts) + "\n" + draw(launch()) + "\n"


PROPERTY = settings(
    max_examples=120,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@needs_bash
@PROPERTY
@given(text=scripts(), arguments=st.lists(word_text, max_size=3))
def test_generated_scripts_are_never_read_differently_from_bash(text, arguments):
    """The rule above all: refused, or marked unknown, but never a different reading."""
    from ray_layout.shell.refusal import ShellError

    with tempfile.TemporaryDirectory() as folder:
        run, bash = read_and_run(text, Path(folder), arguments=tuple(arguments))
    if isinstance(run, ShellError):
        assert "\n" not in str(run)
        return
    problems = differences_from_bash(run.commands, bash.commands, complete=False, exhaustive=True)
    assert problems == [], f"{problems}\n--- script (arguments {arguments}):\n{text}"


@needs_bash
@PROPERTY
@given(text=scripts(), arguments=st.lists(word_text, max_size=3))
def test_generated_scripts_of_known_values_are_read_completely(text, arguments):
    """Every construct here is on section 3's list and every value is known: read, every
    command certain and bash's (a refusal only where bash itself reported an error)."""
    from ray_layout.shell.refusal import ShellError

    with tempfile.TemporaryDirectory() as folder:
        run, bash = read_and_run(text, Path(folder), arguments=tuple(arguments))
    if isinstance(run, ShellError):
        assert bash.stderr, f"refused known values: {run}\n{text}"
        return
    problems = differences_from_bash(run.commands, bash.commands, complete=True)
    assert problems == [], f"{problems}\n--- script (arguments {arguments}):\n{text}"
