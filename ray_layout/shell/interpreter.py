"""Run a bash script's tree without a shell: what each variable holds and every external command
the script runs, with its words as bash would pass them.

Everything bash decides from values the reader has is decided as bash decides it: functions,
``for``/``while``/``until`` loops, ``case``, ``if``, ``&&``/``||``, ``(( ))``, ``[[ ]]``,
``eval`` of known text, ``source`` of a file it can read, ``set --``/``shift``, command
substitutions made of builtins.  A variable the script never set expands to nothing, as in bash,
and is remembered.  Where a decision needs what only the running job has (a command's outcome, a
file test, a value from outside), every outcome is followed and what they leave different is
*unresolved*, with the construct and its line; commands found there run under that condition.
Nothing is ever skipped as if it did nothing.  Work is bounded: a script that runs more than
``MAX_STEPS`` commands, nests deeper than ``MAX_DEPTH`` calls or builds a value over
``MAX_VALUE_CHARS`` is refused in one line.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from ray_layout.errors import clipped
from ray_layout.shell import assignments, branching, builtins, loops, nested, simple
from ray_layout.shell.expand import expand
from ray_layout.shell.flow import Break, Exit, Return, Status, Uncertain, Unknown
from ray_layout.shell.parse import parse
from ray_layout.shell.recorded import Command, ScriptRun
from ray_layout.shell.refusal import ShellError
from ray_layout.shell.relocate import Placement
from ray_layout.shell.runner import FileReader
from ray_layout.shell.state import Scope, State
from ray_layout.shell.syntax import (
    AndOr,
    Arithmetic,
    ArithmeticFor,
    Case,
    Commands,
    Conditional,
    For,
    FunctionDefinition,
    Group,
    If,
    Node,
    Pipeline,
    Simple,
    Subshell,
    While,
)
from ray_layout.shell.tokens import Word
from ray_layout.shell.values import (
    MAX_ELEMENTS,
    MAX_VALUE_CHARS,
    ExpandedWord,
    Failed,
    Text,
    hole_reason,
    not_set,
    readable,
    reset_holes,
)

MAX_STEPS = 300_000
MAX_DEPTH = 100  # function calls, sources, evals and substitutions inside each other


def run_script(
    text: str,
    source: str,
    environment: Mapping[str, str] | None = None,
    arguments: Sequence[str] | None = None,
    read_file: FileReader | None = None,
) -> ScriptRun:
    """Run ``text`` (a bash script at path ``source``) as bash would, on the job's environment
    as far as the user gave it, with ``arguments`` as its positional parameters; ``read_file``
    reads a ``source``d file (None where it cannot)."""
    reset_holes()
    given = dict(environment or {})
    positional = {k: v for k, v in given.items() if k.isdigit() and k != "0"}
    listed = list(arguments or [])
    for key, value in sorted(positional.items(), key=lambda item: int(item[0])):
        index = int(key) - 1
        listed += [""] * (index + 1 - len(listed))
        listed[index] = value
    state = State(
        {k: Text.of(v) for k, v in given.items() if not k.isdigit()},
        tuple(Text.of(a) for a in listed),
        Text.of(source),
        sources=[source],
        arguments_given=arguments is not None or bool(positional),
    )
    runner = Interpreter(source, given, read_file)
    stopped = None
    try:
        runner.sequence(parse(text, source), state)
    except Exit as exit_:
        stopped = exit_.why
    except (Return, Break):
        pass
    except Uncertain as uncertain:
        raise ShellError(f"{source}: {uncertain.reason}") from None
    except RecursionError:
        raise ShellError(f"{source}: the script nests calls too deeply to read") from None
    empty = dict.fromkeys(
        name for c in runner.commands for w in c.words for name in w.missing if name.isidentifier()
    )
    return ScriptRun(
        state.variables,
        tuple(state.exported),
        tuple(runner.commands),
        tuple(dict.fromkeys(runner.notes)),
        given,
        state.lines,
        stopped,
        tuple(empty),
        tuple(runner.untaken),
    )


class Interpreter:
    """Runs the tree, a node at a time, by the module for its kind; what those modules see of it
    is :class:`ray_layout.shell.runner.Runner`."""

    def __init__(
        self,
        source: str,
        environment: Mapping[str, str],
        read_file: FileReader | None,
    ) -> None:
        self.source, self.environment, self.read_file = source, environment, read_file
        self.commands: list[Command] = []
        self.notes: list[str] = []
        self.steps = 0
        self.depth = 0
        self.decided_by: list[str] = []  # unset variables the last test read
        self.parsed: dict[tuple[str, str], Commands] = {}
        self.reparsing = 0  # inside an eval's or a bash -c's text
        self.line = 0  # the line of the simple command being run
        self.substitution_status: Status = 0  # $? of the last command substitution
        self.checking = 0  # inside a condition, where set -e does not apply
        self.frames = 0  # functions and sourced files running (return leaves the innermost)
        self.loops = 0  # loops running (break and continue leave them)
        self.heredoc_body: ExpandedWord | None = None  # the running command's, expanded
        self.untaken: list[Command] = []  # what only another value of an unset variable runs

    def error(self, line: int, message: str) -> ShellError:
        return ShellError(f"{self.source}:{line}: {message}")

    def step(self, line: int) -> None:
        self.line = line
        self.steps += 1
        if self.steps > MAX_STEPS:
            raise self.error(line, f"the script runs more than {MAX_STEPS:,} commands")

    def scope(self, state: State) -> Scope:
        scope = Scope(state, self.environment, lambda part: nested.substitute(self, part, state))
        scope.line = self.line
        return scope

    def words(self, tokens: Sequence[Word], state: State) -> list[ExpandedWord]:
        scope = self.scope(state)
        out: list[ExpandedWord] = []
        for token in tokens:
            try:
                out += expand(token, scope)
            except ShellError as exc:
                raise self.error(token.line, str(exc)) from None
            self.check_nounset(scope, state, token.line)
        if sum(len(word.text) for word in out) > MAX_VALUE_CHARS or len(out) > MAX_ELEMENTS:
            raise self.error(tokens[0].line, f"words over {MAX_VALUE_CHARS:,} characters")
        return [
            replace(w, unresolved=hole_reason(w.text))
            if "\x01" in w.text and not w.unresolved
            else w
            for w in out
        ]

    # --- lists and control flow -------------------------------------------------------------

    def sequence(self, commands: Commands, state: State) -> Status:
        status: Status = 0
        discarded = None  # the line an arithmetic error threw away, as bash does
        for node, background in commands.items:
            if discarded is not None and _line_of(node) == discarded:
                continue
            try:
                status = self.item(node, background, state)
            except Failed as failed:
                line = _line_of(node)
                self.notes.append(f"{self.source}:{line}: {failed.message}: the line is skipped")
                discarded, status = _line_of(node), 1
        return status

    def item(self, node: Node, background: bool, state: State) -> Status:
        """One command of a list; ``&`` runs it in a subshell of its own."""
        if background:
            self.subshell(lambda s: self.run(node, s), state)
            return 0
        status = self.run(node, state)
        self.check_errexit(node, status, state)
        return status

    def check_errexit(self, node: Node, status: Status, state: State) -> None:
        """``set -e``: a command that fails for certain stops the script (not a test's
        ``&&``/``||`` left side, nor a negated pipeline, as bash has it)."""
        if "errexit" not in state.options or not isinstance(status, int) or status == 0:
            return
        if self.checking:  # a condition's commands, and all a function runs from one
            return
        if isinstance(node, AndOr) or (isinstance(node, Pipeline) and node.negate):
            return
        raise Exit(status, f"line {_line_of(node)}: set -e stops the script where a command fails")

    def run(self, node: Node, state: State) -> Status:
        status = self.run_node(node, state)
        state.last_status = status
        return status

    def run_node(self, node: Node, state: State) -> Status:
        if isinstance(node, Simple):
            try:
                return simple.run_simple(self, node, state)
            except Failed as failed:
                if failed.stops:
                    why = f"line {node.line}: {failed.message}, so bash stops there"
                    raise Exit(1, why) from None
                raise
        if isinstance(node, AndOr):
            return self.and_or(node, state)
        if isinstance(node, Pipeline):
            return self.pipeline(node, state)
        if isinstance(node, Commands):
            return self.sequence(node, state)
        if isinstance(node, Group):
            return self.sequence(node.body, state)
        if isinstance(node, Subshell):
            return self.subshell(lambda s: self.sequence(node.body, s), state)
        if isinstance(node, If):
            return branching.if_command(self, node, state)
        if isinstance(node, For | ArithmeticFor | While):
            return loops.loop(self, node, state)
        if isinstance(node, Case):
            return branching.case(self, node, state)
        if isinstance(node, FunctionDefinition):
            state.functions[node.name] = node
            return 0
        if isinstance(node, Arithmetic):
            self.step(node.line)
            return builtins.arithmetic_status(self, node.text, node.line, state)
        assert isinstance(node, Conditional)
        self.step(node.line)
        return builtins.conditional(self, node, state)

    def and_or(self, node: AndOr, state: State) -> Status:
        mark = len(self.decided_by)
        status = self.checked(node.first, state)
        decided = tuple(dict.fromkeys(self.decided_by[mark:]))
        if decided and isinstance(status, int):
            del self.decided_by[mark:]
            return branching.decided(
                self,
                lambda s: self.chain(node.rest, status, s),
                decided,
                state,
                [lambda s: self.chain(node.rest, int(status == 0), s)],
            )
        return self.chain(node.rest, status, state)

    def chain(self, rest: tuple[tuple[str, Node], ...], status: Status, state: State) -> Status:
        """The rest of an ``&&``/``||`` list after a command that ended with ``status``."""
        for position, (operator, pipeline) in enumerate(rest):
            if isinstance(status, Unknown):
                remaining = rest[position:]
                bodies = [
                    lambda s, outcome=outcome, remaining=remaining: self.chain(
                        remaining, outcome, s
                    )
                    for outcome in (0, 1)
                ]
                return branching.branches(self, bodies, status.reason, state)
            if (status == 0) == (operator == "&&"):
                mark = len(self.decided_by)
                last = position == len(rest) - 1
                status = self.run(pipeline, state) if last else self.checked(pipeline, state)
                decided = tuple(dict.fromkeys(self.decided_by[mark:]))
                if decided and isinstance(status, int) and position < len(rest) - 1:
                    del self.decided_by[mark:]
                    remaining, taken = rest[position + 1 :], status
                    return branching.decided(
                        self,
                        lambda s, r=remaining, t=taken: self.chain(r, t, s),
                        decided,
                        state,
                        [lambda s, r=remaining, t=taken: self.chain(r, int(t == 0), s)],
                    )
                if position == len(rest) - 1:
                    self.check_errexit(pipeline, status, state)
        return status

    def checked(self, node: Node, state: State) -> Status:
        """A command whose failure a list tests (``a && b``, ``! a``): set -e does not stop."""
        self.checking += 1
        try:
            return self.run(node, state)
        finally:
            self.checking -= 1

    def pipeline(self, node: Pipeline, state: State) -> Status:
        status: Status = 0
        if len(node.commands) == 1:
            status = self.run(node.commands[0], state)
        else:
            for command in node.commands:  # each side runs in a subshell of its own
                status = self.subshell(lambda s, command=command: self.run(command, s), state)
        if node.negate and isinstance(status, int):
            return int(status == 0)
        return status

    def subshell(self, body: Callable[[State], Status], state: State) -> Status:
        """A subshell: its variables never come back; its commands and output do."""
        inner = state.copy()
        try:
            status = body(inner)
        except Exit as exit_:
            status = exit_.status
        except (Return, Break):
            status = 0
        if state.output is not None:
            state.output[:] = inner.output or []
            state.impure = state.impure or inner.impure
        return status

    # --- commands ---------------------------------------------------------------------------

    def check_nounset(self, scope: Scope, state: State, line: int) -> None:
        """``set -u``: bash stops where a plain ``$NAME`` (not ``${NAME:-}``) of an unset
        variable is expanded."""
        if "nounset" in state.options and scope.unset_used:
            name = scope.unset_used[0]
            why = f"${name} is not set, so set -u stops the script there ({not_set(name)})"
            raise Exit(1, f"line {line}: {why}")

    def command(self, words: list[ExpandedWord], node: Simple, state: State) -> Status:
        """Run a command by its name: a function, a builtin, or an external command (recorded)."""
        name = words[0].text if not words[0].unknown else None
        if name is not None and name in state.functions:
            return simple.call(self, state.functions[name], words, state)
        builtin = builtins.BUILTINS.get(name or "")
        if builtin is not None:
            return builtin(self, words, node, state)
        return self.external(words, node, state)

    def external(self, words: list[ExpandedWord], node: Simple, state: State) -> Status:
        scope = self.scope(state)
        environment = tuple(
            (target, assignments.prefix_word(token, scope))
            for token in node.assignments
            if isinstance(token, Word) and (target := assignments.target_name(token))
        )
        condition = state.condition
        if state.decided_by:
            names = ", ".join(f"${n}" for n in state.decided_by)
            condition = condition or f"a test on {names}, which the script does not set"
        shown = tuple(replace(w, text=readable(w.text)) if "\x01" in w.text else w for w in words)
        captured = state.output is not None
        command = Command(shown, environment, node.line, condition, self.reparsing > 0, captured)
        self.commands.append(command)
        if state.output is not None:
            state.impure = state.impure or f"{clipped(words[0].text)} (line {node.line})"
        if words[0].unknown:
            state.poison(f"line {node.line}: a command whose name is {words[0].unknown}")
        nested.run_nested_shell(self, words, node, state)
        nested.run_heredoc_script(self, words, node, state)
        return Unknown(f"the outcome of {clipped(words[0].text)} (line {node.line})")

    def enter(self, line: int, what: str) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise self.error(line, f"{what} nests more than {MAX_DEPTH} calls deep")

    def run_text(
        self,
        text: Text,
        line: int,
        state: State,
        what: str,
        source: str | None = None,
        reparsed: bool = True,
    ) -> Status:
        """Run script text that came from a value (``eval``, ``bash -c``, a command
        substitution: placed on ``line``, each character where the script wrote it) or from a
        file (``source``: its own lines)."""
        key = (source or f"{line}", text.text)
        if key not in self.parsed:
            placement = None if source else Placement(text.offsets, line)
            self.parsed[key] = parse(
                text.text, source or f"{self.source}:{line} ({what})", placement
            )
        self.enter(line, what)
        self.reparsing += reparsed
        try:
            return self.sequence(self.parsed[key], state)
        finally:
            self.depth -= 1
            self.reparsing -= reparsed


def _line_of(node: Node) -> int:
    if isinstance(node, AndOr):
        return _line_of(node.first)
    if isinstance(node, Group | Commands):
        items = node.body.items if isinstance(node, Group) else node.items
        return _line_of(items[0][0]) if items else 0
    return getattr(node, "line", 0)
