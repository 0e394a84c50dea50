"""The grammar over the lexer's tokens: where a command ends, which reserved word closes a block
(only one where a command starts), an ``if``'s clauses, what an assignment sets, and ``test``'s
answer on plain values, which bash's own ``test`` judges."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ray_layout.shell.grammar import (
    and_or_end,
    assignment,
    block_body,
    command_end,
    evaluate_test,
    if_clauses,
    is_function_definition,
    matching_end,
    matching_parenthesis,
    next_brace,
    value_of_assignment,
)
from ray_layout.shell.lexer import tokenize
from ray_layout.shell.refusal import ShellError
from ray_layout.shell.script import read_script
from ray_layout.shell.tokens import Literal, Operator, Token, Word
from tests.helpers.shell_bash import bash_test, needs_bash


def tokens(text: str) -> list[Token]:
    return tokenize(text, "t.sh")


def texts(found: list[Token]) -> list[str]:
    return [t.text if isinstance(t, Operator) else t.plain or "?" for t in found]


def test_broken_scripts_are_one_line_errors_with_the_line():
    with pytest.raises(ShellError, match=re.escape("'if' is never closed by 'fi'")):
        read_script("if true; then\n echo\n", "t.sh")


_OPERANDS = st.one_of(st.integers(-20, 20).map(str), st.sampled_from(["", "a", "b", "ab", "0"]))
_OPERATORS = st.sampled_from(["=", "==", "!=", "-eq", "-ne", "-lt", "-le", "-gt", "-ge"])
test_expressions = st.one_of(
    st.tuples(_OPERANDS).map(list),
    st.tuples(st.sampled_from(["-z", "-n"]), _OPERANDS).map(list),
    st.tuples(_OPERANDS, _OPERATORS, _OPERANDS).map(list),
)


@needs_bash
@settings(max_examples=150, deadline=None)
@given(test_expressions)
def test_test_answers_as_bash_does_or_not_at_all(operands):
    answer = evaluate_test(operands)
    expected = bash_test(operands)
    if expected is None:  # not a valid test for bash (a word given to -eq): none here either
        assert answer is None
    else:
        assert answer is expected


def test_tests_it_does_not_evaluate_are_none():
    assert evaluate_test(["-f", "/etc/passwd"]) is None  # files: the job's machine
    assert evaluate_test(["a", "-nt", "b"]) is None
    assert evaluate_test(["!", "a", "=", "b"]) is None
    assert evaluate_test([]) is None


def test_a_command_ends_at_its_separator_or_a_pipe():
    found = tokens("a b && c | d; e\nf")
    assert texts(found[: command_end(found, 0)]) == ["a", "b"]
    assert texts(found[3 : command_end(found, 3)]) == ["c"]
    assert command_end(found, len(found) - 1) == len(found)
    piped = tokens("a 2>&1 |& tee log")  # |& pipes (the standard error too), no redirection
    assert texts(piped[: command_end(piped, 0)]) == ["a", ">&", "1"]


def test_a_block_closes_after_a_here_document_in_it():
    found = tokens("if true; then\n  cat <<EOF\nfi\nEOF\nfi\nlast")
    assert texts(found[matching_end(found, 0, "if", "fi", "t.sh") :]) == ["\n", "last"]


def test_the_right_of_and_or_is_one_command_or_a_whole_block():
    found = tokens("x && if a; then b; fi; c")
    assert texts(found[2 : and_or_end(found, 2)])[-1] == "fi"
    found = tokens("x || (a; b); c")
    assert texts(found[2 : and_or_end(found, 2)]) == ["(", "a", ";", "b", ")"]
    found = tokens("x && y; z")
    assert texts(found[2 : and_or_end(found, 2)]) == ["y"]


def test_blocks_close_at_their_own_reserved_word_where_a_command_starts():
    found = tokens("if a; then echo fi; if b; then c; fi; done=1; fi; after")
    end = matching_end(found, 0, "if", "fi", "t.sh")
    assert texts(found[end:]) == [";", "after"]
    loop = tokens("for i in 1 2\ndo\n while x; do y; done\ndone\nz")
    assert texts(loop[matching_end(loop, 0, "for", "done", "t.sh") :]) == ["\n", "z"]


@pytest.mark.parametrize(
    ("script", "opener", "closing", "message"),
    [
        ("while x; do\n y\n", "while", "done", "t.sh:1: 'while' is never closed by 'done'"),
        ("\n{ a; echo }", "{", "}", "t.sh:2: '{' is never closed by '}'"),
    ],
)
def test_an_open_block_names_its_line(script, opener, closing, message):
    found = tokens(script)
    start = next(i for i, t in enumerate(found) if isinstance(t, Word) and t.plain == opener)
    with pytest.raises(ShellError, match=f"^{re.escape(message)}$"):
        matching_end(found, start, opener, closing, "t.sh")


def test_parentheses_match_and_an_open_one_names_its_line():
    found = tokens("(a; (b); c) d")
    assert texts(found[matching_parenthesis(found, 0, "t.sh") :]) == ["d"]
    with pytest.raises(ShellError, match=r"^t\.sh:1: a '\(' is never closed$"):
        matching_parenthesis(tokens("(a; (b)"), 0, "t.sh")


def test_if_clauses_split_conditions_from_bodies_outside_nested_blocks():
    body = tokens("if a; then b; elif c; then if d; then e; else f; fi; else g; fi")[1:-1]
    clauses = [(None if c is None else texts(c), texts(b)) for c, b in if_clauses(body, "t.sh")]
    assert clauses[0] == (["a", ";"], ["b", ";"])
    assert clauses[1][0] == ["c", ";"] and clauses[1][1][0] == "if" and "else" in clauses[1][1]
    assert clauses[2] == (None, ["g", ";"])


def test_assignments_name_what_they_set():
    names = [assignment(t) for t in tokens('A=1 B+=x C=(1) D+=(2) _e="q" 1F=2 "G"=3 H x=')]
    assert names == ["A", "B", "C", "D", "_e", None, None, None, "x"]
    assert assignment(Operator(";", 1)) is None


def test_an_assignment_value_is_the_word_after_the_equals():
    value = value_of_assignment(tokens('A=x"y z"')[0])
    assert value.parts == (Literal("x", (2,), False), Literal("y z", (4, 5, 6), True))
    assert value_of_assignment(tokens("A=")[0]) is None


def test_function_definitions_and_their_bodies():
    found = tokens("f() {\n echo\n}")
    assert is_function_definition(found, 0)
    assert found[next_brace(found, 0)].plain == "{"
    assert not is_function_definition(tokens("f (x)"), 0)
    with pytest.raises(ShellError, match=r"^line 1: a function without a '\{' body$"):
        next_brace(tokens("function f"), 0)


def test_a_loops_body_is_what_follows_do():
    assert texts(block_body(tokens("i in 1 2; do a; done"))) == ["a", ";", "done"]
    assert texts(block_body(tokens("a; b"))) == ["a", ";", "b"]
