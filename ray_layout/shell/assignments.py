"""Assignments as bash makes them: ``NAME=value``, ``NAME+=``, arrays and ``NAME[i]=``,
``declare``/``local``/``export``/``readonly`` with their options, integers (``declare -i``).
What the reader lacks inside a value stays a hole, named after the variable, for the user to
give with ``--env NAME=VALUE``; a value that grows past the bounds is refused."""

from __future__ import annotations

import re

from ray_layout.shell.expand import arithmetic_text, array_index, expand, expand_whole
from ray_layout.shell.flow import Status
from ray_layout.shell.runner import Runner
from ray_layout.shell.state import Scope, State
from ray_layout.shell.syntax import Simple, assignment_target, assignment_value
from ray_layout.shell.tokens import ArrayLiteral, Literal, Word
from ray_layout.shell.values import (
    GAP,
    MAX_ELEMENTS,
    MAX_VALUE_CHARS,
    ExpandedWord,
    Gap,
    Text,
    Unresolved,
    Value,
    elements,
    named_holes,
    unknown,
)


def assign(
    interp: Runner,
    token: Word | ArrayLiteral,
    state: State,
    *,
    export: bool,
    local: bool = False,
    integer: bool = False,
) -> None:
    target = assignment_target(token)
    assert target is not None
    name, index, append = target
    scope = interp.scope(state)
    if local and state.scopes and name not in state.scopes[-1]:
        state.scopes[-1][name] = state.lookup(name) if append else None
    value: Value
    if isinstance(token, ArrayLiteral):
        value = _array_value(token, scope)
    else:
        word = expand_whole(assignment_value(token), scope, holes=True)
        interp.check_nounset(scope, state, token.line)
        if word.unresolved and "\x01" in word.text:
            value = named_holes(Text(word.text, word.offsets, word.missing), name, token.line)
        elif word.unresolved:
            value = Unresolved(f"{name} (line {token.line}) = {word.unresolved}")
        else:
            value = Text(word.text, word.offsets, word.missing)
            if integer or name in state.integers:
                value = _integer(word.text, state, scope, name, append)
                append = False
    if state.decided_by and isinstance(value, Text):
        value = Text(
            value.text, value.offsets, tuple(dict.fromkeys(value.missing + state.decided_by))
        )
    old = state.lookup(name)
    if isinstance(scope.get(name), Unresolved) and name in interp.environment:
        old = scope.get(name)
    if index is not None:
        value = _element_assignment(old, index, value, append, scope, name)
    elif append and old is not None:
        value = _appended(old, value)
    elif isinstance(old, tuple) and isinstance(value, Text) and not isinstance(token, ArrayLiteral):
        value = (value, *old[1:])  # NAME=x on an array sets its first element
    if unknown(value) and name in interp.environment:
        value = Text.of(interp.environment[name])  # --env fills what the reader cannot follow
    _check_size(interp, value, token.line)
    state.store(name, value, token.line)
    if export:
        state.exported.setdefault(name, token.line)


def _array_value(token: ArrayLiteral, scope: Scope) -> Value:
    items: list[Text] = []
    for word in token.words:
        if re.match(r"\[[^\]]*\]\+?=", _leading(word)):
            return Unresolved(f"{token.name} (line {token.line}) = an array with explicit indices")
        for expanded in expand(word, scope):
            items.append(
                Text(expanded.text, expanded.offsets, expanded.missing, expanded.unresolved)
            )
    return tuple(items)


def _leading(word: Word) -> str:
    first = word.parts[0] if word.parts else None
    return first.text if isinstance(first, Literal) and not first.quoted else ""


def _integer(text: str, state: State, scope: Scope, name: str, append: bool) -> Value:
    expression = f"{name} + ({text})" if append else text
    return arithmetic_text(expression, scope, f"declare -i {name}")


