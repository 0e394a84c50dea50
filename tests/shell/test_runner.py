"""The runner protocol is the interpreter as the modules that run one kind of command use it: the
interpreter has each member with the same signature, and those modules use those members and no
others."""

from __future__ import annotations

import ast
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


def _used(module) -> set[str]:
    """The attributes a module reads or sets of each parameter annotated ``Runner``."""
    tree = ast.parse(inspect.getsource(module))
    names = {
        arg.arg
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef)
        for arg in node.args.args
        if isinstance(arg.annotation, ast.Name) and arg.annotation.id == "Runner"
    }
    return {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id in names
    }


@pytest.mark.parametrize("module", HANDLERS, ids=lambda m: m.__name__)
def test_each_handler_uses_only_what_the_protocol_names(module):
    assert _used(module) <= METHODS | ATTRIBUTES


def test_the_protocol_names_nothing_the_handlers_do_not_use():
    assert set().union(*map(_used, HANDLERS)) == METHODS | ATTRIBUTES
