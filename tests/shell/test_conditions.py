"""``test``/``[ ]`` and ``[[ ]]`` on values the reader has, judged by bash's own ``test`` and
``[[``; tests on the file system have no answer here."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ray_layout.shell.conditions import DoubleBracket, NoAnswer, evaluate_test
from ray_layout.shell.lexer import tokenize
from ray_layout.shell.tokens import Operator, Word
from ray_layout.shell.values import Text
from tests.helpers.shell_bash import bash_test, bash_words, needs_bash

_OPERANDS = st.one_of(st.integers(-20, 20).map(str), st.sampled_from(["", "a", "b", "ab", "0"]))
_OPERATORS = st.sampled_from(["=", "==", "!=", "-eq", "-ne", "-lt", "-le", "-gt", "-ge"])
test_expressions = st.one_of(
    st.tuples(_OPERANDS).map(list),
    st.tuples(st.sampled_from(["-z", "-n", "!"]), _OPERANDS).map(list),
    st.tuples(_OPERANDS, _OPERATORS, _OPERANDS).map(list),
    st.tuples(_OPERANDS, st.sampled_from(["-a", "-o"]), _OPERANDS).map(list),
    st.tuples(st.just("!"), _OPERANDS, _OPERATORS, _OPERANDS).map(list),
)


@needs_bash
@settings(max_examples=150, deadline=None)
@given(test_expressions)
def test_test_answers_as_bash_does_or_not_at_all(operands):
    answer = evaluate_test(operands)
    expected = bash_test(operands)
    if expected is None:  # bash refuses it (a word given to -eq): no answer here either
        assert isinstance(answer, NoAnswer)
    else:
        assert answer is expected
    if isinstance(answer, NoAnswer) and answer.refused:  # a failure only where bash's is one
        assert expected is None


def test_tests_on_the_file_system_have_no_answer():
    assert isinstance(evaluate_test(["-f", "/etc/passwd"]), NoAnswer)
    assert isinstance(evaluate_test(["-d", "x", "-a", "a"]), NoAnswer)
    assert evaluate_test(["-d", "x", "-a", ""]) is False  # the other side decides
    assert evaluate_test([]) is False


def _double_bracket(text: str, **values: str) -> bool | NoAnswer:
    tokens = [t for t in tokenize(f"[[ {text} ]]", "t.sh") if isinstance(t, Word | Operator)]
    variables = {name: Text.of(value) for name, value in values.items()}
    return DoubleBracket(tuple(tokens[1:-1]), variables).evaluate()


@needs_bash
@pytest.mark.parametrize(
    "text",
    [
        "$A == b*",
        '$A == "b*"',
        "$A != a && -n $A",
        "! -z $A || $B -gt 2",
        "( $A == x || $B -eq 3 ) && $A < c",
        "$A =~ ^b[a-z]+$",
        "$A == ?a?",
        "$B -ge 3 && ( $A == [ab]* )",
    ],
)
def test_double_brackets_answer_as_bash_does(text):
    expected = bash_words("A=bar; B=3", f"$([[ {text} ]] && echo yes || echo no)")[1] == "yes"
    assert _double_bracket(text, A="bar", B="3") is expected


def test_an_unset_variable_in_double_brackets_is_empty_and_remembered():
    reader = DoubleBracket(tuple(t for t in tokenize("-z $X", "t.sh") if isinstance(t, Word)), {})
    assert reader.evaluate() is True and reader.missing == ["X"]
    assert isinstance(_double_bracket("-f /x && -n a"), NoAnswer)
