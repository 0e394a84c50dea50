"""A Megatron-LM launch script (or command line, or model file) read the way bash and Megatron
would read it: which command runs ``pretrain_gpt.py``, the arguments it gets, and what the job's
environment must supply.

The launch command is the one that runs ``pretrain_gpt.py`` (``python``, ``torchrun``, ``srun``,
``python -m torch.distributed.run``, through ``nsys`` and the like), not a ``chmod`` of it, not
a command in a here-document.  A script whose command is kept in a variable for ``bash -c`` (a
Slurm wrapper's ``TRAINING_CMD``) is read through that variable.  A *model file* without any
command (slime's ``MODEL_ARGS=(...)``, Megatron-LM's modelopt ``conf/*.sh``) gives its arguments
from the variables that hold ``--num-layers``.  The script is read, never run
(``ray_layout.shell.script``).
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import PurePosixPath

from ray_layout.shell.expand import split
from ray_layout.shell.refusal import ShellError
from ray_layout.shell.script import (
    Command,
    ExpandedWord,
    ScriptReading,
    Text,
    Unresolved,
    read_script,
    words_of,
)

SCRIPT = "pretrain_gpt.py"
# Programs that run the script (or wrap the program that does).
_RUNNERS = frozenset(
    {
        "python",
        "python3",
        "torchrun",
        "srun",
        "mpirun",
        "mpiexec",
        "nsys",
        "ncu",
        "numactl",
        "taskset",
        "env",
        "nohup",
        "time",
        "exec",
        "uv",
        "deepspeed",
        "accelerate",
        "stdbuf",
        "chrt",
        "nice",
    }
)


@dataclass(frozen=True)
class LaunchReading:
    """What a script hands to Megatron: the launcher's words (torchrun and its flags), the
    script's arguments, the environment of every rank, and how it was found."""

    launcher: tuple[ExpandedWord, ...]
    arguments: tuple[ExpandedWord, ...]
    environment: tuple[tuple[str, str], ...]  # exports and the launch line's NAME=value
    unresolved_environment: tuple[str, ...]  # exported without a value the reader knows
    prefixed: tuple[str, ...]  # names the launch line itself sets (NAME=value torchrun ...)
    notes: tuple[str, ...]
    is_model_file: bool
    reparsed: bool = False  # the command is a variable's text that bash parses again (bash -c)


def read_launch(
    text: str, source: str, environment: Mapping[str, str] | None = None
) -> LaunchReading:
    """Find the launch command (or the model file's arguments) in ``text``."""
    reading = read_script(text, source, environment)
    notes = list(reading.notes)
    launch = _find(reading, source, notes)
    newlines = [i for i, char in enumerate(text) if char == "\n"]

    def placed(word: ExpandedWord) -> ExpandedWord:
        """The word on the line its first character was written on."""
        first = word.offsets[0] if word.offsets else -1
        return replace(word, line=bisect.bisect_left(newlines, first) + 1) if first >= 0 else word

    return replace(
        launch,
        launcher=tuple(map(placed, launch.launcher)),
        arguments=tuple(map(placed, launch.arguments)),
    )


def _find(reading: ScriptReading, source: str, notes: list[str]) -> LaunchReading:
    command = _launch_command(reading, source, notes)
    reparsed = any("held in $" in note for note in notes)
    if command is None:
        arguments = _model_file_arguments(reading, source, notes)
        return _reading(reading, (), arguments, (), notes, is_model_file=True)
    position = _script_position(command)
    if position is None:  # a bare argument list: every word is an argument
        return _reading(reading, (), command.words, command.environment, notes, False)
    launcher, arguments = command.words[:position], command.words[position + 1 :]
    found = _reading(reading, launcher, arguments, command.environment, notes, False)
    return replace(found, reparsed=reparsed)


