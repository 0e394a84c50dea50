"""Real bash as the judge of the shell reader: run a script as bash runs it, with every external
command replaced by a stub that records its argv, and hand back what was recorded.

How bash runs here (never through a shell of Python's, argument lists only):

- ``env -i``: the environment holds the given variables and the oracle's own (``PATH``,
  ``BASH_ENV``, ``ORACLE_*``) and nothing else; the working folder is an empty temporary one;
  stdin is ``/dev/null``; a 10 s limit (the whole process group is killed past it) and a 4 GiB
  address-space limit.
- ``PATH`` is an empty folder, so no program is ever found: bash calls
  ``command_not_found_handle``, defined in the ``BASH_ENV`` file, which appends the command's argv
  to the record (``COUNT\\0ARG\\0...ARG\\0``) and returns 0.  Builtins and the script's functions
  run as bash runs them.
- A few commands are given their real behaviour, since scripts compute with them:
  ``dirname``/``basename``/``realpath``/``readlink`` are functions that record their argv and call
  the real program by its absolute path (``pwd`` is a bash builtin already);
  ``bash``/``sh`` with ``-c TEXT`` run the real bash on TEXT with the remaining arguments (a Slurm
  wrapper's ``bash -c "$CMD"`` records the inner command too); ``sbatch`` without a script
  argument runs the script on its stdin (a here-document) with bash, ``sbatch --wrap=CMD`` runs
  CMD; ``srun`` runs the command after its options (one task: the training command is recorded
  once); ``exec CMD`` runs CMD and exits with its status (bash's own ``exec`` would not call the
  handler for a command it cannot find); ``mkdir`` records its argv and creates the folders that
  lie inside the oracle's temporary folder (a log redirected into ``$(pwd)/output/log`` must be
  writable, as on the user's machine), nothing elsewhere; a command at the end of a pipe reads
  what it is handed (``tee`` passes it on), so that the writer is not killed by ``SIGPIPE``.
- Commands run one after another, so the record's order is the order of execution; within a
  pipeline or after ``&`` it is the scheduler's (``torchrun ... | tee log``: compare the
  launch, not its neighbours' order).
- The variables bash sets itself (``PWD``, ``HOSTNAME``, ``UID``, ``SHLVL``, ``LINENO`` ...) are
  bash's own; ``PATH`` is the oracle's empty folder, which a reader given no ``PATH`` cannot know.

Never run it on a script that forks without end (``:(){ :|:& };:``): the limits bound time and
memory, not the number of processes.
"""

from __future__ import annotations

import os
import resource
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

BASH = shutil.which("bash")
needs_bash = pytest.mark.skipif(BASH is None, reason="no bash on this machine to judge by")
SECONDS = 10
MEMORY_BYTES = 4 << 30

# Programs given their real behaviour (found by absolute path, never through PATH).
REAL_PROGRAMS = ("dirname", "basename", "realpath", "readlink")
# Recorded, but helpers of the script rather than commands it is about.
HELPERS = frozenset(REAL_PROGRAMS)

# srun's options that take their value as the next word (the rest are flags or --opt=value).
_SRUN_VALUED = (
    "-A -B -c -C -d -D -e -G -i -J -L -m -n -N -o -p -q -r -S -t -T -w -W -x "
    "--account --nodes --ntasks --ntasks-per-node --partition --time --job-name --output "
    "--error --input --nodelist --gpus --gpus-per-node --gpus-per-task --gres --cpus-per-task "
    "--cpus-per-gpu --container-image --container-mounts --container-workdir --container-name "
    "--container-env --mpi --export --mem --mem-per-cpu --mem-per-gpu --cpu-bind --distribution "
    "--qos --reservation --chdir --exclude --constraint --dependency --network --segment"
)

