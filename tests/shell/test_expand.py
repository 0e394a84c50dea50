"""Expansions as bash passes words to a command: parameters, defaults, arrays, arithmetic, word
splitting and quotes; what only a running shell knows is unresolved with the reason, and a
variable nothing set is remembered as missing."""

from __future__ import annotations

import shlex

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ray_layout.shell.expand import expand, expand_whole
from ray_layout.shell.interpreter import run_script
from ray_layout.shell.lexer import tokenize
from ray_layout.shell.tokens import Word
from ray_layout.shell.values import Failed, Text, Unresolved, not_set, same, split
from tests.helpers.shell_bash import bash_words, needs_bash, variable, words


def word(text: str) -> Word:
    (token,) = tokenize(text, "t.sh")
    assert isinstance(token, Word)
    return token


def test_arrays_append_and_expand_per_element():
    script = 'A=(--x 1 "two words")\nA+=(--y)\nB="p q"\ncmd "${A[@]}" $B "$B"'
    assert words(script) == ["cmd", "--x", "1", "two words", "--y", "p", "q", "p q"]
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
    reading = run_script("torchrun --nnodes $NNODES pretrain_gpt.py", "t.sh")
    value = reading.commands[0].words[2]
    assert value.text == "$NNODES" and "give --env NNODES=VALUE" in value.unresolved


_SAFE = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=12)


@given(_SAFE, st.sampled_from(['"$V"', '"${V}"', "'$V'"]))
def test_a_quoted_reference_is_one_word_and_single_quotes_stay_literal(value, reference):
    got = words(f"V={shlex.quote(value)}\ncmd {reference}")
    assert got == ["cmd", "$V" if reference == "'$V'" else value]


def test_offsets_point_at_the_characters_a_value_came_from():
    script = 'L="Et*3|t*3L"\npython pretrain_gpt.py --pipeline-model-parallel-layout $L'
    word = run_script(script, "t.sh").commands[0].words[-1]
    assert script[word.offsets[0] : word.offsets[-1] + 1] == "Et*3|t*3L"


# Words made of the expansions the reader evaluates, over a string V, an empty W, an array A
# and an unset U (only under a default: alone it is a value the job's environment gives).
_VALUES = st.text(st.sampled_from("ab- \t"), max_size=6)
_DEFAULT = st.sampled_from(
    ["d", "x.y", "$V", "'a b'", '"$V"', '""', "a\\ b", "x'$V'y", "${W:-'p q'}", "a  b", " c"]
)
_EXPANSIONS = st.one_of(
    st.sampled_from(
        [
            '"$V"',
            "${V}",
            "${A[@]}",
            '"${A[@]}"',
            '"${A[*]}"',
            "${A[*]}",
            "${A[1]}",
            '"${A[0]}"',
            "${#V}",
            "${#A[@]}",
            "$((2*3-1))",
            "lit",
            "'q $V'",
            '""',
        ]
    ),
    st.tuples(
        st.sampled_from(["V", "W", "U"]), st.sampled_from([":-", "-", ":+", "+"]), _DEFAULT
    ).map(lambda p: f"${{{p[0]}{p[1]}{p[2]}}}"),
)
expansion_words = st.lists(_EXPANSIONS, min_size=1, max_size=3).map("".join)


@needs_bash
@settings(max_examples=150, deadline=None)
@given(_VALUES, st.lists(_VALUES, max_size=3), st.lists(expansion_words, min_size=1, max_size=3))
def test_expansions_split_and_join_as_bash_does(value, elements, items):
    setup = f"V={shlex.quote(value)}\nW=\nA=({' '.join(map(shlex.quote, elements))})"
    command = " ".join(items)
    reading = run_script(f"{setup}\ncmd {command}", "t.sh")
    expanded = reading.commands[-1].words
    reasons = [w.unresolved for w in expanded if w.unresolved]
    if reasons:  # a word of nothing but an unset element: the job's environment may set it
        assert all("which the script does not set" in reason for reason in reasons)
        return
    assert [w.text for w in expanded] == bash_words(setup, command)


def test_a_word_with_a_value_only_a_shell_has_stays_as_written_with_the_reason():
    (got,) = expand(word("--x=$(hostname)"), {})
    assert got.text == "--x=$(hostname)"
    assert got.unresolved == "$(hostname) (a command substitution, which needs a real shell)"
    assert got.offsets == (0,) + (-1,) * (len(got.text) - 1)  # never rewritten, line kept
    assert expand(word("$$"), {})[0].unresolved == "$$ (a value only a running shell has)"
    unsupported = expand(word("${!V[@]:-x}"), {"V": Text.of("a")})[0].unresolved
    assert unsupported == "${!V[@]:-x} (an expansion this reader does not evaluate)"


def test_arithmetic_names_what_it_lacks():
    (unset,) = expand(word("$((N*2))"), {})  # bash's 0 for an unset name, remembered
    assert (unset.text, unset.missing, unset.unresolved) == ("0", ("N",), None)
    assert unset.unknown == "$N, which the script does not set (give --env N=VALUE)"
    assert expand(word("$((N*2))"), {"N": Text.of("4")})[0].text == "8"
    with pytest.raises(Failed, match="divides by zero"):  # bash skips the rest of the line
        expand(word("$((1/0))"), {})
    held = expand(word("$((X+1))"), {"X": Unresolved("X is set in a loop")})[0].unresolved
    assert held == "$((X+1)) uses X is set in a loop"


