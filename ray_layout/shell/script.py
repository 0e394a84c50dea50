"""Run a bash launch script's assignments without a shell: what each variable holds, and the
commands the script would run with their words expanded.

The reader follows what a launch script does to build its command line: assignments and
``export``, arrays and ``+=``, ``${VAR:-default}`` and the other defaults, ``$((arithmetic))``
and ``printf -v`` on plain values, and ``if``/``&&``/``||`` on tests of plain values
(``[ "$X" = 1 ]``, ``-z``, ``-n``, ``-eq``...).  What needs a real shell (a command
substitution, a loop, an ``if`` on a value from the job's environment, a ``case``) leaves the
variables it sets *unresolved*, each with the line and the reason, so that a flag that needs one
is an error naming it, never a silent pick of one branch.  A variable the script never sets
comes from the job's environment: ``environment`` (``--env NAME=VALUE``) gives it, and also fills
a variable the script sets in a way this reader cannot follow.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace

from ray_layout.shell.arithmetic import printf
from ray_layout.shell.expand import (
    ExpandedWord,
    Text,
    Unresolved,
    Value,
    elements,
    expand,
    expand_whole,
    same,
)
from ray_layout.shell.grammar import (
    OPENERS,
    PIPES,
    SEPARATORS,
    and_or_end,
    assignment,
    block_body,
    command_end,
    evaluate_test,
    if_clauses,
    is_function_definition,
    matching_end,
    matching_parenthesis,
    next_brace,
    value_of_assignment,
)
from ray_layout.shell.lexer import tokenize
from ray_layout.shell.tokens import ArrayLiteral, Heredoc, Operator, Token, Word

# Each takes the word after it (its target), but << and <<-, whose body is a token of its own.
_REDIRECTIONS = frozenset({">", ">>", ">&", ">|", "&>", "&>>", "<", "<&", "<>", "<<<"})
_DECLARATIONS = frozenset({"export", "declare", "typeset", "local", "readonly"})


@dataclass(frozen=True)
class Command:
    """A simple command: its words, the ``NAME=value`` prefixes that set its environment, and
    the condition it runs under (None: always)."""

    words: tuple[ExpandedWord, ...]
    environment: tuple[tuple[str, ExpandedWord], ...]
    line: int
    condition: str | None


@dataclass
class _State:
    variables: dict[str, Value]
    exported: dict[str, int] = field(default_factory=dict)  # name -> line
    commands: list[Command] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    condition: str | None = None
    lines: dict[str, int] = field(default_factory=dict)  # name -> line of its last assignment


@dataclass(frozen=True)
class ScriptReading:
    """What the script leaves behind: every variable, what it exports, the commands it runs."""

    variables: Mapping[str, Value]
    exported: tuple[str, ...]
    commands: tuple[Command, ...]
    notes: tuple[str, ...]
    environment: Mapping[str, str]  # the --env values it was read with
    lines: Mapping[str, int]  # each variable's last assignment


def read_script(
    text: str, source: str, environment: Mapping[str, str] | None = None
) -> ScriptReading:
    """Read ``text`` (a bash script) as bash would run its assignments; ``environment`` is the
    job's environment as far as the user gave it."""
    given = dict(environment or {})
    state = _State({name: Text.of(value) for name, value in given.items()})
    _Runner(source, given).run(tokenize(text, source), state)
    return ScriptReading(
        state.variables,
        tuple(state.exported),
        tuple(state.commands),
        tuple(dict.fromkeys(state.notes)),
        given,
        state.lines,
    )


