"""Bash's expansions over the words of a script: parameters (``$NAME``, ``${NAME:-word}``,
``${A[@]}``, ``${#A}``), ``$((arithmetic))``, word splitting and quotes, as bash passes words to a
command.  What only a running shell knows (a command substitution, ``$$``) is *unresolved*, with
the reason; a variable nothing set expands to nothing, and is remembered as *missing* for where
its value matters."""

from __future__ import annotations

import re
from functools import lru_cache

from ray_layout.errors import clipped
from ray_layout.shell.arithmetic import BeyondReach, evaluate_arithmetic
from ray_layout.shell.braces import brace_words
from ray_layout.shell.lexer import tokenize
from ray_layout.shell.patterns import TRANSFORMS, edited, glob_regex, sliced
from ray_layout.shell.tokens import (
    Literal,
    Part,
    Reference,
    Substitution,
    Word,
    written,
    written_word,
)
from ray_layout.shell.values import (
    EMPTY,
    ExpandedWord,
    Failed,
    Gap,
    Text,
    Unresolved,
    Value,
    Variables,
    hole,
    ifs_of,
    join,
    missing_of,
    missing_reason,
    not_set,
    note_unset,
    present,
    split,
)


def expand(token: Word, variables: Variables) -> list[ExpandedWord]:
    """A word as bash passes it: unquoted expansions split on blanks, ``"${A[@]}"`` one word
    per element, an unquoted expansion to nothing no word at all.  A word with a value this
    reader does not have is one word, as written, with the reason."""
    braced = brace_words(token)
    if braced is None:
        return [_placeholder(token, "a brace expansion bash reads anew (a $NAME it lengthens)")]
    if len(braced) > 1:
        return [word for each in braced for word in expand(each, variables)]
    fields = _Fields(variables)
    try:
        fields.add(token.parts, variables, expanded=False)
    except _Unknown as unknown:
        return [_placeholder(token, str(unknown))]
    words = fields.finish()
    if not words and fields.missing:  # `--nnodes $NNODES`: a value the job's environment gives
        return [_placeholder(token, missing_reason(fields.missing), fields.missing)]
    return [ExpandedWord(f.text, token.line, f.offsets, f.unresolved, f.missing) for f in words]


class _Fields:
    """The words one word of the script becomes, built as bash builds them: ``current`` is None
    until something (a character, a quoted empty string) starts a word.  An unset variable that
    expands to nothing stays named on the word it was in (``--nnodes=$NN``), for where its
    value matters."""

    def __init__(self, variables: Variables) -> None:
        self.variables = variables
        self.done: list[Text] = []
        self.current: Text | None = None
        self.missing: tuple[str, ...] = ()  # every unset variable the word used
        self.pending: tuple[str, ...] = ()  # those that expanded to nothing between words
        self.characters = False  # the expansion so far gave characters (blanks too)
        self.null = False  # a quoted part of it gave nothing: bash's had_quoted_null

    def add(self, parts: tuple[Part, ...], variables: Variables, *, expanded: bool) -> None:
        """``parts`` in order; ``expanded``: they are a default's word (``${U:-a 'b c'}``),
        whose unquoted text is split as any expansion's result is, and its quoted text not."""
        for part in parts:
            if isinstance(part, Literal):
                text = Text(part.text, part.offsets)
                if expanded and not part.quoted:
                    self.split_in(text, split(text))
                else:
                    self.join(text)
                    self.null |= not text.text
            elif isinstance(part, Reference) and not part.quoted and takes_word(part, variables):
                if part.operator in (":=", "="):  # assigned, then split whole as bash does
                    self.value(part, reference(part, variables))
                else:
                    self.word_of(part, variables)
            else:
                self.value(part, part_value(part, variables))

    def word_of(self, part: Reference, variables: Variables) -> None:
        """A default's or alternative's word, expanded on its own as bash does.  One that gives
        no characters but a quoted null (``${V:+""}``, ``${U:-"$E"}``) keeps that null, which
        starts a word, only if no quoted part before it in the word gave nothing: bash drops it
        after one (``""$V${V:+""}`` is one word where ``V=' '``; ``x$V${V:+""}`` two).  One
        that gives characters and a quoted null (``${V:+""x}``) counts as such a part."""
        null, characters, before = self.null, self.characters, self.current
        self.null = self.characters = False
        self.add(part.argument, variables, expanded=True)
        if (
            not self.characters
            and variables.get(part.name) is None
            and part.operator in ("-", ":-")
        ):
            self.split_in(Text("", (), (part.name,)), [])  # ${U:-} of an unset U: as $U
        if self.characters:
            self.null |= null
        else:
            if null and self.current is not before:  # drop the null, keep what was missing
                missing = self.current.missing if self.current is not None else ()
                if before is None:
                    self.current, self.pending = None, missing
                else:
                    self.current = before + Text("", (), missing)
            self.null = null
        self.characters |= characters

    def value(self, part: Part, value: Value) -> None:
        if isinstance(value, Unresolved):
            raise _Unknown(value.reason)
        self.missing += tuple(n for n in missing_of(value) if n not in self.missing)
        each_element = (
            isinstance(part, Reference) and part.quoted and "@" in (part.index, part.name)
        )
        unset = (
            each_element
            and isinstance(value, Text)
            and not value.text
            and part.name in value.missing  # type: ignore[union-attr]
        )
        if each_element and unset:  # "${A[@]}" of an unset A: no word, as of an empty array
            self.missing = tuple(n for n in self.missing if n != part.name)  # type: ignore[union-attr]
            return
        if isinstance(value, tuple):
            value = present(value)
        if isinstance(value, tuple) and each_element:
            for position, element in enumerate(value):
                if position:
                    self.end()
                    self.characters = True  # bash separates the elements by a blank
                self.join(element)
            self.null |= len(value) == 1 and not value[0].text
            return
        text = join(list(value), ifs_of(self.variables)[:1]) if isinstance(value, tuple) else value
        if part.quoted:
            self.join(text)
            self.null |= not text.text
            return
        elements = value if isinstance(value, tuple) else (value,)
        ifs = ifs_of(self.variables)
        self.split_in(text, [piece for element in elements for piece in split(element, ifs)])

    def split_in(self, text: Text, pieces: list[Text]) -> None:
        """An unquoted result: blanks end words, its pieces join the words around them."""
        self.characters |= bool(text.text)
        if text.text[:1].isspace():
            self.end()
        for position, piece in enumerate(pieces):
            if position:
                self.end()
            self.join(piece)
        if text.text[-1:].isspace():
            self.end()
        if not pieces and text.missing:
            if self.current is None:
                self.pending += text.missing
            else:
                self.current += Text("", (), text.missing)

    def join(self, text: Text) -> None:
        self.characters |= bool(text.text)
        start = self.current if self.current is not None else Text("", (), self.pending)
        self.current, self.pending = start + text, ()

    def end(self) -> None:
        if self.current is not None:
            self.done.append(self.current)
            self.current = None

    def finish(self) -> list[Text]:
        self.end()
        if self.pending and self.done:
            self.done[-1] += Text("", (), self.pending)
        return self.done


