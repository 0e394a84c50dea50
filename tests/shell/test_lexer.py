"""The lexer cuts words as bash does (quotes, escapes, comments, continuations, operators,
here-documents, arrays), keeps each literal character's offset in the script for the rewrite, and
names the line of a quote or substitution that is never closed."""

from __future__ import annotations

import re
import shlex

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ray_layout.shell.lexer import MAX_NESTING, MAX_SCRIPT_CHARS, tokenize
from ray_layout.shell.refusal import ShellError
from ray_layout.shell.tokens import (
    ArrayLiteral,
    Heredoc,
    Literal,
    Operator,
    Part,
    Reference,
    Substitution,
    Word,
)
from tests.helpers.shell_bash import bash_words, needs_bash, words


def only_word(text: str) -> Word:
    (token,) = tokenize(text, "t.sh")
    assert isinstance(token, Word)
    return token


def test_quotes_escapes_and_continuations_as_bash_passes_them():
    assert words("cmd 'a $X' \"b $X\" c\\ d \\\n  e") == ["cmd", "a $X", "b ", "c d", "e"]
    assert words('X=1; cmd "$X"x ${X}y') == ["cmd", "1x", "1y"]
    assert words('cmd "" x') == ["cmd", "", "x"]
    assert words("cmd a # a comment's quote\ncmd b") == ["cmd", "b"]


@pytest.mark.parametrize(
    ("script", "message"),
    [
        ("echo 'open", "t.sh:1: a quotation is never closed"),
        ("A=(1 2\n", "an array's '(' is never closed"),
        ("cat <<EOF\nbody\n", "here-document 'EOF' is never ended"),
        ("X=${Y", "a '${' is never closed"),
        ("echo\necho $(date\n", "t.sh:2: a '$(' is never closed"),
        ("echo $((1 +\n", "t.sh:1: a '$((' is never closed"),
        ("X=$(cat <<EOF\nbody)\n", "here-document 'EOF' is never ended"),
        ("echo $'a\\'\n", "t.sh:1: a quotation is never closed"),
        ("echo `date", "a backquoted command is never closed"),
        ("cat <<\n", "a here-document needs a delimiter word after <<"),
        ("echo ${A[", "a '${NAME[' is never closed"),
        ("${A:-" * (MAX_NESTING + 2), "expansions nested too deeply"),
        ("x" * (MAX_SCRIPT_CHARS + 1), "more than a launch script's 4,000,000"),
    ],
)
def test_broken_scripts_are_one_line_errors_with_the_line(script, message):
    with pytest.raises(ShellError, match=re.escape(message)) as info:
        tokenize(script, "t.sh")
    assert "\n" not in str(info.value)


_SAFE = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=12)


@given(st.lists(_SAFE, min_size=1, max_size=6))
def test_any_words_quoted_by_shlex_come_back_as_themselves(items):
    assert words("cmd " + " ".join(shlex.quote(item) for item in items)) == ["cmd", *items]


# Words of quotes and escapes only (no expansion, no brace, tilde or pathname expansion, which
# the reader leaves to the shell): bash is the judge of what they become.
_PRINTABLE = st.characters(min_codepoint=32, max_codepoint=126)
_PLAIN = st.text(st.sampled_from("abcXYZ019-_=./:,+@%^"), min_size=1, max_size=4)
_SINGLE = st.text(_PRINTABLE.filter(lambda c: c != "'"), max_size=5).map(lambda t: f"'{t}'")
_DOUBLE_CHARACTER = st.one_of(
    st.sampled_from([*"ab 'x#;|&<>(){}*?~", '\\"', "\\\\", "\\$", "\\`", "\\q", "\\\n"])
)
_DOUBLE = st.lists(_DOUBLE_CHARACTER, max_size=5).map(lambda cs: '"' + "".join(cs) + '"')
_ESCAPED = _PRINTABLE.map(lambda c: "\\" + c)
quoted_words = st.lists(st.one_of(_PLAIN, _SINGLE, _DOUBLE, _ESCAPED), min_size=1, max_size=4)


@needs_bash
@settings(max_examples=100, deadline=None)
@given(st.lists(quoted_words.map("".join), min_size=1, max_size=4), st.booleans())
def test_quoted_and_escaped_words_are_what_bash_passes(items, continued):
    command = (" \\\n  " if continued else " ").join(items)
    assert words(f"cmd {command}") == bash_words("", command)


