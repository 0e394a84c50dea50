"""``exit``, ``return``, ``break``/``continue`` leave where bash leaves, levels counted."""

from __future__ import annotations

from ray_layout.shell.flow import Unknown
from ray_layout.shell.interpreter import run_script
from tests.helpers.shell_bash import bash_words, needs_bash, words


@needs_bash
def test_control_leaves_where_bash_leaves():
    setup = (
        "f() { A+=(f); return 3; A+=(never); }\nf; S=$?\n"
        "for i in 1 2 3; do for j in a b; do [ $j = b ] && continue 2; A+=($i$j); done; done\n"
        "for i in 1 2 3; do [ $i = 2 ] && break; A+=(x$i); done\n"
    )
    assert words(setup + 'cmd "${A[@]}"') == bash_words(setup, '"${A[@]}"')


def test_exit_stops_the_script_and_says_where():
    run = run_script("cmd a\nexit 3\ncmd b\n", "t.sh")
    assert [c.argv for c in run.commands] == [("cmd", "a")] and run.stopped == "line 2: exit 3"
    assert Unknown("why").reason == "why"
