"""What the modules that run one kind of command (``simple``, ``builtins``, ``assignments``,
``printing``, ``loops``, ``branching``, ``nested``) need of the interpreter: running commands and
text, expanding words, counting work, and the bookkeeping a run shares.  A protocol, so that they
depend on this and the interpreter on them, never both ways."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from ray_layout.shell.flow import Status
from ray_layout.shell.recorded import Command
from ray_layout.shell.refusal import ShellError
from ray_layout.shell.state import Scope, State
from ray_layout.shell.syntax import Commands, Node, Simple
from ray_layout.shell.tokens import Word
from ray_layout.shell.values import ExpandedWord, Text

FileReader = Callable[[str], "str | None"]


class Runner(Protocol):
    """The interpreter as a command's handler sees it (``ray_layout.shell.interpreter``)."""

    source: str
    environment: Mapping[str, str]
    read_file: FileReader | None
    commands: list[Command]  # the external commands run, in order
    untaken: list[Command]  # what only another value of an unset variable runs
    notes: list[str]
    decided_by: list[str]  # unset variables the last test read
    line: int  # the line of the simple command being run
    substitution_status: Status  # $? of the last command substitution
    heredoc_body: ExpandedWord | None  # the running command's, expanded
    checking: int  # inside a condition, where set -e does not apply
    frames: int  # functions and sourced files running
    loops: int  # loops running
    depth: int  # calls, sources, evals and substitutions inside each other

    def error(self, line: int, message: str) -> ShellError: ...

    def step(self, line: int) -> None: ...

    def enter(self, line: int, what: str) -> None: ...

    def scope(self, state: State) -> Scope: ...

    def words(self, tokens: Sequence[Word], state: State) -> list[ExpandedWord]: ...

    def check_nounset(self, scope: Scope, state: State, line: int) -> None: ...

    def run(self, node: Node, state: State) -> Status: ...

    def sequence(self, commands: Commands, state: State) -> Status: ...

    def command(self, words: list[ExpandedWord], node: Simple, state: State) -> Status: ...

    def external(self, words: list[ExpandedWord], node: Simple, state: State) -> Status: ...

    def run_text(
        self,
        text: Text,
        line: int,
        state: State,
        what: str,
        source: str | None = None,
        reparsed: bool = True,
    ) -> Status: ...


# A builtin: run with the command's expanded words, its node (line, prefixes) and the state.
Builtin = Callable[[Runner, list[ExpandedWord], Simple, State], Status]