class _Unknown(Exception):
    """A part of the word whose value this reader does not have (the reason)."""


def expand_whole(token: Word, variables: Variables, *, holes: bool = False) -> ExpandedWord:
    """A word where bash does not split (an assignment's value, a ``NAME=`` prefix).  With
    ``holes``, a part whose value the reader lacks becomes a hole in the text (see
    :func:`hole`), the rest kept; else the whole word is unresolved."""
    text = Text("", ())
    for part in token.parts:
        value = part if isinstance(part, Literal) else part_value(part, variables)
        if isinstance(value, Unresolved) and holes:
            value = hole(written(part), value.reason)
        if isinstance(value, Unresolved):
            return ExpandedWord(written_word(token), token.line, (), value.reason)
        if isinstance(value, Literal):
            text += Text(value.text, value.offsets)
        elif isinstance(value, tuple):
            text += join(list(present(value)))
        else:
            text += value
    return ExpandedWord(text.text, token.line, text.offsets, text.unresolved, text.missing)


def part_value(part: Part, variables: Variables) -> Value:
    if isinstance(part, Substitution):
        if part.kind == "arithmetic":
            return arithmetic_text(part.text, variables, clipped(part.source))
        substitute = getattr(variables, "substitute", None)
        if part.kind == "command" and substitute is not None:
            return substitute(part)
        return Unresolved(
            f"{clipped(part.source)} (a {part.kind} substitution, which needs a real shell)"
        )
    assert isinstance(part, Reference)
    return reference(part, variables)


MAX_ARITHMETIC_LOOKUPS = 100_000  # a variable fan-out (a1='a0+a0', a2='a1+a1', ...) ends here