_STUBS = r"""
__oracle_record() {  # the sides of a pipeline record at once: one at a time, under a lock
    until "$ORACLE_MKDIR" "$ORACLE_RECORD.lock" 2>/dev/null; do :; done
    builtin printf '%s\0' "$#" "$@" >> "$ORACLE_RECORD"
    "$ORACLE_RMDIR" "$ORACLE_RECORD.lock"
}
command_not_found_handle() {
    __oracle_record "$@"
    local __word __index
    case ${1##*/} in
    bash|sh)
        for ((__index = 2; __index <= $#; __index++)); do
            __word=${!__index}
            [[ $__word == -c ]] && { "$ORACLE_BASH" "${@:2}"; return $?; }
            [[ $__word == -* ]] || break
        done
        ;;
    sbatch)
        for ((__index = 2; __index <= $#; __index++)); do
            __word=${!__index}
            case $__word in
            --wrap=*) "$ORACLE_BASH" -c "${__word#--wrap=}"; return $? ;;
            -*) ;;
            *) return 0 ;;
            esac
        done
        "$ORACLE_BASH" -s
        return $?
        ;;
    srun)
        for ((__index = 2; __index <= $#; __index++)); do
            __word=${!__index}
            case " $ORACLE_SRUN_VALUED " in
            *" $__word "*) ((__index++)); continue ;;
            esac
            [[ $__word == -* ]] || { "${@:__index}"; return $?; }
        done
        ;;
    tee)
        [[ -p /dev/stdin ]] && "$ORACLE_CAT"
        return 0
        ;;
    esac
    # what a pipeline hands the command is read, so that the writer ends as it would
    [[ -p /dev/stdin ]] && "$ORACLE_CAT" > /dev/null
    return 0
}
mkdir() {
    __oracle_record mkdir "$@"
    local __path
    for __path in "$@"; do
        [[ $__path == -* ]] && continue
        __path=$("$ORACLE_REALPATH" -m -- "$__path")
        [[ $__path == "$ORACLE_ROOT"/* ]] && "$ORACLE_MKDIR" -p -- "$__path"
    done
    return 0
}
exec() {
    if (($#)) && [[ $1 != -* ]]; then
        "$@"
        builtin exit $?
    fi
    builtin exec "$@"
}
"""


def _stub_file() -> str:
    real = []
    for name in REAL_PROGRAMS:
        path = shutil.which(name, path="/usr/bin:/bin")
        if path:
            real.append(f'{name}() {{ __oracle_record {name} "$@"; {path} "$@"; }}\n')
    return _STUBS + "".join(real)


@dataclass(frozen=True)
class BashRun:
    """What bash did: the commands it ran (argv, in order), its exit status (None: killed at
    the time limit), what it printed."""

    commands: tuple[tuple[str, ...], ...]
    status: int | None
    stdout: str
    stderr: str

    def without_helpers(self) -> list[tuple[str, ...]]:
        """The commands less the helper programs given their real behaviour (``dirname`` ...)."""
        return [argv for argv in self.commands if argv[0] not in HELPERS]


def _decode_record(data: bytes) -> tuple[tuple[str, ...], ...]:
    fields = data.decode(errors="surrogateescape").split("\0")
    commands: list[tuple[str, ...]] = []
    at = 0
    while at < len(fields) - 1:
        count = int(fields[at])
        commands.append(tuple(fields[at + 1 : at + 1 + count]))
        at += 1 + count
    return tuple(commands)


def _limits() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))


def run_bash(
    script_path: str | os.PathLike[str],
    arguments: Sequence[str] = (),
    environment: Mapping[str, str] | None = None,
    *,
    seconds: float = SECONDS,
) -> BashRun:
    """Run ``bash SCRIPT ARGUMENTS...`` as the module says; ``environment`` is the job's."""
    if BASH is None:
        pytest.skip("no bash on this machine to judge by")
    with tempfile.TemporaryDirectory(prefix="bash_oracle_") as scratch:
        root = Path(scratch)
        (root / "empty_path").mkdir()
        (root / "cwd").mkdir()
        stubs = root / "stubs.bash"
        stubs.write_text(_stub_file())
        record = root / "record"
        record.write_bytes(b"")
        env = {
            **(environment or {}),
            "PATH": str(root / "empty_path"),
            "BASH_ENV": str(stubs),
            "ORACLE_RECORD": str(record),
            "ORACLE_RMDIR": shutil.which("rmdir", path="/usr/bin:/bin") or "rmdir",
            "ORACLE_BASH": BASH,
            "ORACLE_SRUN_VALUED": _SRUN_VALUED,
            "ORACLE_ROOT": str(root),
            "ORACLE_CAT": shutil.which("cat", path="/usr/bin:/bin") or "/bin/cat",
            "ORACLE_MKDIR": shutil.which("mkdir", path="/usr/bin:/bin") or "/bin/mkdir",
            "ORACLE_REALPATH": shutil.which("realpath", path="/usr/bin:/bin") or "/bin/realpath",
        }
        process = subprocess.Popen(
            [BASH, os.fspath(script_path), *arguments],
            cwd=root / "cwd",
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            preexec_fn=_limits,
        )
        try:
            out, err = process.communicate(timeout=seconds)
            status: int | None = process.returncode
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            out, err = process.communicate()
            status = None
        return BashRun(
            commands=_decode_record(record.read_bytes()),
            status=status,
            stdout=out.decode(errors="surrogateescape"),
            stderr=err.decode(errors="surrogateescape"),
        )


