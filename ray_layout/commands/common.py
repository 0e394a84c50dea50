"""What every command shares: the command's shape, the one-line error parser, the model config
and parallel sizes every command starts from, the JSON-or-print output, the one-line errors, and
:func:`command_line`, the one place a command line runs (inside ``guard.guarded``)."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Generic, TypeVar

from rich.console import Console

from ray_layout.commands.flags import Settings, add_flags, from_args
from ray_layout.commands.guard import end_with, guarded
from ray_layout.errors import EXIT_BAD_INPUT, RayLayoutError, one_line
from ray_layout.model.fields import MAX_DIMENSION, MAX_PARALLEL_SIZE
from ray_layout.model.loading import load_recipe
from ray_layout.model.megatron_recipe import Overrides
from ray_layout.model.spec import Recipe
from ray_layout.options.checks import between
from ray_layout.options.flag_fields import argument, option

CONFIG_HELP = "model config: project YAML/JSON, HF config.json, Megatron launch script or run log"
PARALLEL = "parallel sizes (override the config's)"


def _size(help: str | None = None) -> Any:
    return option(None, help=help, group=PARALLEL, checks=[between(1, MAX_PARALLEL_SIZE)])


@dataclass(frozen=True, kw_only=True)
class ParallelFlags(Settings):
    """Parallel and batch sizes that override the config's (None: the config's)."""

    tp: int | None = _size("TP size")
    pp: int | None = _size("PP size")
    vpp: int | None = _size("VPP size")
    cp: int | None = _size("CP size")
    ep: int | None = _size("EP size")
    etp: int | None = _size("ETP size")
    dp: int | None = _size("DP size")
    micro_batch_size: int | None = _size()
    global_batch_size: int | None = option(None, group=PARALLEL, checks=[between(1, MAX_DIMENSION)])

    def sizes_given(self) -> dict[str, int]:
        """The sizes set on the command line, by ``ParallelConfig`` field name: they override
        the config's, and a log that states another is refused."""
        sizes = {item.name: getattr(self, item.name) for item in fields(self)}
        return {name: size for name, size in sizes.items() if size is not None}


def _environment_checks(assignments: tuple[str, ...]) -> str | None:
    """Each ``--env`` is ``NAME=VALUE`` (a shell variable, or a script argument's number), and
    sets its variable once."""
    names = []
    for text in assignments:
        name, equals, _ = text.partition("=")
        if not equals or not (name.isidentifier() or name.isdigit()) or not name.isascii():
            return f"must be NAME=VALUE with a shell variable's name, got {text[:80]!r}"
        names.append(name)
    repeated = sorted({name for name in names if names.count(name) > 1})
    return f"sets {repeated[0]} twice" if repeated else None


@dataclass(frozen=True, kw_only=True)
class ModelSettings(Settings):
    """A model config and the parallel sizes to run it with: where most commands start."""

    config: str = argument(help=CONFIG_HELP)
    parallel: ParallelFlags = field(default_factory=ParallelFlags)
    seq_length: int | None = option(
        None, help="training sequence length override", checks=[between(1, MAX_DIMENSION)]
    )
    vocab_size: int | None = option(
        None,
        help="vocabulary size (a script's tokenizer is not loaded)",
        checks=[between(1, MAX_DIMENSION)],
    )
    env: tuple[str, ...] = option(
        (),
        help="NAME=VALUE of the job's environment a launch script reads (repeatable)",
        metavar="NAME=VALUE",
        checks=[_environment_checks],
    )
    script_args: tuple[str, ...] = option(
        (),
        help="one of the launch script's own arguments ($1, $2, ...); or give them all after --",
        metavar="ARG",
        names=["--script-arg"],
    )

    def overrides(self, **sizes: int) -> Overrides:
        """What the flags say about the config: the job's environment and the sizes that
        replace the config's (``sizes`` replace the flags' own)."""
        given = self.parallel.sizes_given()
        given |= {
            k: v
            for k, v in (("seq_length", self.seq_length), ("vocab_size", self.vocab_size))
            if v is not None
        }
        environment = dict(text.partition("=")[::2] for text in self.env)
        arguments = self.script_args if self.script_args else None
        return Overrides(environment, given | sizes, arguments)

    def recipe(self) -> Recipe:
        """The config's recipe with the flags' overrides, given to a launch script before
        anything in it is checked (``ConfigError`` if they do not fit); what loading decided
        is said once, on stderr."""
        recipe = load_recipe(self.config, self.overrides())
        for note in recipe.notes:
            print(one_line(f"note: {note}"), file=sys.stderr)
        return recipe


def json_flag(help: str = "print JSON") -> Any:
    return option(False, help=help, names=["--json"])


S = TypeVar("S", bound=Settings)
STOPPED = "stopped before the end; what it stored is whole; run the same command again to finish"


@dataclass(frozen=True)
class Command(Generic[S]):
    """A command: its name and help, the settings it takes, what it does with them, and what
    an interrupt leaves (said after ``interrupted:``)."""

    name: str
    help: str
    settings: type[S]
    run: Callable[[S, Console], None]
    stopped: str = STOPPED


class OneLineErrorParser(argparse.ArgumentParser):
    """Usage mistakes end in one line naming the problem (and exit 2), like every other error."""

    def error(self, message: str) -> None:  # type: ignore[override]
        end_with(f"error: {self.prog}: {message} (see --help)")
        raise SystemExit(EXIT_BAD_INPUT)


def script_arguments_apart(argv: Sequence[str]) -> list[str]:
    """The command line with what follows ``--`` (a launch script's own arguments, which may
    look like flags: ``-- dsw A37B --pp``) given as ``--script-arg=WORD`` each."""
    words = list(argv)
    if "--" not in words:
        return words
    cut = words.index("--")
    return words[:cut] + [f"--script-arg={word}" for word in words[cut + 1 :]]


def command_parser(
    settings: type[Settings], prog: str, description: str
) -> argparse.ArgumentParser:
    """A parser for one command on its own (``python -m ray_layout.tune``)."""
    parser = OneLineErrorParser(prog=prog, description=description)
    add_flags(parser, settings)
    return parser


def terminal() -> Console:
    """rich's console on stdout (whichever ``sys.stdout`` is when it prints: the guard's)."""
    return Console(width=max(shutil.get_terminal_size().columns, 120))


def execute(command: Command, args: argparse.Namespace) -> int:
    """Check the settings, run the command; an error the user can act on is one line on stderr
    (alone: the notes before it are dropped) and the exit status of its kind (bad input 2,
    failed runs and output that cannot be written 1)."""
    try:
        command.run(from_args(command.settings, args), terminal())
    except RayLayoutError as exc:
        end_with(f"error: {exc}")
        return exc.exit_code
    return 0


def command_line(
    parser: argparse.ArgumentParser,
    words: Sequence[str],
    chosen: Callable[[argparse.Namespace], Command],
) -> int:
    """The one place a command line runs, from its words to its exit status: parsed, the
    ``chosen`` command executed, all of it inside ``guard.guarded`` (interrupts, output that
    cannot be written, notes held back from a refusal)."""
    picked: list[Command] = []

    def body() -> int:
        args = parser.parse_args(script_arguments_apart(words))
        picked.append(chosen(args))
        return execute(picked[0], args)

    return guarded(body, lambda: picked[0].stopped if picked else STOPPED)


def emit(
    report: Any, as_json: bool, show: Callable[[Any, Console], None], console: Console
) -> None:
    """Print ``report`` as JSON, or as ``show`` lays it out for a reader."""
    if as_json:
        print(json.dumps(report, indent=2))
    else:
        show(report, console)
