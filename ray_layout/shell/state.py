"""What a running script holds: its variables (global and each function's locals), functions,
positional parameters, options, the condition it runs under, and what it has printed inside a
command substitution.  ``Scope`` is the view expansions read it through.

A variable is *unresolved* where the reader did not evaluate what set it (a loop over unknown
words, an ``eval`` of unknown text, a ``source`` not read); after such a construct every name
the script did not set since reads as unresolved (``poisoned``), never as what it was before.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from ray_layout.shell.syntax import FunctionDefinition
from ray_layout.shell.tokens import Substitution
from ray_layout.shell.values import Text, Unresolved, Value, same, unknown

# Names a running shell fills by itself; their values are no script's text.
DYNAMIC = frozenset({"RANDOM", "SRANDOM", "SECONDS", "BASHPID", "EPOCHSECONDS", "EPOCHREALTIME"})
# Names the job's own shell sets, whatever the environment: unknown here, never empty.
SHELL_SET = frozenset(
    {
        "HOSTNAME",
        "UID",
        "EUID",
        "PPID",
        "SHLVL",
        "OSTYPE",
        "MACHTYPE",
        "HOSTTYPE",
        "SHELL",
        "BASH_VERSION",
        "BASH_VERSINFO",
        "BASH",
        "GROUPS",
        "OLDPWD",
        "_",
    }
)


@dataclass
class State:
    variables: dict[str, Value]
    positional: tuple[Text, ...] | Unresolved
    zero: Text  # $0
    scopes: list[dict[str, Value | None]] = field(default_factory=list)  # None: local, unset
    exported: dict[str, int] = field(default_factory=dict)  # name -> line
    functions: dict[str, FunctionDefinition] = field(default_factory=dict)
    options: set[str] = field(default_factory=set)  # "errexit", "nounset"
    integers: set[str] = field(default_factory=set)  # declare -i
    condition: str | None = None  # why the reader does not know whether this runs
    poisoned: str | None = None
    lines: dict[str, int] = field(default_factory=dict)  # name -> line of its last assignment
    cwd: str | None = None  # None: the directory the job runs in, which the reader lacks
    sources: list[str] = field(default_factory=list)  # BASH_SOURCE, innermost first
    output: list[Text] | None = None  # inside a command substitution: what it printed
    impure: str | None = None  # why that output is not known
    decided_by: tuple[str, ...] = ()  # unset variables whose emptiness chose this branch
    arguments_given: bool = True  # False: the user gave none, so $# is bash's 0, remembered
    last_status: int | object = 0  # $?: an int, or the flow's Unknown
    function_names: list[str] = field(default_factory=list)  # FUNCNAME, innermost first

    def copy(self) -> State:
        return State(
            dict(self.variables),
            self.positional,
            self.zero,
            [dict(scope) for scope in self.scopes],
            dict(self.exported),
            dict(self.functions),
            set(self.options),
            set(self.integers),
            self.condition,
            self.poisoned,
            dict(self.lines),
            self.cwd,
            list(self.sources),
            None if self.output is None else list(self.output),
            self.impure,
            self.decided_by,
            self.arguments_given,
            self.last_status,
            list(self.function_names),
        )

    def lookup(self, name: str) -> Value | None:
        """The variable's value: the innermost function's local, else the global."""
        for scope in reversed(self.scopes):
            if name in scope:
                return scope[name]
        return self.variables.get(name)

    def store(self, name: str, value: Value, line: int) -> None:
        for scope in reversed(self.scopes):
            if name in scope:
                scope[name] = value
                break
        else:
            self.variables[name] = value
        self.lines[name] = line

    def remove(self, name: str) -> None:
        for scope in reversed(self.scopes):
            if name in scope:
                scope[name] = None
                return
        self.variables.pop(name, None)

    def names(self) -> set[str]:
        return set(self.variables) | {name for scope in self.scopes for name in scope}

    def poison(self, reason: str) -> None:
        """After a construct that may have changed anything: every variable, the positional
        parameters too, reads as unresolved until the script sets it again."""
        unknown = Unresolved(reason)
        for name in self.names():
            self.store(name, unknown, self.lines.get(name, 0))
        self.positional = unknown
        self.poisoned = reason

    def taint_differences(self, other: State, names: tuple[str, ...]) -> None:
        """What ``other`` (another branch) leaves different from this state was chosen by the
        unset ``names``: it keeps bash's value here, remembered as decided by them."""
        for name in sorted(other.names() | self.names()):
            mine = self.lookup(name)
            if same(mine, other.lookup(name)) or isinstance(mine, Unresolved):
                continue
            if mine is None:
                value: Value = Text("", (), (name, *names))
            elif isinstance(mine, Text):
                value = Text(
                    mine.text,
                    mine.offsets,
                    tuple(dict.fromkeys(mine.missing + names)),
                    mine.unresolved,
                )
            else:
                value = tuple(
                    Text(t.text, t.offsets, tuple(dict.fromkeys(t.missing + names)), t.unresolved)
                    for t in mine
                )
            self.store(name, value, self.lines.get(name, 0))

    def unresolve_changes(self, after: State, reason: str) -> None:
        """Every variable ``after`` holds differently from this state becomes unresolved here:
        what a construct the reader did not follow to its end may have set."""
        for name in sorted(after.names() | self.names()):
            if not same(after.lookup(name), self.lookup(name)):
                self.store(name, Unresolved(f"{name} is set in {reason}"), after.lines.get(name, 0))
        if not _same_positional(after.positional, self.positional):
            self.positional = Unresolved(f"the script's arguments are changed in {reason}")
        self.exported |= after.exported
        self.functions = after.functions | self.functions
        if after.poisoned and not self.poisoned:
            self.poison(after.poisoned)
        if after.impure or after.output != self.output:
            self.impure = self.impure or after.impure or reason


