"""Assignment words: the name, index and ``+=`` they set, and the value after ``=``."""

from __future__ import annotations

from ray_layout.shell.lexer import tokenize
from ray_layout.shell.syntax import assignment_target, assignment_value
from ray_layout.shell.tokens import Literal, Operator, Reference


def test_assignments_name_what_they_set():
    tokens = tokenize('A=1 B+=x C=(1) D+=(2) _e="q" 1F=2 "G"=3 H x= a[3]=v L[$i]+=w', "t.sh")
    targets = [assignment_target(t) for t in tokens]
    assert targets == [
        ("A", None, False),
        ("B", None, True),
        ("C", None, False),
        ("D", None, True),
        ("_e", None, False),
        None,
        None,
        None,
        ("x", None, False),
        ("a", "3", False),
        ("L", "$i", True),
    ]
    assert assignment_target(Operator(";", 1)) is None


def test_an_assignment_value_is_the_word_after_the_equals():
    value = assignment_value(tokenize('A=x"y z"', "t.sh")[0])
    assert value.parts == (Literal("x", (2,), False), Literal("y z", (4, 5, 6), True))
    assert assignment_value(tokenize("A=", "t.sh")[0]).parts == ()
    indexed = assignment_value(tokenize("L[$i]=$v", "t.sh")[0])
    assert isinstance(indexed.parts[0], Reference) and indexed.parts[0].name == "v"
