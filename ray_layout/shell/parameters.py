"""A braced parameter expansion as bash's lexer reads it: ``${NAME}``, ``${10}``, ``${A[i]}``,
``${#A}``, ``${!V}``, ``${!A[@]}``, and the operators with their words (defaults, patterns,
slices, case changes).  The word after an operator is read with its own quotes, inside double
quotes too: a pattern stays a pattern."""

from __future__ import annotations

from ray_layout.shell.scanner import Scanner
from ray_layout.shell.tokens import SPECIAL_PARAMETERS, Part, Reference

# After ``${NAME``: each before any that is its prefix; ``#``/``%`` take a second (``##``).
_BRACE_OPERATORS = (
    *(":-", ":=", ":+", ":?", "-", "=", "+", "?"),
    *("#", "%", "/", "^^", "^", ",,", ",", ":"),
)


def braced(lexer: Scanner, quoted: bool, depth: int) -> Reference:
    start, line = lexer.pos, lexer.line
    lexer.advance(2)
    length = lexer.peek() == "#" and lexer.peek(1) not in ("}", "")
    indirect = lexer.peek() == "!"
    lexer.advance(length or indirect)
    name_start = lexer.pos
    if lexer.peek().isdigit():
        while lexer.peek().isdigit():
            lexer.advance()
    elif lexer.peek() in SPECIAL_PARAMETERS:
        lexer.advance()
    else:
        while lexer.peek().isascii() and (lexer.peek().isalnum() or lexer.peek() == "_"):
            lexer.advance()
    name = lexer.text[name_start : lexer.pos]
    index = None
    if lexer.peek() == "[":
        close = lexer.text.find("]", lexer.pos)
        if close < 0:
            raise lexer.error("a '${NAME[' is never closed", line)
        index = lexer.text[lexer.pos + 1 : close]
        lexer.advance(close - lexer.pos + 1)
    operator = next((op for op in _BRACE_OPERATORS if lexer.text.startswith(op, lexer.pos)), None)
    argument: list[Part] = []
    replacement: list[Part] | None = None
    if operator is not None:
        lexer.advance(len(operator))
        if operator in ("#", "%") and lexer.peek() == operator:  # ## and %%: longest match
            operator += lexer.advance()
        if operator == "/" and lexer.peek() in "/#%" and lexer.peek():
            operator += lexer.advance()
        stop = "/}" if operator.startswith("/") else "}"
        # the word after the operator is read with its own quotes, inside "..." too: a
        # pattern stays a pattern, a "quoted" default loses its quotes; there a single
        # quote quotes only in a pattern, as bash reads it
        singles = not quoted or operator[0] in "#%/^,"
        argument = lexer.parts(stop=stop, quoted=False, depth=depth + 1, singles=singles)
        if operator.startswith("/") and lexer.peek() == "/":
            lexer.advance()
            replacement = lexer.parts(stop="}", quoted=False, depth=depth + 1, singles=singles)
    elif lexer.peek() != "}":
        operator = "unsupported"
        skip_to_brace(lexer, line)
    if lexer.peek() != "}":
        raise lexer.error("a '${' is never closed", line)
    lexer.advance()
    if length:
        operator = "length" if operator is None else "unsupported"
    if indirect and operator is None and index in ("@", "*"):
        operator = "keys"  # ${!A[@]}: the array's indices
    elif indirect:
        operator = "!" if operator is None and index is None else "unsupported"
    if not name:
        operator = "unsupported"
    return Reference(
        name,
        index,
        operator,
        tuple(argument),
        quoted,
        lexer.text[start : lexer.pos],
        None if replacement is None else tuple(replacement),
    )


def skip_to_brace(lexer: Scanner, line: int) -> None:
    depth = 0
    while (char := lexer.peek()) != "" and (char != "}" or depth):
        depth += (char == "{") - (char == "}")
        lexer.advance()
    if char == "":
        raise lexer.error("a '${' is never closed", line)
