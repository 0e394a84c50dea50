"""Hand the user's launch script back, tuned: the same bytes with only the split changed.

The new layout goes where the script's own ``--pipeline-model-parallel-layout`` value was
written (a variable's assignment, when the flag takes it from one), or in front of its
``--pipeline-model-parallel-size``; the other split flags (first/last stage counts, the
account-for flags, the VPP flags, which the layout string replaces) are taken out, and a PP that
changed is written where the script's PP was.  One comment line names where the layout came
from.  Every other byte stays, so ``diff`` shows the split and nothing else.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ray_layout.model.layout import Layout, expand
from ray_layout.model.megatron_args import FlagUse, walk_flags
from ray_layout.model.split import SPLIT_FLAGS
from ray_layout.shell.interpreter import FileReader
from ray_layout.shell.launch import read_launch
from ray_layout.shell.refusal import ShellError
from ray_layout.shell.values import ExpandedWord

_LAYOUT_FLAG = SPLIT_FLAGS["layout"]
_PP_FLAG = "--pipeline-model-parallel-size"
_QUOTES = "'\""


@dataclass(frozen=True)
class _Edit:
    start: int
    end: int
    replacement: str


def rewrite_split(
    text: str,
    source: str,
    layout: Layout,
    comment: str,
    environment: Mapping[str, str] | None = None,
    arguments: Sequence[str] | None = None,
    read_file: FileReader | None = None,
) -> str:
    """``text`` with its split set to ``layout`` and ``comment`` as one new line near the top;
    a :class:`ShellError` where a split flag's words are computed rather than written.  The
    script is read as the loader read it (its environment, arguments and sourced files)."""
    launch = read_launch(text, source, environment, arguments, read_file)
    arguments = launch.arguments
    words = [w.text for w in arguments]
    uses = list(walk_flags(words, source, strict=False, keep_unknown=True))
    split_flags = set(SPLIT_FLAGS.values())
    edits: list[_Edit] = []
    layout_use = _last(uses, _LAYOUT_FLAG)
    pp_use = _last(uses, _PP_FLAG)
    for use in uses:
        if use.flag in split_flags and use is not layout_use:
            edits.append(_removal(text, [arguments[i] for i in use.span], source))
    if layout_use is not None and layout_use.values:
        value_word = arguments[layout_use.position + 1]
        edits.append(_replacement(text, value_word, str(layout), source, launch.reparsed))
    elif arguments:  # in front of the PP flag (else of the first argument), as one more flag
        anchor = arguments[pp_use.position if pp_use is not None else 0]
        start = _written(anchor, source)[0]
        value = _quoted(str(layout), _quote_at(text, start), launch.reparsed)
        pp = "" if pp_use is not None else f"{_PP_FLAG} {layout.pp} "
        edits.append(_insertion(text, start, f"{pp}{_LAYOUT_FLAG} {value}"))
    else:
        raise ShellError(f"{source}: no Megatron arguments to add the layout to")
    if pp_use is not None and pp_use.values and pp_use.values[0] != str(layout.pp):
        pp_word = arguments[pp_use.position + 1]
        edits.append(_replacement(text, pp_word, str(layout.pp), source, launch.reparsed))
    return _with_comment(_apply(text, edits), comment)


def _last(uses: list[FlagUse], flag: str) -> FlagUse | None:
    return next((use for use in reversed(uses) if use.flag == flag), None)


def _written(word: ExpandedWord, source: str) -> tuple[int, int]:
    """Where a word's characters are in the script: (start, end), quotes not included."""
    if not word.offsets or min(word.offsets) < 0:
        raise ShellError(
            f"{source}:{word.line}: {word.text[:80]!r} is computed, not written, in the script: "
            "--write-script cannot change it"
        )
    return word.offsets[0], word.offsets[-1] + 1


def _replacement(text: str, word: ExpandedWord, new: str, source: str, reparsed: bool) -> _Edit:
    start, end = _written(word, source)
    return _Edit(start, end, _quoted(new, _quote_at(text, start), reparsed))


def _quoted(value: str, context: str | None, reparsed: bool) -> str:
    """``value`` as it must be written where the script is in ``context`` (a quote, or None):
    quoted once more where bash parses the command's text again (``bash -c "$CMD"``); inside a
    double-quoted string, which a script expands unquoted (``$GPT_ARGS``), unrolled, so that
    no ``*`` or ``(`` of it can match a file name (Megatron reads both forms alike)."""
    if value.isalnum():
        return value
    inner = f"'{value}'" if reparsed else value
    if context == '"' and not reparsed:  # a string expanded unquoted later: no glob character
        return expand(value)
    if context == '"' or (context == "'" and not reparsed):
        return inner
    return f'"{inner}"' if reparsed else f"'{value}'"


def _quote_at(text: str, position: int) -> str | None:
    """The quote the script is inside at ``position`` (``'`` or ``"``), or None."""
    quote: str | None = None
    index = 0
    while index < position:
        char = text[index]
        if quote == "'":
            quote = None if char == "'" else quote
        elif char == "\\":
            index += 1
        elif quote == '"':
            quote = None if char == '"' else quote
        elif char in _QUOTES:
            quote = char
        elif char == "#" and (index == 0 or text[index - 1] in " \t\n"):
            index = text.find("\n", index)
            index = position if index < 0 else index
            continue
        index += 1
    return quote


def _removal(text: str, words: list[ExpandedWord], source: str) -> _Edit:
    """A flag and its values taken out with their quotes and the blanks before them; the whole
    line where they were all there was on a continued line."""
    start, end = _written(words[0], source)[0], _written(words[-1], source)[1]
    if (
        start > 0
        and text[start - 1] in _QUOTES
        and end < len(text)
        and text[end] == text[start - 1]
    ):
        start, end = start - 1, end + 1
    line_start = text.rfind("\n", 0, start) + 1
    line_end = text.find("\n", end)
    line_end = len(text) if line_end < 0 else line_end
    rest = text[line_start:start].strip() + text[end:line_end].strip()
    if rest == "\\":  # a continued line that held only this flag
        return _Edit(line_start, min(line_end + 1, len(text)), "")
    while start > line_start and text[start - 1] in " \t":
        start -= 1
    return _Edit(start, end, "")


def _insertion(text: str, start: int, words: str) -> _Edit:
    """``words`` in front of the word at ``start``: on a line of their own where that word
    begins its line (continued with a backslash where the line before is), so that ``diff``
    shows one added line."""
    line_start = text.rfind("\n", 0, start) + 1
    indent = text[line_start:start]
    if indent.strip(" \t"):
        return _Edit(start, start, f"{words} ")
    ending = " \\\n" if text[:line_start].rstrip("\n").endswith("\\") else "\n"
    return _Edit(line_start, line_start, f"{indent}{words}{ending}")


def _apply(text: str, edits: list[_Edit]) -> str:
    out, position = [], 0
    for edit in sorted(edits, key=lambda e: (e.start, e.end)):
        if edit.start < position:
            continue  # inside a line already taken out
        out += [text[position : edit.start], edit.replacement]
        position = edit.end
    out.append(text[position:])
    return "".join(out)


def _with_comment(text: str, comment: str) -> str:
    line = "# " + comment.replace("\n", " ") + "\n"
    if text.startswith("#!"):
        end = text.find("\n") + 1 or len(text)
        return text[:end] + line + text[end:]
    return line + text
