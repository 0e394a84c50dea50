"""What reading a script records: every external command it runs (its words as bash passes
them, the environment its prefixes set, the condition it runs under), and what the script leaves
behind when it ends."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ray_layout.shell.values import ExpandedWord, Value


@dataclass(frozen=True)
class Command:
    """An external command: its words, the ``NAME=value`` prefixes that set its environment, and
    the condition it runs under (None: whenever the script gets there)."""

    words: tuple[ExpandedWord, ...]
    environment: tuple[tuple[str, ExpandedWord], ...]
    line: int
    condition: str | None
    reparsed: bool = False  # from text bash parses again (``eval "$CMD"``, ``bash -c``)
    captured: bool = False  # run inside a command substitution, for its output

    @property
    def argv(self) -> tuple[str, ...]:
        """The words as bash passes them (an unset variable alone passes none)."""
        return tuple(word.text for word in self.words if not word.vanishes)


@dataclass(frozen=True)
class ScriptRun:
    """What the script leaves behind: every variable, what it exports, the commands it runs,
    and why it stopped before its end (an ``exit``, ``set -e``), if it did."""

    variables: Mapping[str, Value]
    exported: tuple[str, ...]
    commands: tuple[Command, ...]
    notes: tuple[str, ...]
    environment: Mapping[str, str]  # the --env values it was read with
    lines: Mapping[str, int]  # each variable's last assignment
    stopped: str | None
    taken_as_empty: tuple[str, ...]  # variables never set that the commands' words used
    untaken: tuple[Command, ...] = ()  # commands only another value of an unset variable runs
