"""A simple command as bash runs it: its words expanded, bare assignments kept, a declaration's
arguments read as assignments, ``NAME=value`` prefixes set for the command alone (in the shell
itself while a function or builtin runs), and a function called with its own arguments and
locals."""

from __future__ import annotations

from ray_layout.shell import assignments, builtins, nested
from ray_layout.shell.flow import Return, Status, Uncertain
from ray_layout.shell.runner import Runner
from ray_layout.shell.state import State
from ray_layout.shell.syntax import DECLARATIONS, FunctionDefinition, Simple
from ray_layout.shell.tokens import Word
from ray_layout.shell.values import ExpandedWord, Text


def run_simple(interp: Runner, node: Simple, state: State) -> Status:
    interp.step(node.line)
    interp.line = node.line
    nested.expand_heredoc(interp, node, state)
    plain = [w for w in node.words if isinstance(w, Word)]
    interp.substitution_status = 0
    first = interp.words(plain[:1], state) if plain else []  # expanded once: $(...) runs once
    name = first[0].text if first and not first[0].unknown else None
    if name in DECLARATIONS:
        return assignments.declaration(interp, name, node, state)
    words = first + interp.words(plain[1:], state)
    while words and words[0].vanishes:  # `$PROFILER torchrun ...` with PROFILER unset
        words.pop(0)
    if not words:  # bare assignments (or a command expanded to nothing): they stay
        for token in node.assignments:
            assignments.assign(interp, token, state, export=False)
        return interp.substitution_status  # $? of X=$(cmd) is cmd's
    if node.assignments and runs_here(interp, words, state):
        return with_prefixes(interp, words, node, state)
    return interp.command(words, node, state)


def runs_here(interp: Runner, words: list[ExpandedWord], state: State) -> bool:
    """Whether the command runs in this shell (a function or a builtin), so that its
    ``NAME=value`` prefixes are the shell's variables while it runs."""
    name = words[0].text
    return not words[0].unknown and (name in state.functions or name in builtins.BUILTINS)


def with_prefixes(interp: Runner, words: list[ExpandedWord], node: Simple, state: State) -> Status:
    """``X=1 f``: X holds 1 while the function or builtin runs, then what it held."""
    saved = {}
    for token in node.assignments:
        target = assignments.target_name(token)
        if target is not None and target not in saved:
            saved[target] = (state.lookup(target), state.exported.get(target))
        assignments.assign(interp, token, state, export=True)
    try:
        return interp.command(words, node, state)
    finally:
        for target, (value, exported) in saved.items():
            if value is None:
                state.remove(target)
            else:
                state.store(target, value, node.line)
            if exported is None:
                state.exported.pop(target, None)


def call(
    interp: Runner, function: FunctionDefinition, words: list[ExpandedWord], state: State
) -> Status:
    saved, given = state.positional, state.arguments_given
    state.arguments_given = True  # a function's own arguments are its words
    interp.enter(function.line, f"function {function.name}")
    state.positional = tuple(Text(w.text, w.offsets, w.missing) for w in words[1:])
    state.scopes.append({})
    state.function_names.insert(0, function.name)
    interp.frames += 1
    try:
        return interp.run(function.body, state)
    except Return as returned:
        return returned.status
    except Uncertain as uncertain:
        raise Uncertain(f"function {function.name}: {uncertain.reason}") from None
    finally:
        interp.frames -= 1
        state.function_names.pop(0)
        state.scopes.pop()
        state.positional, state.arguments_given = saved, given
        interp.depth -= 1
