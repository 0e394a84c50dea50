"""The bash reader against what bash itself does: quotes, arrays, defaults, arithmetic, printf,
control flow; property tests against the shell's own quoting (``shlex.quote``)."""

from __future__ import annotations

import shlex

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ray_layout.errors import ConfigError
from ray_layout.model.bash_arithmetic import evaluate_arithmetic, printf
from ray_layout.model.bash_script import Text, Unresolved, read_script


def words(script: str, **environment: str) -> list[str]:
    reading = read_script(script, "t.sh", environment)
    return [w.text for w in reading.commands[-1].words]


def variable(script: str, name: str, **environment: str) -> object:
    value = read_script(script, "t.sh", environment).variables.get(name)
    if isinstance(value, Text):
        return value.text
    if isinstance(value, tuple):
        return [t.text for t in value]
    return value


def test_quotes_escapes_and_continuations_as_bash_passes_them():
    assert words("echo 'a $X' \"b $X\" c\\ d \\\n  e") == ["echo", "a $X", "b ", "c d", "e"]
    assert words('X=1; echo "$X"x ${X}y') == ["echo", "1x", "1y"]
    assert words('echo "" x') == ["echo", "", "x"]
    assert words("echo a # a comment's quote\necho b") == ["echo", "b"]


def test_arrays_append_and_expand_per_element():
    script = 'A=(--x 1 "two words")\nA+=(--y)\nB="p q"\necho "${A[@]}" $B "$B"'
    assert words(script) == ["echo", "--x", "1", "two words", "--y", "p", "q", "p q"]
    assert variable("A=(1 2)\nN=${#A[@]}", "N") == "2"
    assert variable("A=(1 2)\nF=${A[1]}", "F") == "2"


def test_defaults_use_the_environment_and_unset_expands_to_nothing():
    assert variable("N=${NNODES:-1}", "N") == "1"
    assert variable("N=${NNODES:-1}", "N", NNODES="4") == "4"
    assert variable("P=/a:${PYTHONPATH}", "P") == "/a:"
    assert variable("E=\nX=${E:-d}\nY=${E-d}", "X") == "d"
    assert variable("E=\nY=${E-d}", "Y") == ""
    assert variable("X=${X:=7}", "X") == "7"
    assert variable("S=1\nX=${S:+on}", "X") == "on"
    reading = read_script("torchrun --nnodes $NNODES pretrain_gpt.py", "t.sh")
    value = reading.commands[0].words[2]
    assert value.text == "$NNODES" and "give --env NNODES=VALUE" in value.unresolved


def test_arithmetic_and_printf_on_plain_values():
    assert variable("A=3\nB=58\nN=$((A + B))", "N") == "61"
    assert variable("G=8\nN=2\nW=$(($G*$N))", "W") == "16"
    assert variable('printf -v F "[0]*%d+[1]*%d" 3 58', "F") == "[0]*3+[1]*58"
    assert evaluate_arithmetic("-7 / 2", lambda _: None) == -3  # truncated, as bash
    assert evaluate_arithmetic("-7 % 2", lambda _: None) == -1
    assert printf("%s-", ["a", "b"]) == "a-b-"  # the format is reused
    with pytest.raises(ValueError, match="divides by zero"):
        evaluate_arithmetic("1/0", lambda _: None)
    with pytest.raises(ValueError, match="exponent"):
        evaluate_arithmetic("2**99", lambda _: None)


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


def test_offsets_point_at_the_characters_a_value_came_from():
    script = 'L="Et*3|t*3L"\npython pretrain_gpt.py --pipeline-model-parallel-layout $L'
    word = read_script(script, "t.sh").commands[0].words[-1]
    assert script[word.offsets[0] : word.offsets[-1] + 1] == "Et*3|t*3L"


@pytest.mark.parametrize(
    ("script", "message"),
    [
        ("echo 'open", "t.sh:1: a quotation is never closed"),
        ("A=(1 2\n", "an array's '(' is never closed"),
        ("cat <<EOF\nbody\n", "here-document 'EOF' is never ended"),
        ("if true; then\n echo\n", "'if' is never closed by 'fi'"),
        ("X=${Y", "a '${' is never closed"),
    ],
)
def test_broken_scripts_are_one_line_errors_with_the_line(script, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("$", r"\$")):
        read_script(script, "t.sh")


_SAFE = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=12)


@given(st.lists(_SAFE, min_size=1, max_size=6))
def test_any_words_quoted_by_shlex_come_back_as_themselves(items):
    assert words("cmd " + " ".join(shlex.quote(item) for item in items)) == ["cmd", *items]


@given(_SAFE, st.sampled_from(['"$V"', '"${V}"', "'$V'"]))
def test_a_quoted_reference_is_one_word_and_single_quotes_stay_literal(value, reference):
    got = words(f"V={shlex.quote(value)}\ncmd {reference}")
    assert got == ["cmd", "$V" if reference == "'$V'" else value]


@given(st.text(max_size=200))
def test_any_text_reads_or_fails_with_one_config_error(text):
    try:
        read_script(text, "t.sh")
    except ConfigError as exc:
        assert "\n" not in str(exc).replace("\\n", "")
