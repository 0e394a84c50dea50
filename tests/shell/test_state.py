"""The state's rules: locals shadow globals, a poisoned state reads every unset name as
unresolved, merged outcomes keep what they agree on."""

from __future__ import annotations

from ray_layout.shell.state import State, merge
from ray_layout.shell.values import Text, Unresolved


def _state(**values: str) -> State:
    return State({k: Text.of(v) for k, v in values.items()}, (), Text.of("t.sh"))


def test_locals_shadow_globals_and_unwind():
    state = _state(X="global")
    state.scopes.append({"X": None})
    state.store("X", Text.of("local"), 1)
    assert state.lookup("X").text == "local"
    state.scopes.pop()
    assert state.lookup("X").text == "global"


def test_poison_makes_every_variable_and_the_arguments_unresolved():
    state = _state(A="1")
    state.poison("the eval at line 3")
    assert state.lookup("A") == Unresolved("the eval at line 3")
    assert state.positional == Unresolved("the eval at line 3")


def test_merge_keeps_agreement_and_unresolves_the_rest():
    state, one, other = _state(), _state(A="1", B="x"), _state(A="2", B="x")
    merge(state, [one, other], "line 4: a test")
    assert state.lookup("B").text == "x"
    assert state.lookup("A") == Unresolved("A is set under line 4: a test")