class _Runner:
    def __init__(self, source: str, environment: Mapping[str, str]) -> None:
        self.source, self.environment = source, environment

    def run(self, tokens: list[Token], state: _State) -> None:
        position = 0
        while position < len(tokens):
            position = self.statement(tokens, position, state)

    # --- statements -------------------------------------------------------------------------

    def statement(self, tokens: list[Token], start: int, state: _State) -> int:
        token = tokens[start]
        if isinstance(token, Operator) and token.text in SEPARATORS | {"&&", "||"} | PIPES:
            return start + 1
        if isinstance(token, Heredoc):
            return start + 1
        keyword = token.plain if isinstance(token, Word) else None
        if keyword == "if":
            return self.if_statement(tokens, start, state)
        if keyword == "{":  # a group: its commands run in this shell
            end = matching_end(tokens, start, "{", "}", self.source)
            self.run(tokens[start + 1 : end - 1], state)
            return end
        if keyword == "function" or (
            isinstance(token, Word) and is_function_definition(tokens, start)
        ):
            brace = next_brace(tokens, start)
            name = tokens[start + 1].plain if keyword == "function" else keyword  # type: ignore[union-attr]
            return self.opaque_block(tokens, brace, state, what=f"function {name}")
        if keyword in OPENERS or (isinstance(token, Operator) and token.text == "("):
            return self.opaque_block(tokens, start, state)
        end = max(command_end(tokens, start), start + 1)  # a stray ")" is a step too
        command_tokens = tokens[start:end]
        after = end
        if (
            end < len(tokens)
            and isinstance(tokens[end], Operator)
            and tokens[end].text in ("&&", "||")
        ):
            return self.and_or(tokens, start, end, state)
        self.simple_command(command_tokens, state)
        return after

    def and_or(self, tokens: list[Token], start: int, end: int, state: _State) -> int:
        """``A && B`` runs B when A succeeds, ``A || B`` when it fails: a test of plain values
        decides; anything else makes B conditional."""
        outcome = self.test(tokens[start:end], state)
        if outcome is None:
            self.simple_command(tokens[start:end], state)
        operator = tokens[end].text  # type: ignore[union-attr]
        rest_start = end + 1
        while (
            rest_start < len(tokens)
            and isinstance(tokens[rest_start], Operator)
            and (
                tokens[rest_start].text == "\n"  # type: ignore[union-attr]
            )
        ):
            rest_start += 1
        rest_end = and_or_end(tokens, rest_start)
        if isinstance(outcome, bool):
            runs = outcome if operator == "&&" else not outcome
            if runs:
                self.run(tokens[rest_start:rest_end], state)
            return rest_end
        reason = outcome or f"line {tokens[start].line}: the outcome of a command"  # type: ignore[union-attr]
        self.branches([tokens[rest_start:rest_end], []], reason, state)
        return rest_end

    def if_statement(self, tokens: list[Token], start: int, state: _State) -> int:
        end = matching_end(tokens, start, "if", "fi", self.source)
        clauses = if_clauses(tokens[start + 1 : end - 1], self.source)
        for condition, body in clauses:
            if condition is None:
                self.run(body, state)
                return end
            outcome = self.test(condition, state)
            if outcome is True:
                self.run(body, state)
                return end
            if outcome is not False:
                remaining = [body] + [b for _, b in clauses[clauses.index((condition, body)) + 1 :]]
                if clauses[-1][0] is not None:
                    remaining.append([])  # no else: the state as it was is one outcome
                line = condition[0].line if condition else tokens[start].line  # type: ignore[union-attr]
                self.branches(remaining, outcome or f"line {line}: an if on a command", state)
                return end
        return end

    def branches(self, bodies: list[list[Token]], reason: str, state: _State) -> None:
        """Run each possible body on its own copy; a variable the outcomes leave different is
        unresolved, and the commands found inside run under the condition."""
        outcomes = []
        for body in bodies:
            copy = _State(
                dict(state.variables),
                dict(state.exported),
                [],
                state.notes,
                reason if state.condition is None else state.condition,
                state.lines,
            )
            self.run(body, copy)
            outcomes.append(copy)
        names = {name for outcome in outcomes for name in outcome.variables}
        for name in names:
            values = [outcome.variables.get(name) for outcome in outcomes]
            if all(same(value, values[0]) for value in values):
                if values[0] is not None:
                    state.variables[name] = values[0]
            else:
                state.variables[name] = Unresolved(f"{name} is set under {reason}")
        for outcome in outcomes:
            state.exported |= outcome.exported
            state.commands += outcome.commands

    def opaque_block(self, tokens: list[Token], start: int, state: _State, what: str = "") -> int:
        """A loop, a ``case``, a function body, a subshell or a group: its assignments need a
        real shell, so every variable it sets is unresolved; its commands are conditional."""
        token = tokens[start]
        if isinstance(token, Operator):  # ( ... ): a subshell, whose variables never come back
            end = matching_parenthesis(tokens, start, self.source)
            body, effect = tokens[start + 1 : end - 1], "subshell"
        else:
            keyword = token.plain or ""
            closing = OPENERS.get(keyword, "}")
            end = matching_end(tokens, start, keyword, closing, self.source)
            body, effect = tokens[start + 1 : end - 1], what or keyword
        reason = f"line {token.line}: a {effect} block, which needs a real shell"
        copy = _State(
            dict(state.variables),
            dict(state.exported),
            [],
            state.notes,
            state.condition or reason,
            state.lines,
        )
        self.run(block_body(body), copy)
        if effect != "subshell":
            for name, value in copy.variables.items():
                if state.variables.get(name) != value:
                    state.variables[name] = Unresolved(f"{name} is set in {reason}")
        state.commands += copy.commands
        return end

    # --- simple commands --------------------------------------------------------------------

    def simple_command(self, tokens: list[Token], state: _State) -> None:
        if not tokens:
            return
        prefixes: list[tuple[str, Word | ArrayLiteral]] = []
        index = 0
        while index < len(tokens) and (name := assignment(tokens[index])) is not None:
            prefixes.append((name, tokens[index]))  # type: ignore[arg-type]
            index += 1
        words = self.command_words(tokens[index:], state)
        if not words:  # bare assignments: they set the script's variables
            for _, token in prefixes:
                self.assign(token, state, export=False)
            return
        name = words[0].text
        if name in _DECLARATIONS:
            self.declaration(name, tokens[index + 1 :], state)
            return
        if name == "unset":
            for word in words[1:]:
                state.variables.pop(word.text, None)
            return
        if name == "printf" and len(words) > 2 and words[1].text == "-v":
            self.printf_assignment(words, state)
            return
        if name in ("source", "."):
            target = words[1].text if len(words) > 1 else ""
            state.notes.append(
                f"{self.source}:{words[0].line}: not read: {name} {target} "
                "(what it sets comes from the job's environment)"
            )
        environment = tuple(
            (n, expand_whole(t, state.variables)) for n, t in prefixes if isinstance(t, Word)
        )
        state.commands.append(Command(tuple(words), environment, words[0].line, state.condition))

    def command_words(self, tokens: list[Token], state: _State) -> list[ExpandedWord]:
        """The command's words with redirections and their targets left out (the lexer already
        took a file descriptor written against its operator, as in ``2>&1``)."""
        words: list[ExpandedWord] = []
        skip_next = False
        for token in tokens:
            if skip_next:
                skip_next = False
                continue
            if isinstance(token, Operator):
                skip_next = token.text in _REDIRECTIONS
                continue
            if isinstance(token, Heredoc | ArrayLiteral):
                continue
            words += expand(token, state.variables)
        return words

    def declaration(self, name: str, tokens: list[Token], state: _State) -> None:
        for token in tokens:
            if isinstance(token, Operator | Heredoc):
                continue
            if assignment(token) is not None:
                self.assign(token, state, export=name == "export")  # type: ignore[arg-type]
                continue
            word = token.plain or ""
            if word.startswith("-"):
                continue
            if name == "export" and word.isidentifier():
                state.exported.setdefault(word, token.line)

    def assign(self, token: Word | ArrayLiteral, state: _State, *, export: bool) -> None:
        if isinstance(token, ArrayLiteral):
            value: Value = tuple(
                Text(w.text, w.offsets, w.missing, w.unresolved)
                for word in token.words
                for w in expand(word, state.variables)
            )
            self.set(token.name, value, token.append, token.line, state)
            name = token.name
        else:
            prefix = token.unquoted_prefix
            name, _, _ = prefix.partition("=")
            append = name.endswith("+")
            name = name.removesuffix("+")
            value_word = value_of_assignment(token)
            expanded = expand_whole(value_word, state.variables) if value_word else None
            if expanded is None:
                value = Text("", ())
            elif expanded.unresolved is not None:
                value = Unresolved(f"{name} (line {token.line}) = {expanded.unresolved}")
            else:
                value = Text(expanded.text, expanded.offsets, expanded.missing)
            self.set(name, value, append, token.line, state)
        if export:
            state.exported.setdefault(name, token.line)

    def set(self, name: str, value: Value, append: bool, line: int, state: _State) -> None:
        if isinstance(value, Unresolved) and name in self.environment:
            value = Text.of(self.environment[name])  # --env fills what the reader cannot follow
        elif isinstance(value, Unresolved) and "give --env" not in value.reason:
            value = Unresolved(f"{value.reason}; give --env {name}=VALUE")
        old = state.variables.get(name)
        if append and old is not None:
            if isinstance(old, Unresolved):
                value = old
            elif isinstance(value, Unresolved):
                pass
            elif isinstance(old, Text) and isinstance(value, Text):
                value = old + value
            else:
                value = elements(old) + elements(value)
        state.variables[name] = value
        state.lines[name] = line

    def printf_assignment(self, words: list[ExpandedWord], state: _State) -> None:
        name = words[2].text
        unresolved = next((w.unresolved for w in words[3:] if w.unresolved), None)
        if unresolved is not None or len(words) < 4:
            reason = unresolved or "no format"
            self.set(
                name,
                Unresolved(f"{name} (printf -v, line {words[0].line}) = {reason}"),
                False,
                words[0].line,
                state,
            )
            return
        try:
            text = printf(words[3].text, [w.text for w in words[4:]])
        except ValueError as exc:
            value: Value = Unresolved(f"{name} (printf -v, line {words[0].line}): {exc}")
        else:
            value = Text.of(text)
        self.set(name, value, False, words[0].line, state)

    # --- tests ------------------------------------------------------------------------------

    def test(self, tokens: list[Token], state: _State) -> bool | str | None:
        """True/False for ``[ ... ]``, ``[[ ... ]]`` or ``test ...`` on plain values; a reason
        string where the test needs a value this reader does not have; None for a command that
        is not a test."""
        words = self.command_words(tokens, state)
        if not words:
            return None
        negate = words[0].text == "!"
        words = words[1:] if negate else words
        if not words or words[0].text not in ("[", "[[", "test"):
            return None
        closing = {"[": "]", "[[": "]]"}.get(words[0].text)
        if closing and words[-1].text == closing:
            words = words[:-1]
        operands = words[1:]
        unresolved = next((w.unknown for w in operands if w.unknown), None)
        if unresolved is not None:
            line = words[0].line
            return f"line {line}: a test on {unresolved}"
        outcome = evaluate_test([w.text for w in operands])
        if outcome is None:
            return f"line {words[0].line}: a test this reader does not evaluate"
        return outcome != negate


def words_of(text: Text, line: int, source: str) -> Iterator[Command]:
    """The commands inside a string a script hands to ``bash -c`` or keeps for later: read as a
    script of its own (its plain text only), offsets mapped back into the outer script."""
    reading = read_script(text.text, source)
    for command in reading.commands:
        words = tuple(
            replace(
                word,
                line=line,
                offsets=tuple(text.offsets[o] if o >= 0 else -1 for o in word.offsets),
            )
            for word in command.words
        )
        yield replace(command, words=words, line=line)
