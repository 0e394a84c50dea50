"""Bash's backslash escapes as ``$'...'`` and printf's format decode them: the one table both
use, where they differ (``\\cX``; printf refusing a ``\\x`` without a digit), and that any text
decodes, one escape at a time, without running past itself."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ray_layout.shell.escapes import backslash_escape


@pytest.mark.parametrize(
    ("text", "decoded", "length"),  # bash's own answers (printf -v and $'...')
    [
        ("\\n", "\n", 2),
        ("\\e", "\x1b", 2),
        ("\\'", "'", 2),
        ("\\101x", "A", 4),  # at most three octal digits
        ("\\1011", "A", 4),
        ("\\0101", "\b", 4),  # \010, then "1"
        ("\\x41", "A", 4),
        ("\\x4g", "\x04", 3),
        ("\\u00e9", "é", 6),
        ("\\U0001F600", "\U0001f600", 10),
        ("\\q", "\\q", 2),  # an escape bash does not know stands for itself
        ("\\8", "\\8", 2),
        ("\\", "\\", 1),
    ],
)
def test_escapes_decode_as_bash(text, decoded, length):
    for ansi_c in (True, False):
        assert backslash_escape(f"<{text}", 1, ansi_c=ansi_c) == (decoded, 1 + length)


def test_control_characters_are_ansi_c_quotings_alone():
    assert backslash_escape("\\cA", 0, ansi_c=True) == ("\x01", 3)
    assert backslash_escape("\\c?", 0, ansi_c=True) == ("\x7f", 3)
    assert backslash_escape("\\c", 0, ansi_c=True) == ("\\c", 2)
    assert backslash_escape("\\c\\\\x", 0, ansi_c=True) == ("\x1c", 4)  # \c and \\
    assert backslash_escape("\\cA", 0, ansi_c=False) == ("\\c", 2)  # printf: \c as written


def test_a_hex_escape_without_a_digit():
    assert backslash_escape("\\xg", 0, ansi_c=True) == ("\\x", 2)
    with pytest.raises(ValueError, match=r"\\x without a hex digit"):
        backslash_escape("\\xg", 0, ansi_c=False)


def test_a_code_point_python_cannot_hold_is_the_replacement_character():
    assert backslash_escape("\\UFFFFFFFF", 0, ansi_c=True) == ("\ufffd", 10)
    assert backslash_escape("\\ud800", 0, ansi_c=True) == ("\ufffd", 6)


@given(st.text(max_size=12), st.booleans())
def test_any_text_decodes_one_escape_without_running_past_it(tail, ansi_c):
    text = "\\" + tail
    try:
        decoded, end = backslash_escape(text, 0, ansi_c=ansi_c)
    except ValueError as exc:
        assert not ansi_c and "without a hex digit" in str(exc)
        return
    assert 1 <= end <= len(text) and len(decoded) <= end
