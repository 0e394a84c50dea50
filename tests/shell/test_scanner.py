"""The scanner protocol is the lexer as ``heredocs`` and ``parameters`` use it: the lexer has each
member with the same signature, and the readers use those members and no others."""

from __future__ import annotations

import inspect

from ray_layout.shell import heredocs, parameters
from ray_layout.shell.lexer import Lexer
from ray_layout.shell.scanner import Scanner
from tests.helpers.protocol_use import attributes_used

METHODS = {
    name for name, member in vars(Scanner).items() if inspect.isfunction(member) and name[0] != "_"
}
ATTRIBUTES = set(Scanner.__annotations__)


def test_the_lexer_has_every_member_with_its_signature():
    lexer = Lexer("cat <<EOF\nx\nEOF\n", "t.sh")
    assert set(vars(lexer)) >= ATTRIBUTES
    for name in METHODS:
        assert inspect.signature(getattr(Lexer, name)) == inspect.signature(getattr(Scanner, name))


def test_the_readers_use_exactly_what_the_protocol_names():
    used = attributes_used(heredocs, "Scanner") | attributes_used(parameters, "Scanner")
    assert used == METHODS | ATTRIBUTES
