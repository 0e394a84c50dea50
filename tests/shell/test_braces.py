"""Brace expansion as bash does it, judged by bash; a bomb is refused in one line."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ray_layout.shell.braces import MAX_WORDS, brace_words
from ray_layout.shell.lexer import tokenize
from ray_layout.shell.refusal import ShellError
from tests.helpers.shell_bash import bash_words, needs_bash, words


@needs_bash
@pytest.mark.parametrize(
    "text",
    [
        "a{b,c}d",
        "{1..3}",
        "{01..10..3}",
        "{c..a}",
        "{a,b}{1,2}",
        "x{,y}",
        "{a,{b,c}}d",
        "'{a,b}'",
        "{x}",
        "{a..}",
        "pre{${V},w}post",
        "1{},}",
        "--x{1..2}=y",
    ],
)
def test_braces_expand_as_bash_does(text):
    assert words(f"V=v\ncmd {text}") == bash_words("V=v", text)


@needs_bash
@settings(max_examples=60, deadline=None)
@given(st.text(alphabet="ab{},.1", min_size=1, max_size=10))
def test_any_word_of_braces_gives_what_bash_gives(text):
    script = f"cmd {text}"
    try:
        tokenize(script, "t.sh")
    except ShellError:
        return  # no word bash would read either
    assert words(script) == bash_words("", text)


def test_a_name_that_braces_lengthen_is_no_guess():
    (word,) = tokenize("pre{$V,w}post", "t.sh")  # bash reads $Vpost after the expansion
    assert brace_words(word) is None


def test_a_brace_bomb_is_refused_in_one_line():
    (word,) = tokenize("{1..99999999}", "t.sh")
    with pytest.raises(ShellError, match=f"more than {MAX_WORDS:,} words"):
        brace_words(word)
