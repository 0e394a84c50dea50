"""Here-document bodies are data read as bash reads them: to the delimiter alone on a line,
tabs stripped under ``<<-``, a backslash-newline joined where the delimiter is unquoted."""

from __future__ import annotations

import pytest

from ray_layout.shell.lexer import tokenize
from ray_layout.shell.refusal import ShellError
from ray_layout.shell.tokens import Heredoc


def bodies(text: str) -> list[tuple[str, bool]]:
    return [(t.body, t.quoted) for t in tokenize(text, "t.sh") if isinstance(t, Heredoc)]


def test_bodies_end_at_their_delimiter_in_the_order_they_were_opened():
    assert bodies("cat <<A <<'B'\n1\nA\n2 $x\nB\n") == [("1", False), ("2 $x", True)]
    assert bodies("cat <<-EOF\n\tx\n\tEOF\n") == [("\tx", False)]
    assert bodies("cat <<EOF\na \\\nEOF\nEOF\n") == [("a EOF", False)]


def test_an_unended_body_is_one_line():
    with pytest.raises(ShellError, match=r"^t\.sh:2: here-document 'EOF' is never ended$"):
        tokenize("cat <<EOF\nx\n", "t.sh")
