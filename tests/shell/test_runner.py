"""The runner protocol is the interpreter as the modules that run one kind of command use it: the
interpreter has each member with the same signature, and those modules use those members and no
others."""

from __future__ import annotations

import inspect

import pytest

from ray_layout.shell import (
    assignments,
    branching,
    builtins,
    loops,
    nested,
    printing,
    simple,
)
from ray_layout.shell.interpreter import Interpreter
from ray_layout.shell.runner import Runner
from tests.helpers.protocol_use import attributes_used

HANDLERS = (assignments, branching, builtins, loops, nested, printing, simple)
METHODS = {
    name for name, member in vars(Runner).items() if inspect.isfunction(member) and name[0] != "_"
}
ATTRIBUTES = set(Runner.__annotations__)


def test_the_interpreter_has_every_member_with_its_signature():
    interpreter = Interpreter("t.sh", {}, None)
    assert set(vars(interpreter)) >= ATTRIBUTES
    for name in METHODS:
        expected = inspect.signature(getattr(Runner, name))
        assert inspect.signature(getattr(Interpreter, name)) == expected, name


@pytest.mark.parametrize("module", HANDLERS, ids=lambda m: m.__name__)
def test_each_handler_uses_only_what_the_protocol_names(module):
    assert attributes_used(module, "Runner") <= METHODS | ATTRIBUTES


def test_the_protocol_names_nothing_the_handlers_do_not_use():
    assert set().union(*(attributes_used(m, "Runner") for m in HANDLERS)) == METHODS | ATTRIBUTES