def bash_commands(
    script_path: str | os.PathLike[str],
    arguments: Sequence[str] = (),
    environment: Mapping[str, str] | None = None,
) -> list[tuple[str, ...]]:
    """The argv of every external command bash runs for the script, in order (helpers such as
    ``dirname`` included)."""
    return list(run_bash(script_path, arguments, environment or {}).commands)


def read_existing(path: str) -> str | None:
    """A ``read_file`` for the reader: the file's text, None where there is none."""
    try:
        return Path(path).read_text()
    except OSError:
        return None


def write_script(
    folder: str | os.PathLike[str],
    text: str,
    *,
    name: str = "t.sh",
    files: Mapping[str, str] | None = None,
) -> Path:
    """Write ``text`` as ``folder/name`` (and ``files``, paths relative to ``folder``): the
    script's path, for bash and, as its source, for the reader."""
    root = Path(folder)
    for relative, content in (files or {}).items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_text(content)
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def is_known(word: object) -> bool:
    """A word whose text the reader says is bash's.  A word that is unknown only because a
    variable nothing set expanded to nothing in it (``missing``) is bash's text too: the oracle
    runs with exactly the environment the reader was given."""
    if getattr(word, "vanishes", False):  # an unset variable alone: no word, as in bash
        return True
    return getattr(word, "unresolved", word.unknown) is None


def is_certain(command: object) -> bool:
    """A reader's command it claims to know: it runs unconditionally and every word is known."""
    return getattr(command, "condition", None) is None and all(
        is_known(word) for word in command.words
    )


def differences_from_bash(
    commands: Sequence[object],
    ran: Sequence[tuple[str, ...]],
    *,
    complete: bool,
    exhaustive: bool = False,
) -> list[str]:
    """How the reader's commands differ from what bash ran (helpers such as ``dirname`` left out
    of both sides); empty where they agree.

    The rule: a command the reader says runs unconditionally with every word known must be the
    command bash ran at that place.  While every earlier command of the reader runs
    unconditionally, "that place" is its index; after a conditional one (or one whose name is
    unknown: an ``eval`` of unknown text), its known commands must still appear in bash's, in
    order.  ``exhaustive``: nothing in the script is hidden from the
    reader (no unknown text is run), so where every command it lists is certain, they are all
    the commands bash ran (none silently dropped).  ``complete``: the script's every value is
    known, so every command must be certain and the two lists equal."""
    mine = [c for c in commands if tuple(c.argv)[:1] and c.argv[0] not in HELPERS]
    bash = [argv for argv in ran if argv[0] not in HELPERS]
    problems: list[str] = []
    if complete:
        unsure = [c for c in mine if not is_certain(c)]
        for c in unsure:
            why = c.condition or "; ".join(w.unknown for w in c.words if not is_known(w))
            problems.append(f"line {c.line}: {list(c.argv)} not certain ({why})")
        got = [tuple(c.argv) for c in mine]
        if got != bash:
            problems.append(f"bash ran {[list(a) for a in bash]}, reader {[list(a) for a in got]}")
        return problems
    at = 0
    aligned = True
    for c in mine:
        if c.condition is not None or not (c.words and is_known(c.words[0])):
            aligned = False  # it may run, or run another command, or none at all
            continue
        argv = tuple(c.argv)
        known = all(is_known(w) for w in c.words)
        if aligned:
            if at >= len(bash):
                problems.append(f"line {c.line}: reader runs {list(argv)}; bash ran no more")
            elif known and argv != bash[at]:
                problems.append(f"line {c.line}: bash ran {list(bash[at])}, reader {list(argv)}")
            at += 1
        elif known:
            later = [k for k in range(at, len(bash)) if bash[k] == argv]
            if not later:
                problems.append(f"line {c.line}: reader runs {list(argv)}; bash never did")
            else:
                at = later[0] + 1
    if exhaustive and all(is_certain(c) for c in mine) and len(mine) < len(bash):
        missing = [list(a) for a in bash[len(mine) :]]
        problems.append(f"bash ran {len(bash)} commands, the reader {len(mine)}: {missing}")
    return problems


