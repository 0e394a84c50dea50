"""The token cursor's errors name the line, as bash's parser does."""

from __future__ import annotations

import pytest

from ray_layout.shell.cursor import Cursor, shown
from ray_layout.shell.lexer import tokenize
from ray_layout.shell.refusal import ShellError


def test_expecting_a_word_names_what_was_found_or_the_opener():
    cursor = Cursor(tokenize("if x\nthen", "t.sh"), "t.sh")
    cursor.take()
    cursor.take()
    with pytest.raises(
        ShellError, match=r"^t\.sh:1: 'if' \(line 1\) needs 'then', found end of line$"
    ):
        cursor.expect_word("then", "if", 1)
    cursor.skip_newlines()
    cursor.expect_word("then", "if", 1)
    with pytest.raises(ShellError, match=r"^t\.sh:1: 'if' is never closed by 'fi'$"):
        cursor.expect_word("fi", "if", 1)
    assert shown(tokenize(";", "t.sh")[0]) == "';'"
