"""A Megatron fork as data: its flag table, what says a command line is its own, and how its
flags become this project's model and parallel fields."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ray_layout.errors import ConfigError
from ray_layout.model.dialects.flag import DialectFlag
from ray_layout.model.megatron_args import FlagTable, megatron_flag_table


@dataclass(frozen=True)
class DialectReading:
    """What a fork's flags say, in this project's terms: ``values`` replace parsed Megatron
    dests and set model fields (``fields.MODEL_FIELDS`` names), ``parallel`` sets
    ``ParallelConfig`` fields, ``notes`` are what the user should hear once."""

    values: Mapping[str, Any] = field(default_factory=dict)
    parallel: Mapping[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class ReadContext:
    """What a fork's reader is given: the parsed flags (dest -> value, the user's overrides in
    place), which of them our own command line gave, the entry point and where the words came
    from."""

    parsed: Mapping[str, Any]
    given: frozenset[str]  # dests our command's flags set (--vocab-size, --pp, ...)
    entry_point: str  # "pretrain_deepseek.py" or a path to it; "" when not known
    source: str


Reader = Callable[[ReadContext], DialectReading]


@dataclass(frozen=True)
class Dialect:
    """One fork: its name as its users know it, its flag table and its reader.  ``entry_points``
    are the file names of its own training scripts (its ``pretrain_gpt.py`` is Megatron's name)."""

    name: str
    flags: tuple[DialectFlag, ...]
    read: Reader
    entry_points: tuple[str, ...] = ()
    # values that say the fork where the flag alone does not: flag -> (its words -> whether)
    marking_values: tuple[tuple[str, Callable[[Sequence[str]], bool]], ...] = ()

    def table(self) -> FlagTable:
        """Megatron core's flag table with this fork's flags in it (a fork's own entry replaces
        core's where the fork parses the flag otherwise)."""
        return megatron_flag_table() | {f.name: f.entry() for f in self.flags}

    def marks(self, words: Sequence[str], entry_point: str) -> tuple[str, ...]:
        """The flags (or entry point) of ``words`` that say this fork, in order."""
        names = {w.partition("=")[0] for w in words if w.startswith("--")}
        found = [f.name for f in self.flags if f.marks and f.name in names]
        for name, marking in self.marking_values:
            found += [name] if any(marking(v) for v in _values_of(name, words)) else []
        if entry_point and entry_point.rsplit("/", 1)[-1] in self.entry_points:
            found.insert(0, entry_point.rsplit("/", 1)[-1])
        return tuple(found)


def _values_of(flag: str, words: Sequence[str]) -> list[list[str]]:
    """The words after each use of ``flag`` up to the next flag (``--flag=v`` gives [v])."""
    uses = []
    for i, word in enumerate(words):
        name, equals, inline = word.partition("=")
        if name != flag:
            continue
        if equals:
            uses.append([inline])
            continue
        end = i + 1
        while end < len(words) and not words[end].startswith("--"):
            end += 1
        uses.append(list(words[i + 1 : end]))
    return uses


def _core_reader(context: ReadContext) -> DialectReading:
    return DialectReading()


CORE = Dialect("Megatron-LM", (), _core_reader)


def refuse(
    flags: Sequence[DialectFlag], parsed: Mapping[str, Any], dialect: str, source: str
) -> None:
    """A flag of the fork that changes the model in a way this tool does not model, when the
    command line sets it: one line naming it and why."""
    for flag in flags:
        if flag.effect == "refused" and _set(parsed.get(flag.key)):
            raise ConfigError(
                f"{source}: {flag.name} is {dialect}'s {flag.meaning}, which this tool does not "
                "model"
            )


def _set(value: Any) -> bool:
    """Whether a parsed value is the flag given (a switch on, a value other than none)."""
    return value is not None and value is not False
