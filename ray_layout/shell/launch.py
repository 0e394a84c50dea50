"""A Megatron launch script (or command line, or model file) read the way bash would run it: the
command that runs the training entry point, the words it gets, and what the job's environment
must supply.

The launch is the external command that runs a Python file followed by Megatron's model flags
(``--num-layers``, ``--hidden-size``...): ``torchrun``, ``python -m torch.distributed.run``,
``python``, ``srun``, ``mpirun``, ``deepspeed``, ``ray job submit ... -- python3 train.py``,
through ``bash -c "$CMD"`` or an ``eval`` of known words; the entry point is any such file
(``pretrain_gpt.py``, Pai's ``pretrain_deepseek.py``, slime's ``train.py``).  A ``chmod`` of
it runs no training.  Two different launches that may both run are an error naming both lines.
A *model file* runs no command at all (slime's ``MODEL_ARGS=(...)``, modelopt's ``conf/*.sh``):
its arguments are the variables that hold ``--num-layers``.  A file that runs commands but no
launch is refused, naming what it runs.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import PurePosixPath

from ray_layout.errors import clipped
from ray_layout.shell.interpreter import FileReader, run_script
from ray_layout.shell.recorded import Command, ScriptRun
from ray_layout.shell.refusal import ShellError
from ray_layout.shell.values import ExpandedWord, Text, Unresolved, split

# Flags that only a training run's command line holds: one of them after a .py file makes the
# command the launch; a model file's arguments are the variables that hold --num-layers.
MODEL_FLAGS = frozenset(
    {
        "--num-layers",
        "--hidden-size",
        "--num-attention-heads",
        "--ffn-hidden-size",
        "--seq-length",
        "--micro-batch-size",
        "--global-batch-size",
        "--train-iters",
        "--hybrid-layer-pattern",
    }
)


@dataclass(frozen=True)
class LaunchReading:
    """What a script hands to Megatron: the launcher's words (torchrun and its flags), the entry
    point, the script's arguments, the environment of every rank, and how it was found."""

    launcher: tuple[ExpandedWord, ...]
    entry: ExpandedWord | None
    arguments: tuple[ExpandedWord, ...]
    environment: tuple[tuple[str, str], ...]  # exports and the launch line's NAME=value
    unresolved_environment: tuple[str, ...]  # exported without a value the reader knows
    prefixed: tuple[str, ...]  # names the launch line itself sets (NAME=value torchrun ...)
    notes: tuple[str, ...]
    is_model_file: bool
    reparsed: bool = False  # the command is text that bash parses again (eval, bash -c)
    taken_as_empty: tuple[str, ...] = ()  # variables never set that expanded to nothing

    @property
    def argv(self) -> tuple[str, ...]:
        entry = (self.entry,) if self.entry is not None else ()
        words = (*self.launcher, *entry, *self.arguments)
        return tuple(w.text for w in words if not w.vanishes)


def read_launch(
    text: str,
    source: str,
    environment: Mapping[str, str] | None = None,
    arguments: Sequence[str] | None = None,
    read_file: FileReader | None = None,
) -> LaunchReading:
    """Find the launch command (or the model file's arguments) in ``text``."""
    run = run_script(text, source, environment, arguments, read_file)
    notes = list(run.notes)
    launch = _find(run, source, notes)
    newlines = [i for i, char in enumerate(text) if char == "\n"]

    def placed(word: ExpandedWord) -> ExpandedWord:
        """The word on the line its first character was written on."""
        first = word.offsets[0] if word.offsets else -1
        return replace(word, line=bisect.bisect_left(newlines, first) + 1) if first >= 0 else word

    if run.taken_as_empty:
        names = ", ".join(f"${n}" for n in run.taken_as_empty)
        notes.append(f"{source}: taken as empty, as bash does (never set): {names}")
    return replace(
        launch,
        launcher=tuple(map(placed, launch.launcher)),
        entry=placed(launch.entry) if launch.entry is not None else None,
        arguments=tuple(map(placed, launch.arguments)),
        notes=tuple(dict.fromkeys(notes)),
        taken_as_empty=run.taken_as_empty,
    )


def _find(run: ScriptRun, source: str, notes: list[str]) -> LaunchReading:
    command = _launch_command(run, source, notes)
    if command is None:
        bare = [c for c in run.commands if c.words and c.words[0].text.startswith("--")]
        if bare:  # a command line given as text: its words are the arguments
            words = tuple(w for c in bare for w in c.words)
            return _reading(run, (), None, words, (), notes, is_model_file=False)
        arguments = _model_file_arguments(run, source, notes)
        return _reading(run, (), None, arguments, (), notes, is_model_file=True)
    position = _entry_position(command)
    assert position is not None
    found = _reading(
        run,
        command.words[:position],
        command.words[position],
        command.words[position + 1 :],
        command.environment,
        notes,
        is_model_file=False,
    )
    return replace(found, reparsed=command.reparsed)


