"""Bash's patterns on text: globs (``*``, ``?``, ``[...]``) as regular expressions, and the
edits ``${V#p}``, ``${V%%p}``, ``${V//p/r}``, ``${V^^}`` make with them, each character keeping
its place in the script."""

from __future__ import annotations

import re

from ray_layout.shell.values import EMPTY, Gap, Text, Unresolved, Value

_CLASSES = {
    "alpha": "a-zA-Z",
    "upper": "A-Z",
    "lower": "a-z",
    "digit": "0-9",
    "alnum": "a-zA-Z0-9",
    "xdigit": "0-9a-fA-F",
    "space": " \\t\\n\\r\\f\\v",
    "blank": " \\t",
    "punct": "!-/:-@\\[-`{-~",
}
TRANSFORMS = frozenset({"#", "##", "%", "%%", "/", "//", "/#", "/%", ":", "^", "^^", ",", ",,"})


def edited(
    operator: str, value: Value, pattern: re.Pattern[str], replacement: Text, shown: str
) -> Value:
    """``edit`` on each element of an array (``${A[@]#p}``), on the text otherwise."""
    try:
        each = [
            edit(operator, element, pattern, replacement)
            for element in (value if isinstance(value, tuple) else (value,))  # type: ignore[union-attr]
        ]
    except ValueError as exc:
        return Unresolved(f"{shown}: {exc}")
    return tuple(each) if isinstance(value, tuple) else each[0]


def _sliced_elements(value: tuple[Text, ...], numbers: list[int]) -> Value:
    size = len(value)
    start = numbers[0] + size if numbers[0] < 0 else numbers[0]
    chosen = [v for i, v in enumerate(value) if i >= start and not isinstance(v, Gap)]
    if len(numbers) == 2:
        chosen = chosen[: max(numbers[1], 0)] if numbers[1] >= 0 else chosen[: numbers[1]]
    return tuple(chosen)


def sliced(value: Value, numbers: list[int], shown: str) -> Value:
    """``${V:offset}``, ``${V:offset:length}`` (negative counts from the end) on a text, or on
    an array's elements for ``${A[@]:1:2}``."""
    if isinstance(value, tuple):  # by index: the set elements from the offset on
        return _sliced_elements(value, numbers)
    items: list[Text] | str = value.text  # type: ignore[union-attr]
    size = len(items)
    start = numbers[0] + size if numbers[0] < 0 else numbers[0]
    if start < 0 or start > size:
        return () if isinstance(value, tuple) else EMPTY
    end = size
    if len(numbers) == 2:
        end = numbers[1] + size if numbers[1] < 0 else start + numbers[1]
        if end < start:
            if isinstance(value, tuple) or numbers[1] >= 0:
                return () if isinstance(value, tuple) else EMPTY
            return Unresolved(f"{shown}: substring expression < 0")
    if isinstance(value, tuple):
        return tuple(value[start:end])
    return Text(value.text[start:end], value.offsets[start:end], value.missing)  # type: ignore[union-attr]


MAX_PATTERN_TEXT = 100_000  # a pattern tried at each position of a longer text is no reading


def edit(operator: str, text: Text, pattern: re.Pattern[str], replacement: Text) -> Text:
    value = text.text
    if operator in ("^", "^^", ",", ",,"):
        change = str.upper if operator[0] == "^" else str.lower
        cut = len(value) if len(operator) == 2 else min(1, len(value))
        changed = "".join(change(c) if pattern.fullmatch(c) else c for c in value[:cut])
        return Text(changed + value[cut:], text.offsets, text.missing)
    if len(value) > MAX_PATTERN_TEXT:
        raise ValueError(f"a pattern on a value of {len(value):,} characters")
    n = len(value)
    if operator in ("#", "##"):
        ends = range(n + 1) if operator == "#" else range(n, -1, -1)
        cut = next((e for e in ends if pattern.fullmatch(value, 0, e)), 0)
        return Text(value[cut:], text.offsets[cut:], text.missing)
    if operator in ("%", "%%"):
        starts = range(n, -1, -1) if operator == "%" else range(n + 1)
        cut = next((b for b in starts if pattern.fullmatch(value, b, n)), n)
        return Text(value[:cut], text.offsets[:cut], text.missing)
    return replace(operator, text, pattern, replacement)


def replace(operator: str, text: Text, pattern: re.Pattern[str], replacement: Text) -> Text:
    """``${V/p/r}`` (first, longest match), ``//`` (every), ``/#`` (at the start), ``/%`` (at
    the end); an empty pattern replaces nothing but under ``/#`` and ``/%``."""
    value, n = text.text, len(text.text)
    result, position = Text("", (), text.missing), 0
    anchored_start, anchored_end = operator == "/#", operator == "/%"
    while position <= n:
        starts = [position] if anchored_start else range(position, n + 1)
        match = None
        for begin in starts:
            ends = [n] if anchored_end else range(n, begin - 1, -1)
            match = next((e for e in ends if pattern.fullmatch(value, begin, e)), None)
            if match is not None and (match > begin or anchored_start or anchored_end):
                match = (begin, match)
                break
            match = None
        if match is None:
            break
        begin, end = match
        result += Text(value[position:begin], text.offsets[position:begin]) + replacement
        position = end
        if operator != "//" or end == begin:
            break
    return result + Text(value[position:], text.offsets[position:])


def glob_regex(pattern: str) -> str:
    """Bash's pattern matching (``*``, ``?``, ``[...]``, ``[!...]``, backslash) as a regular
    expression, anchored by the caller's ``fullmatch``."""
    out, index = [], 0
    while index < len(pattern):
        char = pattern[index]
        index += 1
        if char == "*":
            out.append(".*")
        elif char == "?":
            out.append(".")
        elif char == "\\" and index < len(pattern):
            out.append(re.escape(pattern[index]))
            index += 1
        elif char == "[" and (close := _class_end(pattern, index)) > 0:
            body = pattern[index:close]
            if "[." in body or "[=" in body:
                raise re.error("a collating symbol or an equivalence class")
            negate = body[:1] in ("!", "^")
            body = body[1:] if negate else body
            escaped = body.replace("\\", "\\\\").replace("[", "\\[")
            for name, members in _CLASSES.items():  # [[:upper:]]: POSIX classes
                escaped = escaped.replace(f"\\[:{name}:]", members)
            out.append(f"[{'^' if negate else ''}{escaped}]")
            index = close + 1
        else:
            out.append(re.escape(char))
    return "".join(out)


def _class_end(pattern: str, start: int) -> int:
    """The index of the ``]`` that closes a bracket expression opened before ``start``."""
    index = start + (pattern[start : start + 1] in ("!", "^"))
    index += pattern[index : index + 1] == "]"
    while index < len(pattern):
        if pattern.startswith("[:", index) and (end := pattern.find(":]", index + 2)) > 0:
            index = end + 2  # a class, [:alpha:], whose ] closes nothing
        elif pattern[index] == "]":
            return index
        else:
            index += 1
    return -1