def _element_assignment(
    old: Value | None, index: str, value: Value, append: bool, scope: Scope, name: str
) -> Value:
    if isinstance(old, Unresolved):
        return old
    if isinstance(value, Unresolved):
        return value
    items = list(old) if isinstance(old, tuple) else [old] if isinstance(old, Text) else []
    position = array_index(index, scope, f"{name}[{index}]")
    if isinstance(position, Unresolved):
        return Unresolved(f"{name}[{index}]: {position.reason}")
    position += len(items) if position < 0 else 0
    assert isinstance(value, Text)
    if position < 0:
        return Unresolved(f"{name}[{index}]: bad array subscript")
    items += [GAP] * (position + 1 - len(items))  # A[5]=x past the end leaves gaps, as in bash
    grown = items[position] + value if append and not isinstance(items[position], Gap) else value
    items[position] = grown
    return tuple(items)


def _appended(old: Value, value: Value) -> Value:
    if isinstance(old, Unresolved):
        return old
    if isinstance(value, Unresolved):
        return value
    if isinstance(old, Text) and isinstance(value, Text):
        return old + value
    if isinstance(value, Text):  # NAME+=x on an array appends to its first element
        first = elements(old)
        return ((first[0] + value), *first[1:]) if first else (value,)
    return (old if isinstance(old, tuple) else elements(old)) + elements(value)


def _check_size(interp: Runner, value: Value, line: int) -> None:
    if isinstance(value, tuple):
        if len(value) > MAX_ELEMENTS:
            raise interp.error(line, f"an array of more than {MAX_ELEMENTS:,} elements")
        size = sum(len(t.text) for t in value)
    else:
        size = len(value.text) if isinstance(value, Text) else 0
    if size > MAX_VALUE_CHARS:
        raise interp.error(line, f"a value of more than {MAX_VALUE_CHARS:,} characters")


def target_name(token: Word | ArrayLiteral) -> str | None:
    target = assignment_target(token)
    return target[0] if target else None


def prefix_word(token: Word, scope: Scope) -> ExpandedWord:
    """A ``NAME=value`` prefix of a command, as the word bash puts in its environment."""
    return expand_whole(token, scope)


def _attribute(name: str, options: str, line: int) -> Unresolved:
    return Unresolved(f"{name} -{options} (line {line}), an attribute this reader does not hold")


def declaration(interp: Runner, name: str, node: Simple, state: State) -> Status:
    """``export``/``declare``/``local``/``readonly``: their arguments are assignments, never
    split; ``-x`` exports, ``-i`` makes an integer, ``-A`` an associative array (not held)."""
    options = ""
    arguments = node.words[1:]
    for token in node.assignments:
        assign(interp, token, state, export=False)
    for token in arguments:
        if (
            isinstance(token, Word)
            and token.plain
            and token.plain[:1] in "-+"
            and len(token.plain) > 1
        ):
            options += token.plain[1:] if token.plain[0] == "-" else ""
            continue
        target = assignment_target(token)
        if target is not None and set(options) & set("lunc"):  # case or a name reference
            state.store(target[0], _attribute(name, options, node.line), node.line)
            continue
        if isinstance(token, Word) and target is None:
            for word in interp.words([token], state):
                if word.unresolved:
                    state.poison(f"{name} of {word.unresolved} (line {node.line})")
                elif set(options) & set("lunc"):
                    state.store(word.text, _attribute(name, options, node.line), node.line)
                elif "i" in options:
                    state.integers.add(word.text)
                elif name == "export" or "x" in options:
                    state.exported.setdefault(word.text, node.line)
                elif name == "local" and state.scopes and word.text not in state.scopes[-1]:
                    state.scopes[-1][word.text] = None
            continue
        target = assignment_target(token)
        if "A" in options and target is not None:
            state.store(
                target[0],
                Unresolved(f"{target[0]} (line {node.line}) = an associative array"),
                node.line,
            )
            continue
        local = name == "local" or (
            name in ("declare", "typeset") and state.scopes and "g" not in options
        )
        if "i" in options and target is not None:
            state.integers.add(target[0])
        assign(interp, token, state, export=name == "export" or "x" in options, local=bool(local))
    return 0
