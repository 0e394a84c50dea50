"""Bash's grammar over the lexer's tokens: the commands of a script as a tree (lists, ``&&``/``||``,
pipelines, ``if``, ``for``, ``while``/``until``, ``case``, groups, subshells, functions,
``(( ))`` and ``[[ ]]``), as bash's own parser builds it.  ``ray_layout.shell.interpreter`` runs
the tree.  Nesting is bounded, so a hostile script ends in one line, never a ``RecursionError``.
"""

from __future__ import annotations

from ray_layout.shell.cursor import Cursor, line_of, shown
from ray_layout.shell.lexer import tokenize
from ray_layout.shell.refusal import ShellError
from ray_layout.shell.relocate import Placement, placed
from ray_layout.shell.syntax import (
    DECLARATIONS,
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
    assignment_target,
)
from ray_layout.shell.tokens import ArrayLiteral, Heredoc, Operator, Token, Word

MAX_DEPTH = 100  # compound commands inside each other
# Each takes the word after it (its target), but << and <<-, whose body is a token of its own.
REDIRECTIONS = frozenset({">", ">>", ">&", ">|", "&>", "&>>", "<", "<&", "<>", "<<<"})
_HEREDOCS = frozenset({"<<", "<<-"})
_CLOSERS = frozenset({"then", "elif", "else", "fi", "do", "done", "esac", "}"})
_ENDS_COMMAND = frozenset({";", "\n", "&", "&&", "||", "|", "|&", ")", ";;"})


def parse(text: str, source: str, placement: Placement | None = None) -> Commands:
    """The script's commands; a :class:`ShellError` naming the line of what bash would refuse.
    ``placement`` puts text that came from elsewhere (an ``eval``'s string, ``bash -c``) back
    where its characters were written: each one's offset in the script, and the line."""
    every = tokenize(text, source)
    if placement is not None:
        every = [placed(token, placement) for token in every]
    tokens, heredocs = _heredocs_apart(every)
    parser = _Parser(tokens, text, source)
    parser.heredocs = heredocs
    try:
        body = parser.sequence(frozenset())
    except RecursionError:
        raise ShellError(f"{source}: commands nested too deeply to read") from None
    if parser.position < len(tokens):
        raise parser.error(f"unexpected {shown(tokens[parser.position])}")
    return body


def _heredocs_apart(tokens: list[Token]) -> tuple[list[Token], dict[int, Heredoc]]:
    """The tokens without here-document bodies, and each body by the ``<<`` it belongs to
    (bodies follow their line in the order of their operators)."""
    kept: list[Token] = []
    pending: list[Operator] = []
    bodies: dict[int, Heredoc] = {}
    for token in tokens:
        if isinstance(token, Heredoc):
            if pending:
                bodies[id(pending.pop(0))] = token
            continue
        if isinstance(token, Operator) and token.text in _HEREDOCS:
            pending.append(token)
        kept.append(token)
    return kept, bodies


