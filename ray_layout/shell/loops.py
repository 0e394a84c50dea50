"""Loops as bash runs them: ``for`` over words (and ``"$@"``), C-style ``for (( ))``,
``while``/``until``, with ``break``/``continue`` levels.  A loop whose passes the reader cannot
count (words or a condition it lacks) is read once for the commands in it, and whatever it may
set is unresolved."""

from __future__ import annotations

import contextlib

from ray_layout.shell import branching
from ray_layout.shell.builtins import arithmetic_status
from ray_layout.shell.flow import Break, Exit, Return, Status, Uncertain, Unknown
from ray_layout.shell.runner import Runner
from ray_layout.shell.state import State
from ray_layout.shell.syntax import ArithmeticFor, Commands, For, While
from ray_layout.shell.values import ExpandedWord, Text, Unresolved, elements


def loop(interp: Runner, node: For | ArithmeticFor | While, state: State) -> Status:
    interp.loops += 1
    try:
        return iterate(interp, node, state)
    except Uncertain as uncertain:
        unknown_body(interp, node.body, state, f"a loop at line {node.line} ({uncertain.reason})")
        return Unknown(uncertain.reason)
    finally:
        interp.loops -= 1


def iterate(interp: Runner, node: For | ArithmeticFor | While, state: State) -> Status:
    if isinstance(node, For):
        return for_words(interp, node, state)
    if isinstance(node, ArithmeticFor):
        return arithmetic_for(interp, node, state)
    return while_loop(interp, node, state)


def body_once(interp: Runner, node: Commands, state: State) -> str | None:
    """One pass of a loop's body: None to go on, "break" to leave the loop."""
    try:
        interp.sequence(node, state)
    except Break as leaving:
        if leaving.levels > 1:
            raise Break(leaving.levels - 1, leaving.again) from None
        return None if leaving.again else "break"
    return None


def for_words(interp: Runner, node: For, state: State) -> Status:
    interp.step(node.line)
    if node.words is None:
        values = interp.scope(state).get("@")
        items: list[ExpandedWord] | Unresolved = (
            values
            if isinstance(values, Unresolved)
            else [ExpandedWord(t.text, node.line, t.offsets) for t in elements(values or ())]
        )
    else:
        items = interp.words(node.words, state)
    unknown = (
        items.reason
        if isinstance(items, Unresolved)
        else next((w.unresolved for w in items if w.unresolved), None)
    )
    if unknown is not None:
        what = f"a for loop at line {node.line} over {unknown}"
        unknown_body(interp, node.body, state, what, node.name)
        return Unknown(what)
    for item in items:  # type: ignore[union-attr]
        interp.step(node.line)
        value = Text(item.text, item.offsets, item.missing)
        state.store(node.name, value, node.line)
        if body_once(interp, node.body, state) == "break":
            break
    return 0


def arithmetic_for(interp: Runner, node: ArithmeticFor, state: State) -> Status:
    arithmetic_status(interp, node.start, node.line, state, allow_empty=True)
    while True:
        interp.step(node.line)
        status = arithmetic_status(interp, node.condition, node.line, state, allow_empty=True)
        if isinstance(status, Unknown):
            unknown_body(interp, node.body, state, f"a for loop at line {node.line}")
            return status
        if status != 0 or body_once(interp, node.body, state) == "break":
            return 0
        arithmetic_status(interp, node.step, node.line, state, allow_empty=True)


def while_loop(interp: Runner, node: While, state: State) -> Status:
    while True:
        interp.step(node.line)
        status, decided = branching.test(interp, node.condition, state)
        if isinstance(status, Unknown):
            what = f"a while loop at line {node.line} on {status.reason}"
            unknown_body(interp, node.body, state, what)
            return Unknown(what)
        if (status == 0) == node.until:
            return 0
        done = branching.decided(
            interp, lambda s: body_once(interp, node.body, s) == "break", decided, state
        )
        if done:
            return 0


def unknown_body(
    interp: Runner, body: Commands, state: State, reason: str, variable: str | None = None
) -> None:
    """A loop whose passes the reader cannot count: its body is read once for the commands
    in it (conditional), and whatever it may set is unresolved."""
    copy = state.copy()
    copy.condition = state.condition or reason
    if variable is not None:
        copy.store(variable, Unresolved(f"${variable} of {reason}"), 0)
    with contextlib.suppress(Exit, Return, Break, Uncertain):
        interp.sequence(body, copy)
    state.unresolve_changes(copy, reason)
    if variable is not None:
        state.store(variable, Unresolved(f"${variable} of {reason}"), 0)
