"""The grammar of bash a launch script uses, over the lexer's tokens: where a command ends,
which reserved word closes a block, the clauses of an ``if``, what an assignment sets, and
``test``'s answer on plain values.  ``ray_layout.shell.script`` runs what these find."""

from __future__ import annotations

from ray_layout.shell.refusal import ShellError
from ray_layout.shell.tokens import ArrayLiteral, Literal, Operator, Part, Token, Word

SEPARATORS = frozenset({"\n", ";", "&", ";;"})
PIPES = frozenset({"|", "|&"})  # |& pipes the standard error too: no redirection
OPENERS = {
    "if": "fi",
    "for": "done",
    "while": "done",
    "until": "done",
    "case": "esac",
    "select": "done",
    "{": "}",
    "function": "}",
}


def evaluate_test(operands: list[str]) -> bool | None:
    """``test``'s answer for one unary or binary expression of plain values (None: another)."""
    if len(operands) == 1:
        return operands[0] != ""
    if len(operands) == 2 and operands[0] in ("-z", "-n"):
        return (operands[1] == "") == (operands[0] == "-z")
    if len(operands) == 3:
        left, operator, right = operands
        if operator in ("=", "=="):
            return left == right
        if operator == "!=":
            return left != right
        numeric = {
            "-eq": int.__eq__,
            "-ne": int.__ne__,
            "-lt": int.__lt__,
            "-le": int.__le__,
            "-gt": int.__gt__,
            "-ge": int.__ge__,
        }
        if operator in numeric:
            try:
                return numeric[operator](int(left), int(right))
            except ValueError:
                return None
    return None


def command_end(tokens: list[Token], start: int) -> int:
    """The index of the separator (or ``&&``/``||``/``|``/``|&``) that ends the command at
    ``start``."""
    index = start
    while index < len(tokens):
        token = tokens[index]
        if isinstance(token, Operator) and token.text in SEPARATORS | {"&&", "||", ")"} | PIPES:
            return index
        index += 1
    return index


def and_or_end(tokens: list[Token], start: int) -> int:
    """The end of the right side of ``&&``/``||``: one command, or a whole block."""
    if start < len(tokens):
        token = tokens[start]
        keyword = token.plain if isinstance(token, Word) else None
        if keyword in OPENERS:
            return matching_end(tokens, start, keyword, OPENERS[keyword], "script")
        if isinstance(token, Operator) and token.text == "(":
            return matching_parenthesis(tokens, start, "script")
    return command_end(tokens, start)


def at_command_start(tokens: list[Token], index: int) -> bool:
    if index == 0:
        return True
    previous = tokens[index - 1]
    if isinstance(previous, Operator):
        return previous.text in SEPARATORS | {"&&", "||", "(", ")"} | PIPES
    return isinstance(previous, Word) and previous.plain in (
        "then",
        "else",
        "do",
        "{",
        "if",
        "elif",
        "while",
        "until",
        "!",
    )


def matching_end(tokens: list[Token], start: int, opener: str, closing: str, source: str) -> int:
    """The index after the reserved word that closes the block opened at ``tokens[start]``."""
    depth = 0
    for index in range(start, len(tokens)):
        token = tokens[index]
        word = token.plain if isinstance(token, Word) else None
        if word is None or not at_command_start(tokens, index):
            continue
        if (word in OPENERS and OPENERS[word] == closing) or word == opener:
            depth += 1
        elif word == closing:
            depth -= 1
            if depth == 0:
                return index + 1
    line = tokens[start].line  # type: ignore[union-attr]
    raise ShellError(f"{source}:{line}: '{opener}' is never closed by '{closing}'")


def matching_parenthesis(tokens: list[Token], start: int, source: str) -> int:
    depth = 0
    for index in range(start, len(tokens)):
        token = tokens[index]
        if isinstance(token, Operator) and token.text in "()":
            depth += 1 if token.text == "(" else -1
            if depth == 0:
                return index + 1
    raise ShellError(f"{source}:{tokens[start].line}: a '(' is never closed")  # type: ignore[union-attr]


def is_function_definition(tokens: list[Token], start: int) -> bool:
    """``name() {``: a word, ``(``, ``)``."""
    return (
        start + 3 < len(tokens)
        and isinstance(tokens[start + 1], Operator)
        and tokens[start + 1].text == "("  # type: ignore[union-attr]
        and isinstance(tokens[start + 2], Operator)
        and tokens[start + 2].text == ")"  # type: ignore[union-attr]
    )


def next_brace(tokens: list[Token], start: int) -> int:
    """The index of the ``{`` that opens a function's body."""
    for index in range(start, len(tokens)):
        if isinstance(tokens[index], Word) and tokens[index].plain == "{":  # type: ignore[union-attr]
            return index
    raise ShellError(f"line {tokens[start].line}: a function without a '{{' body")  # type: ignore[union-attr]


def block_body(body: list[Token]) -> list[Token]:
    """A loop's body: the commands after ``do`` (the loop header is not a command)."""
    for index, token in enumerate(body):
        if isinstance(token, Word) and token.plain == "do":
            return body[index + 1 :]
    return body


def if_clauses(tokens: list[Token], source: str) -> list[tuple[list[Token] | None, list[Token]]]:
    """``cond; then body; elif cond; then body; else body`` as (condition or None, body)."""
    clauses: list[tuple[list[Token] | None, list[Token]]] = []
    condition: list[Token] | None = []
    body: list[Token] = []
    in_body, depth = False, 0
    for index, token in enumerate(tokens):
        word = token.plain if isinstance(token, Word) else None
        at_start = word is not None and at_command_start(tokens, index)
        if at_start and word in OPENERS:
            depth += 1
        elif at_start and word in set(OPENERS.values()) and depth:
            depth -= 1
        elif at_start and depth == 0 and word == "then":
            in_body = True
            continue
        elif at_start and depth == 0 and word in ("elif", "else"):
            clauses.append((condition, body))
            condition, body, in_body = ([] if word == "elif" else None), [], word == "else"
            continue
        (body if in_body else condition).append(token)  # type: ignore[union-attr]
    clauses.append((condition, body))
    return clauses


def assignment(token: Token) -> str | None:
    """The name an assignment word or array literal sets, else None."""
    if isinstance(token, ArrayLiteral):
        return token.name
    if not isinstance(token, Word):
        return None
    prefix = token.unquoted_prefix
    name, equals, _ = prefix.partition("=")
    name = name.removesuffix("+")
    if equals and name.isidentifier() and name.isascii():
        return name
    return None


def value_of_assignment(token: Word) -> Word | None:
    """The word after ``NAME=`` of an assignment."""
    first = token.parts[0]
    assert isinstance(first, Literal)
    cut = first.text.index("=") + 1
    rest: list[Part] = []
    if cut < len(first.text):
        rest.append(Literal(first.text[cut:], first.offsets[cut:], False))
    rest += token.parts[1:]
    return Word(tuple(rest), token.line, token.start, token.end) if rest else None