def _literals(parts: tuple[Part, ...]) -> list[Literal]:
    found: list[Literal] = []
    for part in parts:
        if isinstance(part, Literal):
            found.append(part)
        elif isinstance(part, Reference):
            found += _literals(part.argument)
    return found


@given(st.one_of(st.text(max_size=80), st.lists(quoted_words.map("".join)).map(" ".join)))
def test_every_literal_character_points_at_itself_in_the_script(text):
    """The offsets --write-script changes: each one is the character it stands for."""
    try:
        tokens = tokenize(text, "t.sh")
    except ShellError:
        return
    for token in tokens:
        for word in token.words if isinstance(token, ArrayLiteral) else [token]:
            if not isinstance(word, Word):
                continue
            for literal in _literals(word.parts):
                assert len(literal.offsets) == len(literal.text)
                pairs = zip(literal.offsets, literal.text, strict=True)
                assert all(text[o] == c for o, c in pairs if o >= 0)
                assert min(literal.offsets, default=0) >= 0 or "$'" in text  # -1: an escape


def test_operators_here_documents_and_arrays_are_tokens_of_their_own():
    script = "A+=(x 'y z' # note\n)\nf 2>&1 | g && h; cat <<-END\n\tbody $X\n\tEND\nlast"
    tokens = tokenize(script, "t.sh")
    array = tokens[0]
    assert isinstance(array, ArrayLiteral)
    assert (array.name, array.append, [w.parts[0].text for w in array.words]) == (
        "A",
        True,
        ["x", "y z"],
    )
    operators = [t.text for t in tokens if isinstance(t, Operator)]
    assert operators == ["\n", ">&", "|", "&&", ";", "<<-", "\n"]
    heredoc = next(t for t in tokens if isinstance(t, Heredoc))
    assert (heredoc.delimiter, heredoc.body, heredoc.line) == ("END", "\tbody $X", 4)
    assert tokens[-1].plain == "last" and tokens[-1].line == 6


def test_expansions_inside_words_are_parts():
    parts = only_word('a${B[@]}"${C:-d e}"$1$((2+3))$(date)`id`${#D}${!E}${F/x/y}').parts
    assert parts[0] == Literal("a", (0,), False)
    b, c, one, arithmetic, command, backquoted, length, indirect, replaced = parts[1:]
    assert (b.name, b.index, b.operator, b.quoted) == ("B", "@", None, False)
    assert (c.name, c.operator, c.quoted) == ("C", ":-", True)
    assert c.argument == (Literal("d e", (14, 15, 16), False),)  # its own quotes, none here
    assert (one.name, one.source) == ("1", "$1")
    assert (arithmetic.kind, arithmetic.text) == ("arithmetic", "2+3")
    assert (command.kind, command.text) == ("command", "date")
    assert (backquoted.kind, backquoted.text, backquoted.source) == ("command", "id", "`id`")
    assert (length.name, length.operator) == ("D", "length")
    assert (indirect.operator, replaced.operator) == ("!", "/")
    assert all(isinstance(p, Reference | Substitution) for p in parts[1:])


def test_a_dollar_without_a_name_is_a_plain_character():
    first, second = tokenize('x$ "a$"', "t.sh")
    assert first.parts == (Literal("x$", (0, 1), False),)
    assert second.parts == (Literal("a$", (4, 5), True),)


def test_an_open_double_quote_names_the_line_it_opens_on():
    with pytest.raises(ShellError, match=r"^t\.sh:1: a quotation is never closed$"):
        tokenize('echo "a\nb\nc', "t.sh")


# $'...' strings of escapes bash decodes and some it keeps (an unknown one, a lone \x):
# bash (in the C locale, hence only ASCII from \u) is the judge.
_ANSI_C_PIECES = st.one_of(
    st.text(st.sampled_from('ab "$`;'), min_size=1, max_size=3),
    st.sampled_from(["\\a", "\\b", "\\e", "\\E", "\\f", "\\n", "\\r", "\\t", "\\v"]),
    st.sampled_from(["\\\\", "\\'", '\\"', "\\?", "\\q", "\\x", "\\xg", "\\c", "\\0"]),
    st.integers(1, 0o377).map(lambda n: f"\\{n:o}"),
    st.integers(1, 0xFF).map(lambda n: f"\\x{n:x}"),
    st.sampled_from(["\\xc3\\xa9", "\\303\\251", "\\xe2\\x82\\xac", "\\xe2\\x82"]),  # UTF-8, cut
    st.integers(1, 0x7F).map(lambda n: f"\\u{n:04x}"),
    st.sampled_from("@AZaz[?").map(lambda c: f"\\c{c}"),
)


