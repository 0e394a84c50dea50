"""What a run records: each external command with its words, environment prefixes and the
condition it runs under, in the order bash runs them."""

from __future__ import annotations

from ray_layout.shell.interpreter import run_script


def test_commands_are_recorded_in_order_with_their_conditions():
    run = run_script("A=1 mkdir -p x\n[ -f y ] && touch y\necho hi\nls $Z\n", "t.sh")
    assert [c.argv for c in run.commands] == [("mkdir", "-p", "x"), ("touch", "y"), ("ls",)]
    assert run.commands[-1].words[1].vanishes  # kept as written, for a flag's value
    assert [n for n, _ in run.commands[0].environment] == ["A"]
    assert run.commands[0].condition is None and "file system" in run.commands[1].condition
    assert run.taken_as_empty == ("Z",) and run.stopped is None
