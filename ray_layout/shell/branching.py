"""Decisions the reader cannot make, or makes only by taking an unset variable as empty.

An outcome it does not know (a command's status, a file test) is followed both ways, each on its
own copy of the state; what they leave different is unresolved, and their commands run under that
condition.  A branch chosen by an unset variable is the one bash takes, but the others are read
too, so that what they would change carries the variable's name and a launch only they run is
refused naming it."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence

from ray_layout.shell.builtins import matches, whole_word
from ray_layout.shell.flow import Break, Exit, Return, Status, Uncertain, Unknown
from ray_layout.shell.runner import Runner
from ray_layout.shell.state import State, merge
from ray_layout.shell.syntax import Case, Commands, If


def decided(
    interp: Runner,
    body: Callable[[State], Status],
    decided: tuple[str, ...],
    state: State,
    alternatives: Sequence[Callable[[State], object]] = (),
) -> Status:
    """A branch chosen by unset variables taken as empty, as bash chooses it.  The branches
    another value would take are read too, on copies: whatever they would leave different
    carries the unset names (so that a value Megatron needs names them), and the commands
    they would run are kept apart (a launch only they run is refused, naming them)."""
    if not decided:
        return body(state)
    names = tuple(dict.fromkeys(state.decided_by + decided))
    before = state.copy()
    outer = state.decided_by
    state.decided_by = names
    try:
        status = body(state)
    finally:
        state.decided_by = outer
    shown = ", ".join(f"${n}" for n in names)
    for alternative in alternatives:
        copy = before.copy()
        copy.decided_by = names
        copy.condition = f"{shown} set (the script does not set {shown})"
        mark = len(interp.commands)
        with contextlib.suppress(Exit, Return, Break, Uncertain):
            alternative(copy)
        interp.untaken += interp.commands[mark:]
        del interp.commands[mark:]
        state.taint_differences(copy, names)
    return status


def branches(
    interp: Runner, bodies: list[Callable[[State], Status]], reason: str, state: State
) -> Status:
    """Follow every outcome of a decision the reader cannot make, each on its own copy;
    what they leave different is unresolved, their commands run under ``reason``."""
    finished: list[tuple[State, Status]] = []
    left: list[BaseException] = []
    for body in bodies:
        copy = state.copy()
        copy.condition = state.condition or reason
        try:
            finished.append((copy, body(copy)))
        except (Exit, Return, Break) as leaving:
            left.append(leaving)
    if not finished:
        raise left[0]
    if left and not all(isinstance(x, Exit) for x in left):
        raise Uncertain(f"{reason}: a return, break or continue there needs a real shell")
    merge(state, [copy for copy, _ in finished], reason)
    if left:
        why = left[0].why  # type: ignore[union-attr]
        state.condition = state.condition or f"{reason}, where the script may stop ({why})"
    statuses = {s for _, s in finished}
    return statuses.pop() if len(statuses) == 1 else Unknown(reason)


def case(interp: Runner, node: Case, state: State) -> Status:
    interp.step(node.line)
    subject = whole_word(interp, node.word, state)
    for position, (patterns, body) in enumerate(node.items):
        for pattern in patterns:
            matched = matches(interp, subject, pattern, state)
            if isinstance(matched, Unknown):
                rest = Case(node.word, node.items[position:], node.line)
                bodies = [lambda s, body=body: interp.sequence(body, s)] + [
                    (lambda s, b=b: interp.sequence(b, s)) for _, b in rest.items[1:]
                ]
                bodies.append(lambda s: 0)
                return branches(interp, bodies, matched.reason, state)
            if matched:
                others = [b for _, b in node.items if b is not body]
                return decided(
                    interp,
                    lambda s, body=body: interp.sequence(body, s),
                    subject.missing,
                    state,
                    [lambda s, b=b: interp.sequence(b, s) for b in others],
                )
    return 0


def if_command(interp: Runner, node: If, state: State) -> Status:
    for position, (condition, body) in enumerate(node.clauses):
        status, unset = test(interp, condition, state)
        if isinstance(status, Unknown):
            rest = [b for _, b in node.clauses[position + 1 :]]
            tail = If(node.clauses[position + 1 :], node.otherwise, node.line)
            bodies = [lambda s, body=body: interp.sequence(body, s)]
            bodies.append(
                (lambda s, tail=tail: if_command(interp, tail, s))
                if rest
                else (lambda s: interp.sequence(node.otherwise, s) if node.otherwise else 0)
            )
            return branches(interp, bodies, status.reason, state)
        if status == 0:
            others = [b for _, b in node.clauses if b is not body]
            others += [node.otherwise] if node.otherwise else []
            return decided(
                interp,
                lambda s, body=body: interp.sequence(body, s),
                unset,
                state,
                [lambda s, b=b: interp.sequence(b, s) for b in others],
            )
        if unset:
            taken_later = If(node.clauses[position + 1 :], node.otherwise, node.line)
            return decided(
                interp,
                lambda s, tail=taken_later: if_command(interp, tail, s),
                unset,
                state,
                [lambda s, body=body: interp.sequence(body, s)],
            )
    if node.otherwise is not None:
        return interp.sequence(node.otherwise, state)
    return 0


def test(interp: Runner, condition: Commands, state: State) -> tuple[Status, tuple[str, ...]]:
    """A condition's status, and the unset variables (taken as empty) that decided it."""
    before = len(interp.decided_by)
    interp.checking += 1
    try:
        status = sequence_unchecked(interp, condition, state)
    finally:
        interp.checking -= 1
    decided = tuple(dict.fromkeys(interp.decided_by[before:]))
    del interp.decided_by[before:]
    return status, decided


def sequence_unchecked(interp: Runner, commands: Commands, state: State) -> Status:
    """A condition's list: ``set -e`` does not apply to it."""
    status: Status = 0
    for node, _ in commands.items:
        status = interp.run(node, state)
    return status