def arithmetic_text(body: str, variables: Variables, shown: str) -> Value:
    """``body`` (its ``$NAME`` expanded first) as bash's arithmetic; assignments set
    ``variables``.  A value this reader does not have, or text that is no arithmetic, is
    unresolved with the reason."""
    lookups = 0
    unset: list[str] = []  # names bash takes as 0: remembered on the result

    def lookup(name: str) -> str | None:
        nonlocal lookups
        lookups += 1
        if lookups > MAX_ARITHMETIC_LOOKUPS:
            raise BeyondReach(f"reads variables more than {MAX_ARITHMETIC_LOOKUPS:,} times")
        value = variables.get(name)
        if isinstance(value, tuple):  # an array's name is its first element, as in bash
            value = value[0] if value else None
        if isinstance(value, Text) and not value.unresolved:
            unset.extend(value.missing)
            return value.text
        if value is None:
            unset.append(name)
            note_unset(variables, name)
            return None
        raise _Unknown(value.reason if isinstance(value, Unresolved) else value.unresolved)

    def assign(name: str, number: int) -> None:
        variables[name] = Text.of(str(number))

    try:
        expression = expand_whole(_literal_word(body), variables)
        if expression.unresolved:
            return Unresolved(expression.unresolved)
        number = str(evaluate_arithmetic(expression.text, lookup, assign))
        missing = tuple(dict.fromkeys(expression.missing + tuple(unset)))
        return Text(number, (-1,) * len(number), missing)
    except _Unknown as exc:
        return Unresolved(f"{shown} uses {exc}")
    except BeyondReach as exc:
        return Unresolved(f"{shown}: {exc}")
    except ValueError as exc:  # bash's own error: it skips the rest of the line
        raise Failed(f"{shown}: {exc}", stops=False) from None


def reference(part: Reference, variables: Variables) -> Value:
    name, operator = part.name, part.operator
    if operator == "unsupported":
        return Unresolved(f"{clipped(part.source)} (an expansion this reader does not evaluate)")
    if name in _SHELL_ONLY or (name == "?" and variables.get("?") is None):
        return Unresolved(f"{clipped(part.source)} (a value only a running shell has)")
    if operator == "keys":
        whole = variables.get(name)
        if isinstance(whole, Unresolved):
            return whole
        items = whole if isinstance(whole, tuple) else (whole,) if whole is not None else ()
        return tuple(Text.of(str(i)) for i, item in enumerate(items) if not isinstance(item, Gap))
    if operator == "length":
        whole = variables.get(name)
        if isinstance(whole, Unresolved):
            return whole
        if part.index not in (None, "@", "*") or part.name not in ("@", "*"):
            element = _value_of(part, variables)  # ${#A[1]}; ${#A} is of ${A[0]}
            if isinstance(element, Unresolved):
                return element
            if part.index not in ("@", "*"):
                return Text.of(str(len(element.text) if isinstance(element, Text) else 0))
        count = len(present(whole)) if isinstance(whole, tuple) else len(whole.text) if whole else 0
        return Text.of(str(count))
    if takes_word(part, variables):
        word = expand_whole(Word(part.argument, 0, 0, 0), variables)
        if word.unresolved:
            return Unresolved(word.unresolved)
        unset = variables.get(name) is None and not operator.endswith("+")
        missing = word.missing + ((name,) if unset and not word.text else ())
        result = Text(word.text, word.offsets, missing)  # ${X:-} of an unset X: as $X
        if operator in (":=", "="):
            variables[name] = result
        return result
    value = _value_of(part, variables)
    if isinstance(value, Unresolved):
        return value
    if operator in (":?", "?"):
        null = value is None or (operator == ":?" and isinstance(value, Text) and not value.text)
        if null:
            message = expand_whole(Word(part.argument, 0, 0, 0), variables).text
            raise Failed(f"${name}: {message or 'parameter null or not set'}", stops=True)
    if operator in (":+", "+"):
        return EMPTY
    if operator == "!":
        target = variables.get(value.text) if isinstance(value, Text) else None
        if isinstance(value, Text) and value.text.isidentifier():
            return target if target is not None else Text("", (), (value.text,))
        return Unresolved(f"{clipped(part.source)} (an indirection this reader does not follow)")
    if value is None:  # as in bash, nothing; remembered, for where the value matters
        note_unset(variables, name)
        return Text("", (), (name,))
    if operator in TRANSFORMS:
        return _transform(part, value, variables)
    return value


def _transform(part: Reference, value: Value, variables: Variables) -> Value:
    """``${V#p}``, ``${V//p/r}``, ``${V:1:2}``, ``${V^^}``...: on each element of an array
    reference (``${A[@]#p}``), on the text otherwise."""
    operator, shown = part.operator or "", clipped(part.source)
    if operator == ":":
        bounds = expand_whole(Word(part.argument, 0, 0, 0), variables)
        if bounds.unresolved or bounds.missing:
            return Unresolved(bounds.unresolved or not_set(bounds.missing[0]))
        numbers = [arithmetic_text(text, variables, shown) for text in bounds.text.split(":", 1)]
        known = [n for n in numbers if isinstance(n, Text)]
        if len(known) < len(numbers):
            return next(n for n in numbers if isinstance(n, Unresolved))
        if part.name in ("@", "*") and isinstance(value, tuple):  # ${@:0} starts at $0
            zero = variables.get("0")
            value = ((zero,) if isinstance(zero, Text) else (Text.of(""),)) + value
        return sliced(value, [int(n.text) for n in known], shown)
    case_change = operator[0] in "^,"  # ${V^^} alone changes every character
    pattern = pattern_of(
        part.argument or (Literal("?" if case_change else "", (), False),), variables
    )
    if isinstance(pattern, Unresolved):
        return pattern
    replacement = EMPTY
    if part.replacement is not None:
        word = expand_whole(Word(part.replacement, 0, 0, 0), variables)
        if word.unresolved:
            return Unresolved(word.unresolved)
        replacement = Text(word.text, word.offsets)
    return edited(operator, value, pattern, replacement, shown)


