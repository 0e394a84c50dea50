"""``${...}`` read as bash's lexer reads it: the name, the index, the operator and its word."""

from __future__ import annotations

import pytest

from ray_layout.shell.lexer import tokenize
from ray_layout.shell.tokens import Reference


@pytest.mark.parametrize(
    ("text", "name", "index", "operator"),
    [
        ("${V}", "V", None, None),
        ("${10}", "10", None, None),
        ("${A[i+1]}", "A", "i+1", None),
        ("${#A[@]}", "A", "@", "length"),
        ("${!V}", "V", None, "!"),
        ("${!A[@]}", "A", "@", "keys"),
        ("${V##*/}", "V", None, "##"),
        ("${V//a/b}", "V", None, "//"),
        ("${V/#a}", "V", None, "/#"),
        ("${V:1:2}", "V", None, ":"),
        ("${V,,}", "V", None, ",,"),
        ("${V:?no}", "V", None, ":?"),
        ("${V@Q}", "V", None, "unsupported"),
    ],
)
def test_each_form_is_read_with_its_operator(text, name, index, operator):
    (word,) = tokenize(text, "t.sh")
    (part,) = word.parts
    assert isinstance(part, Reference)
    assert (part.name, part.index, part.operator) == (name, index, operator)


def test_the_word_after_an_operator_keeps_its_own_quotes_inside_double_quotes():
    (word,) = tokenize('"${V:-"a b"}${V#\'*\'}"', "t.sh")
    default, pattern = word.parts
    assert [(p.text, p.quoted) for p in default.argument] == [("a b", True)]
    assert [(p.text, p.quoted) for p in pattern.argument] == [("*", True)]