def _same_positional(one: tuple[Text, ...] | Unresolved, other: object) -> bool:
    if isinstance(one, tuple) and isinstance(other, tuple):
        return same(one, other)
    return one == other


def merge(state: State, outcomes: list[State], reason: str) -> None:
    """``state`` after one of ``outcomes`` ran, the reader not knowing which: what they leave
    the same stays, what differs is unresolved."""
    first = outcomes[0]
    for name in sorted(set().union(*(o.names() for o in outcomes))):
        values = [o.lookup(name) for o in outcomes]
        if all(same(value, values[0]) for value in values):
            if values[0] is not None:
                state.store(name, values[0], first.lines.get(name, 0))
            else:
                state.remove(name)
        else:
            state.store(name, Unresolved(f"{name} is set under {reason}"), first.lines.get(name, 0))
    positional = [o.positional for o in outcomes]
    if all(_same_positional(p, positional[0]) for p in positional):
        state.positional = positional[0]
    else:
        state.positional = Unresolved(f"the script's arguments are changed under {reason}")
    for outcome in outcomes:
        state.exported |= outcome.exported
        state.functions |= outcome.functions
        state.options |= outcome.options
    if any(o.output != first.output or o.impure for o in outcomes):
        state.impure = state.impure or next((o.impure for o in outcomes if o.impure), reason)
    state.output = first.output
    state.poisoned = next((o.poisoned for o in outcomes if o.poisoned), state.poisoned)
    state.cwd = first.cwd if all(o.cwd == first.cwd for o in outcomes) else None


_WHERE = "the directory the job starts in (give --env PWD=DIR)"


class Scope:
    """The state as expansions see it: ``$1``, ``$#``, ``$@`` from the positional parameters,
    ``$0``, ``BASH_SOURCE``; an unresolved value that ``--env`` gives is the given value;
    command substitutions run through ``substitute``."""

    def __init__(
        self,
        state: State,
        environment: Mapping[str, str],
        substitute: Callable[[Substitution], Value],
    ) -> None:
        self.state, self.environment, self.substitute = state, environment, substitute
        self.line = 0  # the line being run, for $LINENO
        self.extglob = "extglob" in state.options
        self.unset_used: list[str] = []  # plain $NAME of unset variables, for set -u

    def unset(self, name: str) -> None:
        self.unset_used.append(name)

    def get(self, name: str) -> Value | None:
        state = self.state
        if name == "0":
            return state.zero
        if name.isdigit() or name in ("#", "@", "*"):
            return self.positional(name)
        if name == "?":
            status = state.last_status
            reason = getattr(status, "reason", None)
            return Text.of(str(status)) if reason is None else Unresolved(f"$? of {reason}")
        if name == "BASH_SOURCE":
            return tuple(Text.of(path) for path in state.sources)
        value = state.lookup(name)
        if value is None and name not in self.environment:
            if name == "PWD":
                return Text.of(state.cwd) if state.cwd else Unresolved(_WHERE)
            if name in SHELL_SET:
                return Unresolved(f"${name}, which the job's shell sets (give --env {name}=VALUE)")
            if name == "IFS":
                return Text.of(" \t\n")
            if name == "LINENO":
                return Text.of(str(self.line))
            if name == "FUNCNAME":
                return tuple(Text.of(f) for f in state.function_names) or None
        if name in DYNAMIC:
            return Unresolved(f"${name} (a value only a running shell has)")
        if value is None and state.poisoned and name not in self.environment:
            return Unresolved(f"${name} may be set by {state.poisoned}; give --env {name}=VALUE")
        if unknown(value) and name in self.environment:
            return Text.of(self.environment[name])
        return value

    def positional(self, name: str) -> Value | None:
        given = self.state.positional
        if isinstance(given, Unresolved):
            return given
        if name == "#":
            # none given: bash's 0, remembered as the user's to give where it decides anything
            if self.state.arguments_given:
                return Text.of(str(len(given)))
            return Text("0", (-1,), ("#",))
        if name in ("@", "*"):
            return given
        index = int(name) - 1
        return given[index] if index < len(given) else None

    def __setitem__(self, name: str, value: Value) -> None:
        self.state.store(name, value, 0)