def pattern_of(parts: tuple[Part, ...], variables: Variables) -> re.Pattern[str] | Unresolved:
    """A glob as a regular expression: quoted text matches itself, ``*``, ``?`` and ``[...]``
    outside quotes are the pattern's."""
    pieces: list[str] = []
    for part in parts:
        if isinstance(part, Literal):
            try:
                pieces.append(re.escape(part.text) if part.quoted else glob_regex(part.text))
            except re.error as exc:
                return Unresolved(f"a pattern this reader does not read ({exc})")
            continue
        value = part_value(part, variables)
        if isinstance(value, Unresolved):
            return value
        text = join(list(present(value)), " ") if isinstance(value, tuple) else value
        quoted = isinstance(part, Reference | Substitution) and part.quoted
        pieces.append(re.escape(text.text) if quoted else glob_regex(text.text))
    shown = "".join(map(written, parts))
    if getattr(variables, "extglob", False) and re.search(r"[?*+@!]\(", shown):
        return Unresolved(f"the extended pattern {clipped(shown)} (shopt -s extglob)")
    try:
        return re.compile("".join(pieces), re.DOTALL)
    except re.error as exc:
        return Unresolved(f"a pattern this reader does not read ({exc})")


_SHELL_ONLY = ("$", "!", "-")  # $? is the interpreter's, where it knows the status
_WORD_OPERATORS = (":-", "-", ":=", "=", ":+", "+")


def takes_word(part: Reference, variables: Variables) -> bool:
    """Whether ``${NAME:-word}`` (or ``-``, ``:=``, ``=``, ``:+``, ``+``) expands to its word:
    a default for a variable unset (or empty, with ``:``), an alternative for one set."""
    if part.operator not in _WORD_OPERATORS or part.name in (*_SHELL_ONLY, "?"):
        return False
    value = _value_of(part, variables)
    if isinstance(value, Unresolved):
        return False
    absent = value is None
    if part.operator.startswith(":"):
        absent = absent or value == () or (isinstance(value, Text) and not value.text)
    return absent != part.operator.endswith("+")


def _value_of(part: Reference, variables: Variables) -> Value | None:
    """What the reference names (an array's element for ``${A[1]}``, ``${A[-1]}``,
    ``${A[i+1]}``); None: nothing set it."""
    value = variables.get(part.name)
    if part.index is None and isinstance(value, tuple) and part.name not in ("@", "*"):
        return value[0] if value else None  # $A of an array is ${A[0]}
    if part.index in (None, "@", "*") or isinstance(value, Unresolved):
        return value
    position = array_index(part.index, variables, clipped(part.source))
    if isinstance(position, Unresolved):
        return position
    elements = value if isinstance(value, tuple) else (value,) if value is not None else ()
    position += len(elements) if position < 0 else 0
    found = elements[position] if 0 <= position < len(elements) else None
    return None if isinstance(found, Gap) else found


def array_index(index: str, variables: Variables, shown: str) -> int | Unresolved:
    """An array subscript: arithmetic, as bash reads it."""
    number = arithmetic_text(index, variables, shown)
    return number if isinstance(number, Unresolved) else int(number.text)  # type: ignore[union-attr]


def _placeholder(token: Word, reason: str, missing: tuple[str, ...] = ()) -> ExpandedWord:
    """A word whose value this reader does not have: the word as written, and why; only its
    first character's offset is kept (for its line), so no rewrite ever touches it."""
    text = written_word(token)
    offsets = (token.start, *(-1,) * (len(text) - 1))
    return ExpandedWord(text, token.line, offsets, reason, missing, bool(missing))


@lru_cache(maxsize=4096)  # a loop evaluates the same arithmetic each pass; words are frozen
def _literal_word(text: str) -> Word:
    """An arithmetic body as one word, so that its ``$NAME`` references expand."""
    words = [t for t in tokenize(f'"{text}"', "arithmetic") if isinstance(t, Word)]
    return words[0] if words else Word((), 0, 0, 0)
