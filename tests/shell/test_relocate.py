"""Text run again (``eval``, ``bash -c``) is placed back where the script wrote it: a launch
found inside keeps each character's offset in the script, for the rewrite."""

from __future__ import annotations

from ray_layout.shell.interpreter import run_script
from ray_layout.shell.lexer import tokenize
from ray_layout.shell.relocate import Placement, placed


def test_literal_characters_map_back_into_the_script():
    (word,) = tokenize("ab", "x")
    moved = placed(word, Placement((40, 41), 7))
    assert moved.parts[0].offsets == (40, 41) and moved.line == 7


def test_an_evaled_launch_points_at_the_scripts_own_characters():
    script = 'CMD="torchrun x.py --num-layers 4"\neval "$CMD"\n'
    (command,) = run_script(script, "t.sh").commands
    layers = command.words[-1]
    assert script[layers.offsets[0]] == "4" and command.reparsed and command.line == 2
