"""Real bash runs a real launch script with every external command stubbed, so nothing runs: the
argv each command would have got is recorded.  The dialect tests feed the launch's argv to the
reader, so that what Megatron's fork gets is judged by bash, not by the reader under test.

``command_not_found_handle`` records every command bash cannot find (PATH holds nothing); only
``mkdir`` of a folder inside the run's own temporary directory is done, so that a redirection to
a log file there (``&> $DIR/output/log/x.log``) does not stop the launch line."""

from __future__ import annotations

import shlex
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

_STUBS = """\
command_not_found_handle() {
  printf '%s\\0' "$@" >> "$RECORD"; printf '\\n' >> "$RECORD"; return 0
}
mkdir() {
  printf '%s\\0' mkdir "$@" >> "$RECORD"; printf '\\n' >> "$RECORD"
  local d; for d in "$@"; do case "$d" in "$PWD"/*) /bin/mkdir -p -- "$d";; esac; done
  return 0
}
"""


def recorded_commands(
    script_path: str | Path, args: Sequence[str] = (), env: Mapping[str, str] | None = None
) -> list[list[str]]:
    """Each external command the script runs, as its argv, in order (run in a fresh temporary
    directory with only ``env`` set, within 30 s)."""
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        stubs, record = work / "stubs.sh", work / "record"
        stubs.write_text(_STUBS)
        record.touch()
        run = work / "run"
        run.mkdir()
        environment = {"PATH": "/nonexistent", "RECORD": str(record), "BASH_ENV": str(stubs)}
        subprocess.run(
            ["/bin/bash", str(Path(script_path).resolve()), *args],
            env=environment | dict(env or {}),
            cwd=run,
            capture_output=True,
            timeout=30,
            check=False,
        )
        data = record.read_bytes().decode()
    return [line.split("\0") for line in data.split("\0\n") if line]


def launch_line(commands: Sequence[Sequence[str]]) -> str:
    """The recorded command that runs a Python entry point with ``--num-layers``, as one shell
    line (``shlex.join``): what the fork's Megatron gets, launcher words first."""
    launches = [c for c in commands if any(w.endswith(".py") for w in c) and "--num-layers" in c]
    assert len(launches) == 1, f"{len(launches)} launch commands recorded"
    return shlex.join(launches[0])
