"""Globs as regular expressions and the edits made with them (``${V#p}``, ``${V//p/r}``,
``${V:1:2}``, ``${V^^}``), each judged by bash on the same text."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ray_layout.shell.patterns import edit, glob_regex, sliced
from ray_layout.shell.values import Text
from tests.helpers.shell_bash import bash_words, needs_bash, words

VALUE = "a/bb.c-01.sh"


@needs_bash
@pytest.mark.parametrize(
    "expansion",
    [
        "${V#*/}",
        "${V##*.}",
        "${V%.*}",
        "${V%%.*}",
        "${V#x}",
        "${V/b/X}",
        "${V//b/X}",
        "${V/#a/X}",
        "${V/%sh/X}",
        "${V//[0-9]/N}",
        "${V//?/_}",
        "${V^^}",
        "${V^}",
        "${V,,}",
        "${V:2}",
        "${V:2:3}",
        "${V: -3}",
        "${V:1:-2}",
        "${V//b}",
        "${V/[!a]/Y}",
    ],
)
def test_each_edit_gives_what_bash_gives(expansion):
    setup = f"V='{VALUE}'"
    assert words(f"{setup}\ncmd {expansion}") == bash_words(setup, expansion)


@needs_bash
@settings(max_examples=100, deadline=None)
@given(
    st.text(alphabet="ab*?[]!-.", min_size=1, max_size=6),
    st.text(alphabet="ab-.", max_size=6),
)
def test_a_glob_matches_what_bash_matches(pattern, text):
    try:
        compiled = re.compile(glob_regex(pattern), re.DOTALL)
    except re.error:
        return  # a bracket this reader does not read: bash's own reading is not asserted
    script = f"case $1 in {pattern}) echo yes;; *) echo no;; esac"
    expected = bash_words(f"set -- '{text}'", f"$({script})")[1] == "yes"
    assert (compiled.fullmatch(text) is not None) == expected


def test_an_edit_keeps_each_remaining_characters_place():
    text = Text("abcabc", tuple(range(10, 16)))
    cut = edit("#", text, re.compile("a.", re.DOTALL), Text("", ()))
    assert (cut.text, cut.offsets) == ("cabc", (12, 13, 14, 15))
    assert sliced((Text.of("x"), Text.of("y"), Text.of("z")), [1, 1], "s") == (Text.of("y"),)
