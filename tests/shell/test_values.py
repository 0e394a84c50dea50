"""Values: word splitting on IFS as bash splits, joining, and holes (a value the reader lacks
inside text it knows), which stay one opaque piece and make the word they land in unknown."""

from __future__ import annotations

import pytest

from ray_layout.shell.values import (
    Text,
    hole,
    hole_reason,
    missing_reason,
    named_holes,
    readable,
    same,
    split,
)
from tests.helpers.shell_bash import bash_words, needs_bash


@needs_bash
@pytest.mark.parametrize(
    ("ifs", "value"),
    [
        (" \t\n", "  a  b\tc \n"),
        (",", "a,,b,"),
        (", ", "1, 2,3 ,, 4"),
        (":", ":a:b"),
        ("", "a b"),
    ],
)
def test_splitting_follows_ifs_as_bash_does(ifs, value):
    def quoted(text: str) -> str:
        return "$'" + text.encode("unicode_escape").decode() + "'"

    expected = bash_words(f"IFS={quoted(ifs)}; V={quoted(value)}", "$V")[1:]
    assert [t.text for t in split(Text.of(value), ifs)] == expected


def test_a_hole_is_one_opaque_piece_that_makes_its_word_unknown():
    text = Text.of("torchrun --nproc ") + hole("$(nproc)", "runs nproc") + Text.of(" x.py")
    pieces = split(Text(text.text, text.offsets, (), text.unresolved))
    assert [readable(p.text) for p in pieces] == ["torchrun", "--nproc", "$(nproc)", "x.py"]
    assert [p.unresolved for p in pieces] == [None, None, "runs nproc", None]
    named = named_holes(text, "CMD", 3)
    assert hole_reason(named.text) == "$CMD (line 3) holds runs nproc; give --env CMD=VALUE"


def test_sameness_and_the_reason_an_unset_value_gives():
    assert same((Text.of("a"),), (Text("a", (5,)),)) and not same(Text.of("a"), (Text.of("a"),))
    assert missing_reason(("L", "BIG")).endswith(", and on $BIG")
