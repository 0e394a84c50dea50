"""Bash's backslash escapes, as ``$'...'`` quoting and ``printf``'s format decode them: one
table for both, since bash's two decoders differ only in ``\\cX`` (``$'...'`` alone) and in
refusing ``\\x`` without a digit (``printf`` alone).

``\\xHH`` and ``\\NNN`` stand for a byte, not a character: a byte past ASCII is held as Python
holds an undecodable byte of its argv (``surrogateescape``), and :func:`as_argv` joins a run of
them into the characters they encode, so a decoded word is what Megatron's ``sys.argv`` reads."""

from __future__ import annotations

from ray_layout.errors import quoted

_SIMPLE = {
    "a": "\a",
    "b": "\b",
    "e": "\x1b",
    "E": "\x1b",
    "f": "\f",
    "n": "\n",
    "r": "\r",
    "t": "\t",
    "v": "\v",
    "\\": "\\",
    "'": "'",
    '"': '"',
    "?": "?",
}
_HEX_DIGITS = {"x": 2, "u": 4, "U": 8}  # the most digits each reads
_OCTAL = "01234567"
_HEX = "0123456789abcdefABCDEF"


def backslash_escape(text: str, start: int, *, ansi_c: bool) -> tuple[str, int]:
    """What the escape at ``text[start]`` (a backslash) stands for, and the index after it:
    ``\\n``, ``\\t``, ``\\NNN`` octal, ``\\xHH``, ``\\uHHHH``, ``\\UHHHHHHHH``, and ``\\cX`` (a
    control character) where ``ansi_c``; an escape bash does not know stands for itself.
    ``ValueError`` for printf's ``\\x`` (``\\u``, ``\\U``) without a hex digit, which bash
    refuses."""
    char = text[start + 1 : start + 2]
    if char in _SIMPLE and char:
        return _SIMPLE[char], start + 2
    if char and char in _OCTAL:
        end = _run(text, start + 1, _OCTAL, 3)
        return _byte(int(text[start + 1 : end], 8) & 0xFF), end
    if char in _HEX_DIGITS and char:
        end = _run(text, start + 2, _HEX, _HEX_DIGITS[char])
        if end == start + 2:
            if not ansi_c:
                raise ValueError(f"printf format {quoted(text)}: \\{char} without a hex digit")
            return "\\" + char, start + 2
        code = int(text[start + 2 : end], 16)
        if char == "x":
            return _byte(code), end
        valid = code <= 0x10FFFF and not 0xD800 <= code <= 0xDFFF  # a character Python holds
        return (chr(code) if valid else "\ufffd"), end
    following = text[start + 2 : start + 3]
    if char == "c" and ansi_c and following:
        doubled = following == "\\" and text[start + 3 : start + 4] == "\\"  # \c\\ is one
        code = 0x7F if following == "?" else ord(following.upper()) & 0x1F
        return chr(code), start + 3 + doubled
    return "\\" + char, start + 1 + len(char)


def as_argv(text: str) -> str:
    """``text`` as Python reads it from argv: bytes held by :func:`backslash_escape` that form
    UTF-8 become their characters, the rest stay held."""
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "surrogateescape")


def _byte(value: int) -> str:
    """One byte of an escape: ASCII as itself, a higher one held as ``surrogateescape`` does."""
    return chr(value) if value < 0x80 else chr(0xDC00 + value)


def _run(text: str, start: int, alphabet: str, most: int) -> int:
    """The index after the longest run (at most ``most``) of ``alphabet`` at ``start``."""
    end = start
    while end < len(text) and end - start < most and text[end] in alphabet:
        end += 1
    return end
