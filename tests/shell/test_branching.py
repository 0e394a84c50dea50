"""Decisions: an outcome the reader lacks is followed both ways, what differs unresolved; a
branch chosen by an unset variable is bash's, and what another value would change names it."""

from __future__ import annotations

from ray_layout.shell.interpreter import run_script
from ray_layout.shell.values import Text, Unresolved


def test_an_unknown_outcome_follows_both_ways():
    run = run_script("if cmd-a; then A=1; B=same; else A=2; B=same; fi", "t.sh")
    assert isinstance(run.variables["A"], Unresolved) and run.variables["B"].text == "same"
    run = run_script("mkdir x || exit 1\ncmd after", "t.sh")
    assert "where the script may stop (line 1: exit 1)" in run.commands[-1].condition


def test_an_unset_variable_chooses_bashs_branch_and_taints_what_others_would_change():
    run = run_script('case "$MODE" in big) L=64;; *) L=2;; esac\nK=keep', "t.sh")
    assert run.variables["L"] == Text("2", run.variables["L"].offsets, ("MODE",))
    assert run.variables["K"].missing == ()
    run = run_script('[ -n "$DEBUG" ] && cmd debug-run\ncmd always', "t.sh")
    assert [c.argv for c in run.commands] == [("cmd", "always")]
    assert [c.argv for c in run.untaken] == [("cmd", "debug-run")]
