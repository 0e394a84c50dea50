"""The builtins that print, and the working directory: ``echo``, ``printf``, ``pwd``, ``cd``
and the script-directory idioms' ``dirname``/``basename`` (text functions, computed as
coreutils does).  What they print is a command substitution's output; each character keeps its
place in the script where it has one."""

from __future__ import annotations

import posixpath

from ray_layout.shell.arithmetic import printf
from ray_layout.shell.escapes import backslash_escape
from ray_layout.shell.flow import Status, Unknown
from ray_layout.shell.runner import Builtin, Runner
from ray_layout.shell.state import State
from ray_layout.shell.syntax import Simple
from ray_layout.shell.values import ExpandedWord, Text, Unresolved, Value


def _known_texts(words: list[ExpandedWord]) -> list[str] | str:
    """The words' texts, or why one of them is not known."""
    unknown = next((w.unresolved for w in words if w.unresolved), None)
    return unknown if unknown is not None else [w.text for w in words]


def _echo(interp: Runner, words: list[ExpandedWord], node: Simple, state: State) -> Status:
    arguments = words[1:]
    newline, escapes = True, False
    while (
        arguments
        and arguments[0].text[:1] == "-"
        and set(arguments[0].text[1:]) <= set("neE")
        and len(arguments[0].text) > 1
    ):
        flags = arguments.pop(0).text[1:]
        newline = newline and "n" not in flags
        escapes = (escapes or "e" in flags) and not flags.endswith("E")
    pieces: list[Text] = []
    for position, word in enumerate(arguments):
        if position:
            pieces.append(Text.of(" "))
        text = Text(word.text, word.offsets, word.missing, word.unresolved)
        if escapes and "\\" in word.text:
            text = Text.of(_escaped(word.text))
        pieces.append(text)
    if newline:
        pieces.append(Text.of("\n"))
    _print(state, pieces)
    return 0


def _escaped(text: str) -> str:
    out, index = [], 0
    while index < len(text):
        if text[index] == "\\" and index + 1 < len(text):
            if text[index + 1] == "c":
                break
            char, index = backslash_escape(text, index, ansi_c=False)
            out.append(char)
        else:
            out.append(text[index])
            index += 1
    return "".join(out)


def _print(state: State, pieces: list[Text]) -> None:
    if state.output is not None:
        state.output += pieces


def _printf(interp: Runner, words: list[ExpandedWord], node: Simple, state: State) -> Status:
    arguments = words[1:]
    target = None
    if len(arguments) >= 2 and arguments[0].text == "-v":
        target, arguments = arguments[1].text, arguments[2:]
    if arguments and arguments[0].text == "--":
        arguments = arguments[1:]
    texts = _known_texts(arguments)
    value: Value
    if isinstance(texts, str) or not texts:
        value = Unresolved(f"printf (line {node.line}) of {texts or 'no format'}")
    else:
        try:
            value = Text.of(printf(texts[0], texts[1:]))
        except ValueError as exc:
            value = Unresolved(f"printf (line {node.line}): {exc}")
    if target is not None:
        interp_value = value
        if isinstance(interp_value, Unresolved) and target in interp.environment:
            interp_value = Text.of(interp.environment[target])
        state.store(target, interp_value, node.line)
        return 0 if isinstance(value, Text) else Unknown(value.reason)
    if isinstance(value, Unresolved):
        state.impure = state.impure or value.reason
        return Unknown(value.reason)
    _print(state, [value])
    return 0


def _cd(interp: Runner, words: list[ExpandedWord], node: Simple, state: State) -> Status:
    """``cd``: the directory it names becomes the shell's.  Whether it exists only the job knows,
    but for the script's own folder (``cd "$(dirname "$0")"``), which does."""
    arguments = [w for w in words[1:] if w.text not in ("--", "-P", "-L")]
    target = arguments[0] if arguments else None
    if target is None or target.unknown:
        state.cwd = None
        return Unknown(f"cd (line {node.line}) to a directory this reader does not know")
    base = state.cwd
    if posixpath.isabs(target.text):
        state.cwd = posixpath.normpath(target.text)
    else:
        state.cwd = posixpath.normpath(posixpath.join(base, target.text)) if base else None
    home = posixpath.dirname(posixpath.abspath(state.sources[-1])) if state.sources else None
    if state.cwd is not None and home is not None and state.cwd == home:
        return 0
    return Unknown(f"whether the directory of cd (line {node.line}) exists")


def _pwd(interp: Runner, words: list[ExpandedWord], node: Simple, state: State) -> Status:
    if state.cwd is None:  # the directory the job starts in: the job's, unless --env PWD gives it
        given = interp.environment.get("PWD")
        if given is None:
            state.impure = (
                state.impure or "pwd, the directory the job starts in (give --env PWD=DIR)"
            )
            return 0
        _print(state, [Text.of(given + "\n")])
        return 0
    _print(state, [Text.of(state.cwd + "\n")])
    return 0


def _dirname(interp: Runner, words: list[ExpandedWord], node: Simple, state: State) -> Status:
    """``dirname`` and ``basename`` are text functions, as coreutils computes them."""
    arguments = [w for w in words[1:] if w.text != "--"]
    texts = _known_texts(arguments)
    if isinstance(texts, str) or not texts:
        state.impure = state.impure or f"{words[0].text} of {texts or 'nothing'}"
        return Unknown(f"{words[0].text} (line {node.line})")
    if words[0].text == "dirname":
        out = [_dir(text) for text in texts]
    else:
        name = _base(texts[0])
        if len(texts) > 1 and name != texts[1] and name.endswith(texts[1]):
            name = name[: -len(texts[1])]
        out = [name]
    _print(state, [Text.of("\n".join(out) + "\n")])
    return 0


def _dir(path: str) -> str:
    stripped = path.rstrip("/")
    if not stripped:
        return "/" if path else "."
    head = stripped.rpartition("/")[0].rstrip("/")
    if "/" not in stripped:
        return "."
    return head or "/"


def _base(path: str) -> str:
    stripped = path.rstrip("/")
    return stripped.rpartition("/")[2] if stripped else ("/" if path else "")


OUTPUT_BUILTINS: dict[str, Builtin] = {
    "echo": _echo,
    "printf": _printf,
    "cd": _cd,
    "pwd": _pwd,
    "dirname": _dirname,
    "basename": _dirname,
}
