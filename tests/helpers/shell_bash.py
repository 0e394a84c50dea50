"""The bash reader's view of a script, and real bash's: the oracle the reader's modules answer to.

Bash runs with an argument list (never through a shell of Python's), with an environment of
``PATH`` and the given variables only, and with pathname expansion off (``set -f``), since the
reader never globs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence

import pytest

from ray_layout.shell.interpreter import run_script
from ray_layout.shell.values import Text

BASH = shutil.which("bash")
needs_bash = pytest.mark.skipif(BASH is None, reason="no bash on this machine to judge by")


def words(script: str, **environment: str) -> list[str]:
    """The words of the script's last command, as the reader expands them."""
    reading = run_script(script, "t.sh", environment)
    return [w.text for w in reading.commands[-1].words]


def variable(script: str, name: str, **environment: str) -> object:
    """What the script leaves in ``name``: its text, an array's texts, or the reader's value."""
    value = run_script(script, "t.sh", environment).variables.get(name)
    if isinstance(value, Text):
        return value.text
    if isinstance(value, tuple):
        return [t.text for t in value]
    return value


def _bash(
    script: str, arguments: Sequence[str] = (), variables: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    path = os.environ.get("PATH", "/usr/bin:/bin")
    environment = {"PATH": path, "LC_ALL": "C", **(variables or {})}
    done = subprocess.run(
        [BASH or "bash", "-c", "set -f\n" + script, "bash", *arguments],
        capture_output=True,
        env=environment,
        timeout=10,
        check=False,
    )
    # decoded by hand: text=True would turn a "\r" that bash printed into "\n"; an undecodable
    # byte is held as Python's argv holds it, which is what a launched Megatron reads
    out, err = (data.decode(errors="surrogateescape") for data in (done.stdout, done.stderr))
    return subprocess.CompletedProcess(done.args, done.returncode, out, err)


def bash_words(setup: str, command: str) -> list[str]:
    """The words bash passes to ``cmd COMMAND`` after running ``setup`` (``cmd`` first)."""
    done = _bash(f"{setup}\nprintf '%s\\0' cmd {command}")
    assert done.returncode == 0, done.stderr
    return done.stdout.split("\0")[:-1]


def bash_arithmetic(expression: str, variables: Mapping[str, str] | None = None) -> int | None:
    """``$((expression))`` in bash with ``variables`` set; None where bash refuses it.  The
    expression is script text (so that its ``$NAME`` expands): a test's own, never a user's."""
    done = _bash(f'echo "$(({expression}))"', (), variables)
    return int(done.stdout) if done.returncode == 0 else None


def bash_printf(template: str, arguments: Sequence[str]) -> str | None:
    """``printf -v F template arguments...`` in bash: F; None where bash reports an error."""
    done = _bash('printf -v F -- "$@" && printf %s "$F"', [template, *arguments])
    return done.stdout if done.returncode == 0 and not done.stderr else None


def bash_test(operands: Sequence[str]) -> bool | None:
    """``test operands...`` in bash: its answer, or None where it is not a valid expression."""
    return {0: True, 1: False}.get(_bash('test "$@"', operands).returncode)