@needs_bash
@settings(max_examples=100, deadline=None)
@given(st.lists(_ANSI_C_PIECES, max_size=5).map("".join), st.sampled_from(["", "x"]))
def test_ansi_c_quotes_decode_their_escapes_as_bash(inside, around):
    command = f"{around}$'{inside}'{around}"
    assert words(f"cmd {command}") == bash_words("", command)


def test_escaped_bytes_read_as_megatron_s_argv_would():
    """``\\xHH`` is a byte: bytes that form UTF-8 are its character, a stray one is held as
    Python's argv holds it (``surrogateescape``)."""
    assert words("cmd $'\\xc3\\xa9t\\351'") == ["cmd", "\u00e9t\udce9"]
    assert words("cmd $'\\u00e9'") == ["cmd", "\u00e9"]  # \u is a character, not a byte


def test_an_ansi_c_escape_has_no_offset_of_its_own():
    (word,) = tokenize("$'a\\tb'", "t.sh")
    assert word.parts == (Literal("a\tb", (2, -1, 5), True),)
    assert words("cmd $'a\\0b'c") == ["cmd", "ac"]  # a NUL ends the text, as in bash


@pytest.mark.parametrize(
    ("script", "expected"),
    [
        # the bodies are data, never read for quotes, whatever the delimiter
        ("X=$(cat <<EOF\nDon't\nEOF\n)\ncmd ok", ["cmd", "ok"]),
        ("cat <<'EOF'\nDon't $(\nEOF\ncmd ok", ["cmd", "ok"]),
        ('cat <<"EOF" | tee x\nit\'s "\nEOF\ncmd ok', ["cmd", "ok"]),
        # an unquoted delimiter joins a line ending in a backslash to the next (bash: "a EOF")
        ("cat <<EOF\na \\\nEOF\nEOF\ncmd ok", ["cmd", "ok"]),
        # inside a block, the body is no word of the block
        ("if true; then\n  cat <<EOF\nDon't\nEOF\nfi\ncmd ok", ["cmd", "ok"]),
        ("f() {\n  cat <<-EOF\n\tDon't\n\tEOF\n}\ncmd ok", ["cmd", "ok"]),
    ],
)
def test_here_document_bodies_are_data(script, expected):
    assert words(script) == expected


def test_a_quoted_delimiter_keeps_a_trailing_backslash_literal():
    tokens = tokenize("cat <<'EOF'\na \\\nEOF\nlast", "t.sh")
    heredoc = next(t for t in tokens if isinstance(t, Heredoc))
    assert heredoc.body == "a \\" and tokens[-1].plain == "last"


@pytest.mark.parametrize(
    "command",
    [
        '$(echo "a\\")")',  # an escaped quote inside quotes inside $( )
        "$(echo a # it's a comment )\n)",  # a comment inside $( ) runs to the line's end
        "$( (echo a) )x",  # a subshell of its own
        '"$(echo "a b")"',
    ],
)
def test_a_command_substitution_is_read_as_the_command_bash_reads(command):
    (word,) = tokenize(command, "t.sh")
    assert [p.source for p in word.parts if isinstance(p, Substitution)] == [
        command[command.index("$(") : command.rindex(")") + 1]
    ]


@pytest.mark.parametrize(
    ("command", "kept"),
    [
        ("cmd 1000 > log", ["cmd", "1000", "log"]),  # a spaced number is a word
        ("cmd 1000 2>log", ["cmd", "1000", "log"]),  # 2> is descriptor 2's redirection
        ("cmd 2>&1 3<in", ["cmd", "1", "in"]),
        ("cmd 2 >&1", ["cmd", "2", "1"]),
        ("cmd x2>y", ["cmd", "x2", "y"]),  # only a number is a descriptor
    ],
)
def test_only_digits_against_the_operator_are_a_file_descriptor(command, kept):
    found = [t.plain for t in tokenize(command, "t.sh") if isinstance(t, Word)]
    assert found == kept


def test_a_process_substitution_is_one_word():
    tokens = tokenize("cmd > >(tee -a log) 2> >(cat >&2)", "t.sh")
    sources = [t.parts[0].source for t in tokens if isinstance(t, Word) and t.plain is None]
    assert sources == [">(tee -a log)", ">(cat >&2)"]
    assert [t.text for t in tokens if isinstance(t, Operator)] == [">", ">"]
