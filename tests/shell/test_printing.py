"""What ``echo``, ``printf``, ``pwd``, ``dirname`` and ``basename`` print, as a command
substitution's output, judged by bash."""

from __future__ import annotations

import pytest

from ray_layout.shell.interpreter import run_script
from tests.helpers.shell_bash import bash_words, needs_bash, words


@needs_bash
@pytest.mark.parametrize(
    "substitution",
    [
        "$(echo -n a b)",
        "$(echo -e 'a\\tb')",
        "$(printf '%s-%03d' x 7)",
        "$(printf '%s,' a b c)",
        "$(dirname /a/b/c.sh)$(dirname c.sh)$(dirname /)$(dirname a/)",
        "$(basename /a/b/c.sh .sh)$(basename /a/b/)",
        "$(echo a; echo b)",
        '$(A=(1 2 3); IFS=,; echo "${A[*]}")',
    ],
)
def test_output_is_what_bash_prints(substitution):
    assert words(f'cmd "{substitution}"') == bash_words("", f'"{substitution}"')


def test_the_script_directory_idiom_needs_no_hint_and_pwd_alone_is_the_jobs():
    script = 'D=$(cd "$(dirname "$0")" && pwd)\nP=$(pwd)\ncmd "$D" "$P/x"'
    (command,) = run_script(script, "/opt/run/train.sh").commands
    assert command.argv == ("cmd", "/opt/run", "$(pwd)/x")
    assert "give --env PWD=DIR" in command.words[2].unresolved
    (given,) = run_script(script, "/opt/run/train.sh", {"PWD": "/w"}).commands
    assert given.argv == ("cmd", "/opt/run", "/w/x")