def _reading(
    reading: ScriptReading,
    launcher: tuple[ExpandedWord, ...],
    arguments: tuple[ExpandedWord, ...],
    prefixes: tuple[tuple[str, ExpandedWord], ...],
    notes: list[str],
    is_model_file: bool,
) -> LaunchReading:
    exported: dict[str, str | None] = {}
    for name in reading.exported:
        value = reading.variables.get(name)
        plain = isinstance(value, Text) and not value.missing
        exported[name] = value.text if plain else None  # type: ignore[union-attr]
    for name, word in prefixes:
        exported[name] = (
            word.text.partition("=")[2] if not (word.unresolved or word.missing) else None
        )
    environment = tuple(sorted((k, v) for k, v in exported.items() if v is not None))
    unresolved = tuple(sorted(k for k, v in exported.items() if v is None))
    prefixed = tuple(name for name, _ in prefixes)
    return LaunchReading(
        launcher,
        arguments,
        environment,
        unresolved,
        prefixed,
        tuple(dict.fromkeys(notes)),
        is_model_file,
    )


def _runs_script(command: Command) -> bool:
    position = _script_position(command)
    if position is None or position == 0:
        return position == 0 and len(command.words) > 0 and _is_script(command.words[0].text)
    return PurePosixPath(command.words[0].text).name.startswith(tuple(_RUNNERS))


def _is_script(word: str) -> bool:
    return PurePosixPath(word).name == SCRIPT


def _script_position(command: Command) -> int | None:
    """Where ``pretrain_gpt.py`` is among the command's words (else None)."""
    return next((i for i, w in enumerate(command.words) if _is_script(w.text)), None)


def _launch_command(reading: ScriptReading, source: str, notes: list[str]) -> Command | None:
    """The command that runs ``pretrain_gpt.py``: one the script always runs, else one run under a
    condition (said in a note; two different ones are an error), else one kept in a variable
    for ``bash -c``; or a bare argument list (a command line given as text)."""
    runs = [c for c in reading.commands if _runs_script(c)]
    always = [c for c in runs if c.condition is None]
    if always:
        return always[0]
    if runs:
        if len({tuple(w.text for w in c.words) for c in runs}) > 1:
            lines = ", ".join(str(c.line) for c in runs)
            raise ShellError(
                f"{source}: {SCRIPT} runs under conditions this reader cannot decide (lines "
                f"{lines}; {runs[0].condition}): give the variables they test with --env"
            )
        notes.append(f"{source}:{runs[0].line}: the launch command runs under {runs[0].condition}")
        return runs[0]
    for name, value in reading.variables.items():
        if isinstance(value, Text) and SCRIPT in value.text:
            line = next((c.line for c in reading.commands), 1)
            held = [c for c in words_of(value, line, source) if _runs_script(c)]
            if held:
                notes.append(f"{source}: the launch command is the one held in ${name}")
                return held[0]
    bare = [c for c in reading.commands if c.words and c.words[0].text.startswith("--")]
    if bare:
        return Command(tuple(w for c in bare for w in c.words), (), bare[0].line, None)
    return None


def _model_file_arguments(
    reading: ScriptReading, source: str, notes: list[str]
) -> tuple[ExpandedWord, ...]:
    """A model file's arguments: every variable whose words hold ``--num-layers``."""
    arguments: list[ExpandedWord] = []
    names = []
    for name, value in reading.variables.items():
        if isinstance(value, Unresolved) and "--num-layers" in value.reason:
            raise ShellError(f"{source}: {value.reason}")
        words = _words_of_value(value)
        if any(w.text == "--num-layers" for w in words):
            line = reading.lines.get(name, 1)
            arguments += [replace(w, line=line) for w in words]
            names.append(name)
    if not names:
        unresolved = [v.reason for v in reading.variables.values() if isinstance(v, Unresolved)]
        hint = f" ({unresolved[0]})" if unresolved else ""
        raise ShellError(
            f"{source}: no command runs {SCRIPT} and no variable holds --num-layers{hint}"
        )
    held = ", ".join(f"${n}" for n in names)
    notes.append(
        f"{source}: read as a model file: its arguments are {held} (no command runs {SCRIPT})"
    )
    return tuple(arguments)


def _words_of_value(value: object) -> list[ExpandedWord]:
    """A variable's words as ``${NAME[@]}`` (an array) or ``$NAME`` (a string) would give them."""
    if isinstance(value, Unresolved):
        return []
    texts = value if isinstance(value, tuple) else split(value)  # type: ignore[arg-type]
    return [ExpandedWord(t.text, 0, t.offsets, t.unresolved, t.missing) for t in texts]