def _reading(
    run: ScriptRun,
    launcher: tuple[ExpandedWord, ...],
    entry: ExpandedWord | None,
    arguments: tuple[ExpandedWord, ...],
    prefixes: tuple[tuple[str, ExpandedWord], ...],
    notes: list[str],
    is_model_file: bool,
) -> LaunchReading:
    exported: dict[str, str | None] = {}
    for name in run.exported:
        value = run.variables.get(name)
        plain = isinstance(value, Text) and not value.missing and not value.unresolved
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
        entry,
        arguments,
        environment,
        unresolved,
        prefixed,
        tuple(dict.fromkeys(notes)),
        is_model_file,
    )


def _entry_position(command: Command) -> int | None:
    """Where the Python entry point is among the command's words, when Megatron's model flags
    (or words the reader does not know, which may hold them) follow it."""
    for index, word in enumerate(command.words):
        if PurePosixPath(word.text).suffix == ".py":  # its folder may be the job's ($(pwd))
            after = command.words[index + 1 :]
            if any(w.text.partition("=")[0] in MODEL_FLAGS or w.unresolved for w in after):
                return index
            return None
    return None


def _launch_command(run: ScriptRun, source: str, notes: list[str]) -> Command | None:
    """The command that runs the training entry point; two different ones that may both run,
    or one that another value of an unset variable would change, are errors naming both lines."""
    launches = [c for c in run.commands if _entry_position(c) is not None]
    untaken = [c for c in run.untaken if _entry_position(c) is not None]
    distinct: dict[tuple[str, ...], Command] = {}
    for command in launches:
        distinct.setdefault(command.argv, command)
    if len(distinct) > 1:
        first, second = list(distinct.values())[:2]
        why = next((c.condition for c in (first, second) if c.condition), None)
        decided = f" ({why}: give what decides it with --env)" if why else ""
        raise ShellError(
            f"{source}: two different launch commands may both run, at line {first.line} and "
            f"line {second.line}{decided}"
        )
    other = next((c for c in untaken if c.argv not in distinct), None)
    if other is not None:
        taken = next(iter(distinct.values()), None)
        which = f"the one at line {taken.line} runs" if taken else "none runs"
        raise ShellError(
            f"{source}:{other.line}: this launch runs only with {other.condition}; {which} "
            "as the script stands: give the variable with --env"
        )
    if not distinct:
        return None
    command = next(iter(distinct.values()))
    if command.condition is not None:
        notes.append(f"{source}:{command.line}: the launch command runs under {command.condition}")
    if command.reparsed:
        notes.append(
            f"{source}:{command.line}: the launch command is text run again (eval, bash -c)"
        )
    return command


def _model_file_arguments(
    run: ScriptRun, source: str, notes: list[str]
) -> tuple[ExpandedWord, ...]:
    """A model file's arguments: every variable whose words hold ``--num-layers`` (or the
    hybrid pattern that stands for it)."""
    if run.stopped:
        raise ShellError(f"{source}: the script stops before any launch: {run.stopped}")
    scripts = [c for c in run.commands if _runs_another_script(c)]
    if scripts:
        shown = " ".join(w.text for w in scripts[0].words)
        raise ShellError(
            f"{source}:{scripts[0].line}: no launch here; it runs another script "
            f"({clipped(shown, 60)}): give that script, with the environment this line sets"
        )
    ran_commands = [c for c in run.commands if not c.captured]
    if ran_commands:
        ran = ", ".join(f"{clipped(c.words[0].text, 24)} (line {c.line})" for c in ran_commands[:3])
        raise ShellError(
            f"{source}: no command runs a Python entry point with Megatron's flags (it runs {ran})"
        )
    arguments: list[ExpandedWord] = []
    names = []
    for name, value in run.variables.items():
        if isinstance(value, Unresolved) and "--num-layers" in value.reason:
            raise ShellError(f"{source}: {value.reason}")
        words = _words_of_value(value)
        if any(w.text in ("--num-layers", "--hybrid-layer-pattern") for w in words):
            line = run.lines.get(name, 1)
            arguments += [replace(w, line=line) for w in words]
            names.append(name)
    if not names:
        unknown = {n: v.reason for n, v in run.variables.items() if isinstance(v, Unresolved)}
        names = ", ".join(f"${n}" for n in unknown)
        hint = f" ({names} may hold it: {next(iter(unknown.values()))})" if unknown else ""
        raise ShellError(
            f"{source}: no command runs a Python entry point and no variable holds "
            f"--num-layers{hint}"
        )
    held = ", ".join(f"${n}" for n in names)
    notes.append(f"{source}: read as a model file: its arguments are {held} (it runs no command)")
    return tuple(arguments)


def _runs_another_script(command: Command) -> bool:
    """``bash ./other.sh``, ``sbatch job.sh``, ``./other.sh``: the launch may be in there."""
    return any(w.text.endswith(".sh") for w in command.words)


def _words_of_value(value: object) -> list[ExpandedWord]:
    """A variable's words as ``${NAME[@]}`` (an array) or ``$NAME`` (a string) would give them."""
    if isinstance(value, Unresolved):
        return []
    texts = value if isinstance(value, tuple) else split(value)  # type: ignore[arg-type]
    return [ExpandedWord(t.text, 0, t.offsets, t.unresolved, t.missing) for t in texts]