def test_a_missing_variable_expands_to_nothing_and_is_remembered():
    (alone,) = expand(word("$NNODES"), {})
    assert alone.unresolved == not_set("NNODES") and alone.text == "$NNODES"
    (inside,) = expand(word('"/x/$HOME_DIR/y"'), {})
    assert (inside.text, inside.missing, inside.unresolved) == ("/x//y", ("HOME_DIR",), None)
    assert expand(word('"${A[5]}x"'), {"A": (Text.of("1"),)})[0].missing == ("A",)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("--nnodes=$NNODES", [("--nnodes=", ("NNODES",))]),
        ("${NN}x", [("x", ("NN",))]),
        ("$NN${V}", [("a", ("NN",)), ("b", ())]),  # named on the word it was in
        ("$V$NN", [("a", ()), ("b", ("NN",))]),
        ("${U:-$NN}/x", [("/x", ("NN", "U"))]),  # an empty default: U's emptiness too
        ('"${U:-$NN}"/x', [("/x", ("NN", "U"))]),
        ("${U:-}", []),
        ("${U:-d}", [("d", ())]),  # a default stands for the unset variable
    ],
)
def test_an_unset_variable_inside_a_word_is_remembered(text, expected):
    found = expand(word(text), {"V": Text.of("a b")})
    assert [(w.text, w.missing) for w in found] == expected
    assert all(w.unresolved is None for w in found)
    assert [w.unknown is not None for w in found] == [bool(m) for _, m in expected]


def test_the_reason_says_how_to_give_the_value():
    assert not_set("1") == "$1, the script's own arguments (give them after --)"
    assert not_set("@").startswith("$@, the script's own argument")
    assert not_set("MASTER") == "$MASTER, which the script does not set (give --env MASTER=VALUE)"


def test_an_assignment_value_is_not_split():
    variables = {"V": Text.of("a  b"), "A": (Text.of("x"), Text.of("y z"))}
    assert expand_whole(word("$V${A[@]}"), variables).text == "a  bx y z"
    assert [w.text for w in expand(word("$V${A[@]}"), variables)] == ["a", "bx", "y", "z"]


def test_assign_default_sets_the_variable():
    variables: dict = {}
    assert expand(word("${X:=7}"), variables)[0].text == "7"
    assert variables["X"].text == "7"


def test_splitting_keeps_each_pieces_offsets_and_what_it_missed():
    text = Text(" ab\tc ", (10, 11, 12, 13, 14, 15), ("M",))
    assert split(text) == [Text("ab", (11, 12), ("M",)), Text("c", (14,), ("M",))]
    assert split(Text.of("   ")) == []
    unknown = Text("a b", (1, 2, 3), (), "an element from a loop")
    assert split(unknown) == [unknown]


def test_joined_texts_keep_offsets_and_name_each_missing_variable_once():
    joined = Text("a", (0,), ("X",)) + Text.of("-") + Text("b", (5,), ("X", "Y"))
    assert joined == Text("a-b", (0, -1, 5), ("X", "Y"))


def test_same_compares_what_a_variable_is_left_holding():
    assert same(Text("1", (0,)), Text("1", (7,)))  # the same text from elsewhere
    assert not same(Text("", ()), Text("", (), ("U",)))  # set empty, or missing
    assert same((Text.of("a"),), (Text.of("a"),))
    assert not same((Text.of("a"),), (Text.of("a"), Text.of("b")))
    assert not same(Text.of("a"), (Text.of("a"),))
    assert same(None, None) and not same(None, Text.of(""))


@needs_bash
def test_quotes_inside_a_default_word_as_bash_reads_them():
    setup = 'V="p  q"'
    for command in ("\"${U:-'a b'}\"", "${U:-$V}", '"${U:-$V}"', '${V:+"x"}'):
        assert words(f"{setup}\ncmd {command}") == bash_words(setup, command), command


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        ("${U:-'a b'}", ["a b"]),
        ('${U:-"$V"}', ["p  q"]),
        ('${W:-""}', [""]),
        ("${U:-a  b}", ["a", "b"]),  # unquoted text of the default is split
        ("x${U:-' 'y}", ["x y"]),
        ("${V:+'a b'}", ["a b"]),  # an alternative alike
        ("${U:='a b'}", ["a", "b"]),  # assigned, then split whole, as bash does
    ],
)
def test_a_quoted_part_of_a_default_word_is_not_split(command, expected):
    assert words(f'V="p  q"\nW=\ncmd {command}') == ["cmd", *expected]  # bash's words


@needs_bash
@pytest.mark.parametrize(
    ("command", "expected"),
    [
        ('"${A[0]}"${V}${V:+""}', [""]),  # hypothesis found it: the reader gave two words
        ('""${V}""', ["", ""]),
        ('""${V}${V:+""}', [""]),  # a default's null after a quoted null is dropped
        ('""${V}${V:+"y"}', ["", "y"]),
        ('""${V}${W:-""}', [""]),
        ('${V:+""}', [""]),  # alone, or first, it is a null argument
        ('x${V:+""}', ["x"]),
        ('x${V}${V:+""}', ["x", ""]),  # after unquoted text only, it is kept
        ('${V:+""x}${V}${V:+""}', ["x"]),  # a word with text and a null counts as a null
    ],
)
def test_a_quoted_null_from_a_default_word_as_bash_keeps_it(command, expected):
    setup = "V=' '\nW=\nA=()"
    assert words(f"{setup}\ncmd {command}") == ["cmd", *expected]
    assert bash_words(setup, command) == ["cmd", *expected]
