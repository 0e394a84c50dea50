"""Here-documents as bash's lexer reads them: the delimiter after ``<<`` (``<<-`` strips
tabs), and each body, the lines up to the delimiter alone on a line, read when the line that
opened it ends.  A body is data, never commands of the script."""

from __future__ import annotations

from ray_layout.errors import quoted
from ray_layout.shell.scanner import Scanner
from ray_layout.shell.tokens import Heredoc, Literal


def delimiter(lexer: Scanner, *, strip_tabs: bool) -> None:
    while lexer.peek() in (" ", "\t"):
        lexer.advance()
    if lexer.peek() in ("", "\n"):
        raise lexer.error("a here-document needs a delimiter word after <<")
    word = lexer.word(inside_array=False)
    delimiter = "".join(p.text for p in word.parts if isinstance(p, Literal))
    if not delimiter:
        raise lexer.error("a here-document's delimiter must be a plain word")
    quoted = any(isinstance(p, Literal) and p.quoted for p in word.parts)
    lexer.pending_heredocs.append((delimiter, strip_tabs, quoted))


def read_bodies(lexer: Scanner) -> None:
    """The body of each here-document opened on the line just ended: the lines up to its
    delimiter alone on a line (tabs stripped for ``<<-``).  The body is data, never read
    for quotes; under an unquoted delimiter a backslash-newline joins two lines (so
    ``x\\`` then ``EOF`` is no end), as bash reads it."""
    while lexer.pending_heredocs:
        delimiter, strip_tabs, quoted = lexer.pending_heredocs.pop(0)
        start_line, body = lexer.line, []
        while True:
            line = heredoc_line(lexer, delimiter, start_line, joined=not quoted)
            if (line.lstrip("\t") if strip_tabs else line) == delimiter:
                break
            body.append(line)
        lexer.tokens.append(Heredoc(delimiter, "\n".join(body), start_line, quoted))


def heredoc_line(lexer: Scanner, delimiter: str, start_line: int, *, joined: bool) -> str:
    """The next line of a here-document's body (with its continuations where ``joined``)."""
    pieces: list[str] = []
    while True:
        if lexer.pos >= len(lexer.text):
            raise lexer.error(f"here-document {quoted(delimiter)} is never ended", start_line)
        end = lexer.text.find("\n", lexer.pos)
        end = len(lexer.text) if end < 0 else end
        line = lexer.text[lexer.pos : end]
        lexer.advance(end - lexer.pos + (end < len(lexer.text)))
        backslashes = len(line) - len(line.rstrip("\\"))
        if not (joined and backslashes % 2 and end < len(lexer.text)):
            return "".join(pieces) + line
        pieces.append(line[:-1])