# ---- the launch command: bash's and the reader's -------------------------------------------


def entry_commands(commands: Sequence[tuple[str, ...]]) -> list[tuple[str, ...]]:
    """The commands that run a ``.py`` entry point with flags; one that is the tail of another
    (the command an emulated ``srun`` or ``bash -c`` ran) is that other's."""
    found = [
        argv
        for argv in commands
        if any(
            word.endswith(".py") and any(later.startswith("--") for later in argv[i + 1 :])
            for i, word in enumerate(argv)
        )
    ]
    outer = [
        argv
        for argv in found
        if not any(len(o) > len(argv) and o[len(o) - len(argv) :] == argv for o in found)
    ]
    return list(dict.fromkeys(outer))


def launch_words(launch) -> tuple:
    """The reader's launch words (launcher, entry point, arguments): ``launch.argv``'s words."""
    words = getattr(launch, "words", None)
    if words is None:
        entry = getattr(launch, "entry", None)
        words = (*launch.launcher, *(() if entry is None else (entry,)), *launch.arguments)
    words = tuple(w for w in words if not getattr(w, "vanishes", False))  # bash passes none
    assert tuple(w.text for w in words) == tuple(launch.argv)
    return words


def compare_known(words: Sequence, expected: Sequence[str]) -> list[str]:
    """Differences between the reader's words and bash's: known words before the first unknown
    one are bash's first words, those after the last unknown one its last words, and those
    between appear in bash's, in order."""
    texts = [w.text for w in words]
    unknown = [i for i, w in enumerate(words) if not is_known(w)]
    if not unknown:
        return [] if texts == list(expected) else [_diff(texts, expected)]
    first, last = unknown[0], unknown[-1]
    head, tail = texts[:first], texts[last + 1 :]
    problems = []
    if list(expected[:first]) != head:
        problems.append(f"before word {first}: {_diff(head, expected[:first])}")
    if tail and list(expected[len(expected) - len(tail) :]) != tail:
        problems.append(f"after word {last}: {_diff(tail, expected[-len(tail) :])}")
    middle = iter(expected[first : len(expected) - len(tail)])
    for i in range(first, last):
        if is_known(words[i]) and texts[i] not in middle:
            problems.append(f"word {i} {texts[i]!r} is not where bash has it")
    return problems


def _diff(got: Sequence[str], expected: Sequence[str]) -> str:
    got, expected = list(got), list(expected)
    at = next((i for i, (g, e) in enumerate(zip(got, expected, strict=False)) if g != e), None)
    if at is None:
        at = min(len(got), len(expected))
    return (
        f"from word {at}: bash {expected[at : at + 6]} ... ({len(expected)} words), "
        f"reader {got[at : at + 6]} ... ({len(got)} words)"
    )


def launcher_problems(words: Sequence, expected: tuple[str, ...]) -> list[str]:
    """The reader's launch against bash's command: from the entry point on, the same words; the
    launcher part bash's, or the part after a ``--`` that hands the rest to another program
    (``ray job submit ... -- python3 train.py``)."""
    texts = [w.text for w in words]
    entry = next((i for i, t in enumerate(texts) if t.endswith(".py") and is_known(words[i])), None)
    bash_entry = next(i for i, t in enumerate(expected) if t.endswith(".py"))
    if entry is None:
        return compare_known(words, expected)
    problems = compare_known(words[entry:], expected[bash_entry:])
    launcher, bash_launcher = words[:entry], expected[:bash_entry]
    handed = [i + 1 for i, t in enumerate(bash_launcher) if t == "--"]
    for start in (0, *handed):
        if not compare_known(launcher, bash_launcher[start:]):
            return problems
    return [*problems, f"launcher: {compare_known(launcher, bash_launcher)}"]
