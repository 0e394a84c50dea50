"""The lexer's tokens answer what the grammar asks of a word: its text when it is plain (a
reserved word, a name), and the unquoted prefix where an assignment's ``NAME=`` must be."""

from __future__ import annotations

from ray_layout.shell.lexer import tokenize
from ray_layout.shell.tokens import Word


def only_word(text: str) -> Word:
    (token,) = tokenize(text, "t.sh")
    assert isinstance(token, Word)
    return token


def test_plain_words_and_assignment_prefixes():
    assert only_word("then").plain == "then"
    assert only_word("'then'").plain is None  # a quoted reserved word is not one
    assert only_word("$'then'").plain is None
    assert only_word("th\\en").plain is None  # an escape quotes its character
    assert only_word('A="x y"').unquoted_prefix == "A="
    assert only_word('"A"=1').unquoted_prefix == ""
    assert only_word("A=$'x'").unquoted_prefix == "A="