class _Parser(Cursor):
    def __init__(self, tokens: list[Token], text: str, source: str) -> None:
        super().__init__(tokens, source)
        self.text, self.depth = text, 0
        self.heredocs: dict[int, Heredoc] = {}

    # --- lists --------------------------------------------------------------------------------

    def sequence(self, ends: frozenset[str]) -> Commands:
        """Commands up to one of ``ends`` (reserved words, or ``)``/``;;``) or the end."""
        items: list[tuple[Node, bool]] = []
        while True:
            while self.at_operator("\n", ";"):
                self.take()
            token = self.peek()
            if token is None or self.at_end(ends):
                return Commands(tuple(items))
            node = self.and_or()
            background = self.at_operator("&")
            if self.at_operator(";", "&", "\n"):
                self.take()
            elif not (self.peek() is None or self.at_end(ends)):
                raise self.error(f"unexpected {shown(self.peek())}")  # type: ignore[arg-type]
            items.append((node, background))

    def at_end(self, ends: frozenset[str]) -> bool:
        token = self.peek()
        if isinstance(token, Operator):
            return token.text in ends
        return isinstance(token, Word) and token.plain in ends

    def and_or(self) -> Node:
        first = self.pipeline()
        rest = []
        while self.at_operator("&&", "||"):
            operator = self.take().text  # type: ignore[union-attr]
            self.skip_newlines()
            rest.append((operator, self.pipeline()))
        return AndOr(first, tuple(rest)) if rest else first

    def pipeline(self) -> Node:
        if self.peek() is None:
            raise self.error("a command is missing at the end of the script")
        line = line_of(self.peek())  # type: ignore[arg-type]
        negate = self.at_word("!")
        if negate:
            self.take()
        commands = [self.command()]
        while self.at_operator("|", "|&"):
            self.take()
            self.skip_newlines()
            commands.append(self.command())
        if len(commands) == 1 and not negate:
            return commands[0]
        return Pipeline(tuple(commands), negate, line)

    # --- commands -----------------------------------------------------------------------------

    def command(self) -> Node:
        token = self.peek()
        if token is None:
            raise self.error("a command is missing at the end of the script")
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise self.error(f"commands nested more than {MAX_DEPTH} deep")
        try:
            node = self.compound(token)
            if node is None:
                return self.simple()
            self.skip_redirections()
            return node
        finally:
            self.depth -= 1

    def compound(self, token: Token) -> Node | None:
        keyword = token.plain if isinstance(token, Word) else None
        if keyword in _CLOSERS:
            raise self.error(f"unexpected '{keyword}'")
        builders = {
            "if": self.if_command,
            "for": self.for_command,
            "while": self.while_command,
            "until": self.while_command,
            "case": self.case_command,
            "{": self.group,
            "function": self.function,
            "[[": self.conditional,
        }
        if keyword in builders:
            return builders[keyword]()
        if keyword in ("select", "coproc"):
            raise self.error(f"'{keyword}' needs a terminal, which a launch does not have")
        if isinstance(token, Operator) and token.text == "(":
            following = self.peek(1)
            if (
                isinstance(following, Operator)
                and following.text == "("
                and (following.start == token.start + 1)
            ):
                return self.arithmetic()
            return self.subshell()
        following = self.peek(1)
        if (
            isinstance(token, Word)
            and keyword is not None
            and isinstance(following, Operator)
            and following.text == "("
            and isinstance(self.peek(2), Operator)
            and self.peek(2).text == ")"  # type: ignore[union-attr]
        ):
            self.position += 3
            self.skip_newlines()
            return FunctionDefinition(keyword, self.command(), token.line)
        return None

    def simple(self) -> Simple:
        line = line_of(self.peek())  # type: ignore[arg-type]
        assignments: list[Word | ArrayLiteral] = []
        words: list[Word | ArrayLiteral] = []
        heredoc, herestring = None, None
        while (token := self.peek()) is not None:
            if isinstance(token, Operator):
                if token.text in _ENDS_COMMAND or token.text == "(":
                    break
                self.take()
                heredoc = self.heredocs.get(id(token), heredoc)
                if token.text in REDIRECTIONS:
                    target = self.peek()
                    if not isinstance(target, Word):
                        raise self.error(f"'{token.text}' needs a file name")
                    self.take()
                    herestring = target if token.text == "<<<" else herestring
                continue
            self.take()
            if not words and assignment_target(token) is not None:
                assignments.append(token)  # type: ignore[arg-type]
            elif isinstance(token, ArrayLiteral) and not (
                words and isinstance(words[0], Word) and words[0].plain in DECLARATIONS
            ):
                raise self.error(f"an array '{token.name}=(...)' is no argument of a command")
            else:
                words.append(token)  # type: ignore[arg-type]
        if not assignments and not words:
            raise self.error(f"unexpected {shown(self.peek())}")  # type: ignore[arg-type]
        return Simple(tuple(assignments), tuple(words), line, heredoc, herestring)

    def skip_redirections(self) -> None:
        while self.at_operator(*REDIRECTIONS, *_HEREDOCS):
            operator = self.take().text  # type: ignore[union-attr]
            if operator in REDIRECTIONS:
                if not isinstance(self.peek(), Word):
                    raise self.error(f"'{operator}' needs a file name")
                self.take()

    def group(self) -> Group:
        line = self.take().line
        body = self.sequence(frozenset({"}"}))
        self.expect_word("}", "{", line)
        return Group(body)

    def subshell(self) -> Subshell:
        line = self.take().line
        body = self.sequence(frozenset({")"}))
        if not self.at_operator(")"):
            raise self.error(f"a '(' (line {line}) is never closed")
        self.take()
        return Subshell(body, line)

    def function(self) -> FunctionDefinition:
        line = self.take().line
        name = self.peek()
        if not isinstance(name, Word) or name.plain is None:
            raise self.error("'function' needs a name")
        self.take()
        if self.at_operator("(") and isinstance(self.peek(1), Operator):
            self.position += 2
        self.skip_newlines()
        return FunctionDefinition(name.plain, self.command(), line)

    def if_command(self) -> If:
        line = self.take().line
        clauses = []
        otherwise = None
        while True:
            condition = self.sequence(frozenset({"then"}))
            self.expect_word("then", "if", line)
            body = self.sequence(frozenset({"elif", "else", "fi"}))
            clauses.append((condition, body))
            if self.at_word("elif"):
                self.take()
                continue
            if self.at_word("else"):
                self.take()
                otherwise = self.sequence(frozenset({"fi"}))
            self.expect_word("fi", "if", line)
            return If(tuple(clauses), otherwise, line)

    def for_command(self) -> For | ArithmeticFor:
        line = self.take().line
        if self.at_operator("("):
            header = self.arithmetic_text()
            parts = header.split(";")
            if len(parts) != 3:
                raise self.error("'for ((' needs three expressions", line)
            self.skip_separator()
            body = self.loop_body(line)
            return ArithmeticFor(parts[0], parts[1], parts[2], body, line)
        name = self.peek()
        if not isinstance(name, Word) or not (name.plain or "").isidentifier():
            raise self.error("'for' needs a variable name", line)
        self.take()
        self.skip_newlines()
        words: tuple[Word, ...] | None = None
        if self.at_word("in"):
            self.take()
            collected = []
            while isinstance(self.peek(), Word):
                collected.append(self.take())
            words = tuple(collected)  # type: ignore[arg-type]
        self.skip_separator()
        return For(name.plain, words, self.loop_body(line), line)  # type: ignore[arg-type]

    def skip_separator(self) -> None:
        if self.at_operator(";"):
            self.take()
        self.skip_newlines()

    def loop_body(self, line: int) -> Commands:
        self.expect_word("do", "for", line)
        body = self.sequence(frozenset({"done"}))
        self.expect_word("done", "do", line)
        return body

    def while_command(self) -> While:
        token = self.take()
        keyword = token.plain  # type: ignore[union-attr]
        condition = self.sequence(frozenset({"do"}))
        self.expect_word("do", keyword, token.line)
        body = self.sequence(frozenset({"done"}))
        self.expect_word("done", keyword, token.line)
        return While(condition, body, keyword == "until", token.line)

    def case_command(self) -> Case:
        line = self.take().line
        word = self.peek()
        if not isinstance(word, Word):
            raise self.error("'case' needs a word", line)
        self.take()
        self.skip_newlines()
        self.expect_word("in", "case", line)
        items = []
        while True:
            self.skip_newlines()
            if self.at_word("esac"):
                self.take()
                return Case(word, tuple(items), line)
            if self.peek() is None:
                raise self.error("'case' is never closed by 'esac'", line)
            if self.at_operator("("):
                self.take()
            patterns = []
            while True:
                pattern = self.peek()
                if not isinstance(pattern, Word):
                    raise self.error("a 'case' pattern is missing")
                patterns.append(self.take())
                if not self.at_operator("|"):
                    break
                self.take()
            if not self.at_operator(")"):
                raise self.error("a 'case' pattern needs ')'")
            self.take()
            body = self.sequence(frozenset({";;", "esac"}))
            if self.at_operator(";;"):
                self.take()
            items.append((tuple(patterns), body))

    def conditional(self) -> Conditional:
        line = self.take().line
        collected: list[Word | Operator] = []
        while not self.at_word("]]"):
            token = self.peek()
            if token is None or (isinstance(token, Operator) and token.text == "\n"):
                raise self.error(f"'[[' (line {line}) is never closed by ']]'")
            collected.append(self.take())  # type: ignore[arg-type]
        self.take()
        return Conditional(tuple(collected), line)

    def arithmetic(self) -> Arithmetic:
        line = self.peek().line  # type: ignore[union-attr]
        return Arithmetic(self.arithmetic_text(), line)

    def arithmetic_text(self) -> str:
        """The text between ``((`` and its ``))``, from the script itself; the tokens inside
        are stepped over."""
        opening = self.peek()
        assert isinstance(opening, Operator)
        start = opening.start + 2
        depth, index = 0, start
        while index < len(self.text):
            char = self.text[index]
            if char == "(":
                depth += 1
            elif char == ")":
                if depth == 0 and self.text.startswith("))", index):
                    break
                depth -= 1
            index += 1
        else:
            raise self.error(f"'((' (line {opening.line}) is never closed")
        while (token := self.peek()) is not None and _offset(token) < index + 2:
            self.take()
        return self.text[start:index]


def _offset(token: Token) -> int:
    if isinstance(token, Operator):
        return token.start
    if isinstance(token, Word):
        return token.start
    return token.words[0].start if isinstance(token, ArrayLiteral) and token.words else 0
