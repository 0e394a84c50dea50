"""Loops as bash runs them (judged by bash), and loops the reader cannot count: read once,
what they set unresolved."""

from __future__ import annotations

import pytest

from ray_layout.shell.interpreter import run_script
from ray_layout.shell.values import Unresolved
from tests.helpers.shell_bash import bash_words, needs_bash, variable, words


@needs_bash
@pytest.mark.parametrize(
    "setup",
    [
        "for x in a 'b c' d; do A+=(\"$x\"); done",
        "set -- p q; for x; do A+=($x$x); done",
        "for ((i = 3; i > 0; i--)); do A+=($i); done",
        "i=0; while [ $i -lt 3 ]; do A+=(w$i); i=$((i + 1)); done",
        "i=0; until (( i == 2 )); do A+=(u$i); (( i++ )); done",
        "for f in 1 2; do for g in x y; do [ $g = y ] && break 2; A+=($f$g); done; done",
        "A=(--num-layers 8); for i in 1 2 3; do A+=(--x$i); done",
    ],
)
def test_loops_give_what_bash_gives(setup):
    assert words(f'{setup}\ncmd "${{A[@]}}"') == bash_words(setup, '"${A[@]}"')


def test_a_loop_the_reader_cannot_count_leaves_what_it_sets_unresolved():
    value = variable("L=2\nfor f in $(ls); do L=$((L + 1)); done", "L")
    assert isinstance(value, Unresolved) and "a for loop at line 2 over $(ls)" in value.reason
    run = run_script("while [ -f /tmp/x ]; do cmd in-loop; done\ncmd after", "t.sh")
    assert [c.condition is None for c in run.commands] == [False, True]
