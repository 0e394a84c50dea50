"""Scripts inside a script: ``bash -c TEXT`` (a Slurm wrapper's ``srun bash -c "$CMD"``) and a
here-document given to ``sbatch``/``bash`` as the script it runs.  Each is read as a script of
its own, which sees only the exported variables, its commands placed back in the script."""

from __future__ import annotations

import contextlib
import posixpath
from dataclasses import replace

from ray_layout.errors import clipped
from ray_layout.shell.expand import expand_whole
from ray_layout.shell.flow import Break, Exit, Return, Uncertain, Unknown
from ray_layout.shell.lexer import tokenize
from ray_layout.shell.runner import Runner
from ray_layout.shell.state import State
from ray_layout.shell.syntax import Simple
from ray_layout.shell.tokens import Substitution, Word
from ray_layout.shell.values import ExpandedWord, Text, Unresolved, Value


def run_nested_shell(interp: Runner, words: list[ExpandedWord], node: Simple, state: State) -> None:
    """``bash -c TEXT [NAME ARGS...]`` anywhere in a command (``srun bash -x -c "$CMD"``): TEXT
    is read as a script of its own, which sees only the exported variables."""
    for position, word in enumerate(words):
        if posixpath.basename(word.text) not in ("bash", "sh"):
            continue
        options = position + 1
        while options < len(words) and words[options].text.startswith("-"):
            options += 1
        if not any("c" in w.text for w in words[position + 1 : options]) or options >= len(words):
            continue
        text = words[options]
        if text.unresolved and "\x01" not in text.text:
            interp.notes.append(f"{interp.source}:{node.line}: bash -c of {text.unresolved}")
            return
        rest = words[options + 1 :]
        _child(interp, Text(text.text, text.offsets, text.missing), rest, node, state, "bash -c")
        return


def run_heredoc_script(
    interp: Runner, words: list[ExpandedWord], node: Simple, state: State
) -> None:
    """``sbatch <<EOF`` (and ``bash``/``sh`` reading a here-document): the body is the script it
    runs, expanded first where its delimiter is not quoted, as bash expands it."""
    if node.heredoc is None or posixpath.basename(words[0].text) not in ("sbatch", "bash", "sh"):
        return
    if any(w.text.endswith(".sh") or w.text == "-c" for w in words[1:]):
        return
    word = interp.heredoc_body
    if word is None or (word.unresolved and "\x01" not in word.text):
        why = word.unresolved if word is not None else "a body this reader did not expand"
        interp.notes.append(f"{interp.source}:{node.line}: the here-document of {why}")
        return
    text = Text(word.text, word.offsets, word.missing)
    _child(interp, text, [], node, state, f"{words[0].text} <<{node.heredoc.delimiter}")


def _as_double_quoted(body: str, line: int) -> Word:
    """A here-document's body as one double-quoted word: the same expansions, and its own
    double quotes kept as characters."""
    out, index = [], 0
    while index < len(body):
        char = body[index]
        following = body[index + 1 : index + 2]
        if char == "\\" and following and following in "$`\\\n":
            out.append(char + following)
            index += 2
            continue
        out.append("\\\\" if char == "\\" and following == '"' else '\\"' if char == '"' else char)
        index += 1
    (word,) = [
        t for t in tokenize('"' + "".join(out) + '"', "here-document") if isinstance(t, Word)
    ]
    return replace(word, line=line)


def _child(
    interp: Runner, text: Text, rest: list[ExpandedWord], node: Simple, state: State, what: str
) -> None:
    child = state.copy()
    child.variables = {
        name: value for name in state.exported if isinstance(value := state.lookup(name), Text)
    }
    child.scopes, child.functions = [], {}
    if rest:
        child.zero = Text(rest[0].text, rest[0].offsets)
    child.positional = tuple(Text(w.text, w.offsets, w.missing) for w in rest[1:])
    with contextlib.suppress(Exit, Return, Break):
        interp.run_text(text, node.line, child, what)


def substitute(interp: Runner, part: Substitution, state: State) -> Value:
    """``$(...)``: its output where it runs only builtins on known values."""
    inner = state.copy()
    inner.output, inner.impure, inner.condition = [], None, None
    line = interp.line
    try:
        status = interp.run_text(Text.of(part.text), line, inner, "$(...)", reparsed=False)
    except Exit as exit_:
        status = exit_.status
    except (Return, Break, Uncertain):
        status = Unknown("control flow this reader does not follow")
        inner.impure = inner.impure or status.reason
    interp.substitution_status = status
    if inner.impure:
        return Unresolved(
            f"{clipped(part.source)} (runs {inner.impure}, whose output needs a real shell)"
        )
    output = Text("", ())
    for piece in inner.output or []:
        output += piece
    if output.unresolved:
        return Unresolved(f"{clipped(part.source)} prints {output.unresolved}")
    end = len(output.text.rstrip("\n"))
    return Text(output.text[:end], output.offsets[:end], output.missing)


def expand_heredoc(interp: Runner, node: Simple, state: State) -> None:
    """The command's here-document as it reaches the command: expanded first where its
    delimiter is not quoted (its ``$(...)`` run too, whatever reads the body), as bash does."""
    heredoc = node.heredoc
    if heredoc is None:
        interp.heredoc_body = None
    elif heredoc.quoted:
        interp.heredoc_body = ExpandedWord(heredoc.body, heredoc.line, (-1,) * len(heredoc.body))
    else:
        word = _as_double_quoted(heredoc.body, heredoc.line)
        interp.heredoc_body = expand_whole(word, interp.scope(state), holes=True)
