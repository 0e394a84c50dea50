"""The grammar builds bash's tree: lists, pipelines, compound commands, functions in both
forms, nested groups; what bash refuses is one line naming the line, and nesting is bounded."""

from __future__ import annotations

import re

import pytest

from ray_layout.shell.parse import MAX_DEPTH, parse
from ray_layout.shell.refusal import ShellError
from ray_layout.shell.syntax import (
    AndOr,
    Arithmetic,
    ArithmeticFor,
    Case,
    Conditional,
    For,
    FunctionDefinition,
    Group,
    If,
    Pipeline,
    Simple,
    Subshell,
    While,
)


def kinds(text: str) -> list[type]:
    return [type(node) for node, _ in parse(text, "t.sh").items]


def test_each_construct_becomes_its_node():
    script = (
        "a && b || c\nx | y\nif a; then b; elif c; then d; else e; fi\nfor i in 1 2; do :; done\n"
        "for ((i=0; i<2; i++)); do :; done\nwhile a; do b; done\nuntil a; do b; done\n"
        "case $x in a|b) :;; *) ;; esac\n{ a; }\n(a; b)\nf() { :; }\nfunction g { :; }\n"
        "(( x += 1 ))\n[[ $a == b && -n $c ]]\nX=1 cmd > out 2>&1 &\n"
    )
    assert kinds(script) == [
        AndOr,
        Pipeline,
        If,
        For,
        ArithmeticFor,
        While,
        While,
        Case,
        Group,
        Subshell,
        FunctionDefinition,
        FunctionDefinition,
        Arithmetic,
        Conditional,
        Simple,
    ]
    last = parse("X=1 cmd a > out 2>&1", "t.sh").items[0][0]
    assert isinstance(last, Simple) and [w.plain for w in last.words] == ["cmd", "a"]


def test_valid_bash_that_an_older_reader_refused_parses():
    assert kinds("function f { echo; }\n{ { x; } }\nf") == [FunctionDefinition, Group, Simple]
    (group,) = parse("{ { x; } }", "t.sh").items
    assert isinstance(group[0].body.items[0][0], Group)
    arithmetic = parse("(( a = (1 + 2) * 3 ))", "t.sh").items[0][0]
    assert arithmetic.text.strip() == "a = (1 + 2) * 3"


@pytest.mark.parametrize(
    ("script", "message"),
    [
        ("if true; then\n echo\n", "t.sh:1: 'if' is never closed by 'fi'"),
        ("while x; do\n y\n", "t.sh:1: 'while' is never closed by 'done'"),
        ("\n{ a; echo }", "t.sh:2: '{' is never closed by '}'"),
        ("(a; (b)", "t.sh:1: a '(' (line 1) is never closed"),
        ("a &&", "t.sh:1: a command is missing at the end of the script"),
        ("case x in\n a) b;;\n", "t.sh:1: 'case' is never closed by 'esac'"),
        ("fi", "t.sh:1: unexpected 'fi'"),
    ],
)
def test_what_bash_refuses_is_one_line_naming_the_line(script, message):
    with pytest.raises(ShellError, match=f"^{re.escape(message)}$"):
        parse(script, "t.sh")


def test_nesting_is_bounded_in_one_line():
    with pytest.raises(ShellError, match=f"nested more than {MAX_DEPTH} deep"):
        parse("{ " * 3000 + "x;" + " }" * 3000, "t.sh")
    with pytest.raises(ShellError, match="nested"):
        parse("( " * 3000 + "x" + " )" * 3000, "t.sh")
