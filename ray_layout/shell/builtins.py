"""Bash's builtins as a launch script uses them, each doing to the reader's state what it does to
bash's: assignments and declarations, ``set``/``shift``, ``eval``, ``source``, ``echo``/
``printf`` (their output for a command substitution), ``test``, ``let``, ``exit``/``return``/
``break``, ``cd``/``pwd`` and the script-directory idioms (``dirname``, ``basename``).  What a
builtin would take from outside (``read``, ``getopts``, ``mapfile``) leaves its variables
unresolved.  ``bash -c TEXT`` is an external command whose TEXT is read as a script of its own.
"""

from __future__ import annotations

import posixpath
import re

from ray_layout.errors import clipped
from ray_layout.shell.conditions import DoubleBracket, NoAnswer, case_matches, evaluate_test
from ray_layout.shell.expand import arithmetic_text, array_index, expand_whole
from ray_layout.shell.flow import Break, Exit, Return, Status, Unknown
from ray_layout.shell.printing import OUTPUT_BUILTINS
from ray_layout.shell.runner import Builtin, Runner
from ray_layout.shell.state import State
from ray_layout.shell.syntax import (
    Conditional,
    Simple,
)
from ray_layout.shell.tokens import Word
from ray_layout.shell.values import (
    GAP,
    ExpandedWord,
    Gap,
    Text,
    Unresolved,
    not_set,
    readable,
    split,
)

# --- assignments --------------------------------------------------------------------------------


# --- the builtins -------------------------------------------------------------------------------


def _true(interp: Runner, words: list[ExpandedWord], node: Simple, state: State) -> Status:
    return 0


def _false(interp: Runner, words: list[ExpandedWord], node: Simple, state: State) -> Status:
    return 1


def _test(interp: Runner, words: list[ExpandedWord], node: Simple, state: State) -> Status:
    interp.decided_by += [n for w in words[1:] for n in w.missing]
    operands = [w for w in words[1:] if not w.vanishes]  # `[ $UNSET = x ]`: bash sees `[ = x ]`
    if words[0].text == "[":
        if not operands or operands[-1].text != "]":
            return Unknown(f"line {node.line}: a '[' without ']'")
        operands = operands[:-1]
    unknown = next((w.unresolved for w in operands if w.unresolved), None)
    if unknown is not None:
        return Unknown(f"line {node.line}: a test on {unknown}")
    answer = evaluate_test([w.text for w in operands])
    if isinstance(answer, NoAnswer):
        return 2 if answer.refused else Unknown(f"line {node.line}: {answer.reason}")
    return int(not answer)


def conditional(interp: Runner, node: Conditional, state: State) -> Status:
    reader = DoubleBracket(node.tokens, interp.scope(state))
    try:
        answer = reader.evaluate()
    except Exception as exc:
        answer = NoAnswer(str(exc))
    interp.decided_by += reader.missing
    if isinstance(answer, NoAnswer):
        return Unknown(f"line {node.line}: {answer.reason}")
    return int(not answer)


def arithmetic_status(
    interp: Runner, text: str, line: int, state: State, allow_empty: bool = False
) -> Status:
    """``(( expression ))``: 0 where it is not zero; its assignments change the variables."""
    if allow_empty and not text.strip():
        return 0
    value = arithmetic_text(text, interp.scope(state), f"(( {clipped(text.strip())} ))")
    if isinstance(value, Text):
        interp.decided_by += list(value.missing)
    if isinstance(value, Unresolved):
        _unresolve_assigned(
            text, state, f"(( {clipped(text.strip())} )) (line {line}): {value.reason}"
        )
        return Unknown(f"line {line}: {value.reason}")
    return int(value.text == "0")  # type: ignore[union-attr]


def _unresolve_assigned(text: str, state: State, reason: str) -> None:
    """An arithmetic the reader could not finish may have assigned any name it holds."""
    for name in set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", text)):
        if re.search(
            rf"\b{name}\s*(?:[-+*/%&|^]|<<|>>)?=(?!=)|\+\+\s*{name}\b|\b{name}\s*\+\+|--\s*{name}\b|\b{name}\s*--",
            text,
        ):
            state.store(name, Unresolved(reason), 0)


def _let(interp: Runner, words: list[ExpandedWord], node: Simple, state: State) -> Status:
    status: Status = 1
    for word in words[1:]:
        if word.unresolved:
            state.poison(f"let of {word.unresolved} (line {node.line})")
            return Unknown(word.unresolved)
        status = arithmetic_status(interp, word.text, node.line, state)
    return status


def _set(interp: Runner, words: list[ExpandedWord], node: Simple, state: State) -> Status:
    arguments = words[1:]
    names = {"e": "errexit", "u": "nounset"}
    while arguments and arguments[0].text[:1] in "-+" and arguments[0].text not in ("-", "--"):
        flag = arguments.pop(0).text
        turn_on = flag[0] == "-"
        letters = flag[1:]
        if "o" in letters and arguments:  # -o NAME, also at the end of -euxo
            named = arguments.pop(0).text
            letters = letters.replace("o", "") + {"errexit": "e", "nounset": "u"}.get(named, "")
        for letter in letters:
            if letter in names:
                (state.options.add if turn_on else state.options.discard)(names[letter])
    if arguments and arguments[0].text in ("-", "--"):
        arguments = arguments[1:]
    elif not arguments:
        return 0
    unknown = next((w.unresolved for w in arguments if w.unresolved), None)
    if unknown is not None:
        state.positional = Unresolved(f"set -- (line {node.line}) of {unknown}")
    else:
        state.positional = tuple(Text(w.text, w.offsets, w.missing) for w in arguments)
    state.arguments_given = True
    return 0


def _shift(interp: Runner, words: list[ExpandedWord], node: Simple, state: State) -> Status:
    count_text = words[1].text if len(words) > 1 else "1"
    if isinstance(state.positional, Unresolved):
        return Unknown(state.positional.reason)
    if not count_text.isdigit():
        return Unknown(f"shift {clipped(count_text)}")
    count = int(count_text)
    if count > len(state.positional):
        return 1
    if not state.arguments_given and count:
        interp.decided_by.append("#")
    state.positional = state.positional[count:]
    return 0


def _unset(interp: Runner, words: list[ExpandedWord], node: Simple, state: State) -> Status:
    functions = any(w.text == "-f" for w in words[1:])
    for word in words[1:]:
        if word.text.startswith("-"):
            continue
        element = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)\[(.+)\]", word.text)
        if word.unresolved:
            state.poison(f"unset of {word.unresolved} (line {node.line})")
        elif element:
            _unset_element(interp, element[1], element[2], node, state)
        elif functions:
            state.functions.pop(word.text, None)
        else:
            state.remove(word.text)
    return 0


def _unset_element(interp: Runner, name: str, index: str, node: Simple, state: State) -> None:
    """``unset 'A[i]'``: the element leaves a gap; the indices after it stay."""
    value = state.lookup(name)
    items = value if isinstance(value, tuple) else (value,) if isinstance(value, Text) else ()
    position = array_index(index, interp.scope(state), f"{name}[{index}]")
    if isinstance(position, Unresolved) or isinstance(value, Unresolved):
        state.store(name, Unresolved(f"unset {name}[{index}] (line {node.line})"), node.line)
        return
    position += len(items) if position < 0 else 0
    if 0 <= position < len(items):
        kept = (*items[:position], GAP, *items[position + 1 :])
        while kept and isinstance(kept[-1], Gap):  # bash's next index follows the last set one
            kept = kept[:-1]
        state.store(name, kept, node.line)


def _eval(interp: Runner, words: list[ExpandedWord], node: Simple, state: State) -> Status:
    """``eval`` of known words runs them; a value the reader lacks inside them stays a hole (one
    word, said in a note); a word it lacks as a whole leaves everything after unknown."""
    whole = next((w.unresolved for w in words[1:] if w.unresolved and "\x01" not in w.text), None)
    if whole is not None:
        state.poison(f"the eval at line {node.line} of {whole}")
        interp.notes.append(
            f"{interp.source}:{node.line}: eval of {whole}: what it sets is unknown"
        )
        return Unknown(whole)
    held = [readable(w.text) for w in words[1:] if w.unresolved]
    if held:
        interp.notes.append(
            f"{interp.source}:{node.line}: eval of text holding values this reader does not "
            f"have ({clipped(held[0], 60)}): each taken as one word"
        )
    text = Text("", ())
    for position, word in enumerate(words[1:]):
        text += (Text.of(" ") if position else Text("", ())) + Text(
            word.text, word.offsets, word.missing
        )
    return interp.run_text(text, node.line, state, "eval")


def _source(interp: Runner, words: list[ExpandedWord], node: Simple, state: State) -> Status:
    if len(words) < 2:
        return 2
    target = words[1]
    if target.unknown:
        state.poison(f"source of {target.unknown} (line {node.line})")
        return Unknown(target.unknown)
    here = posixpath.dirname(state.sources[0]) if state.sources else ""
    path = posixpath.normpath(
        target.text if posixpath.isabs(target.text) else posixpath.join(here, target.text)
    )
    text = interp.read_file(path) if interp.read_file is not None else None
    if text is None:
        why = f"source {clipped(target.text)} (line {node.line}), a file this reader did not read"
        state.poison(why)
        interp.notes.append(f"{interp.source}:{node.line}: not read: {clipped(target.text)}")
        return Unknown(why)
    saved = state.positional
    if len(words) > 2:
        state.positional = tuple(Text(w.text, w.offsets, w.missing) for w in words[2:])
    state.sources.insert(0, path)
    interp.frames += 1
    try:
        return interp.run_text(Text.of(text), node.line, state, f"source {path}", source=path)
    except Return as returned:
        return returned.status
    finally:
        interp.frames -= 1
        state.sources.pop(0)
        if len(words) > 2:
            state.positional = saved


def _exit(interp: Runner, words: list[ExpandedWord], node: Simple, state: State) -> Status:
    status = int(words[1].text) if len(words) > 1 and words[1].text.isdigit() else 0
    why = f"line {node.line}: exit {status}"
    if state.decided_by:
        names = ", ".join(f"${n}" for n in state.decided_by)
        why += f", reached because {names} {'is' if len(state.decided_by) == 1 else 'are'} not set"
        why += f" ({not_set(state.decided_by[0])})"
    raise Exit(status, why)


def _return(interp: Runner, words: list[ExpandedWord], node: Simple, state: State) -> Status:
    status = int(words[1].text) if len(words) > 1 and words[1].text.isdigit() else 0
    if not interp.frames:  # outside a function or a sourced file: bash says so, and goes on
        return 1
    raise Return(status)


def _break(interp: Runner, words: list[ExpandedWord], node: Simple, state: State) -> Status:
    levels = int(words[1].text) if len(words) > 1 and words[1].text.isdigit() else 1
    if not interp.loops:  # outside a loop: bash says so, and goes on
        return 0
    raise Break(max(levels, 1), again=words[0].text == "continue")


def _read(interp: Runner, words: list[ExpandedWord], node: Simple, state: State) -> Status:
    """``read [-r] [-a ARRAY] NAMES <<< word``: the line split on IFS, the last name taking the
    rest; from anywhere but a here-string, what only the running job has."""
    line = whole_word(interp, node.herestring, state) if node.herestring else None
    options = [w.text for w in words[1:] if w.text.startswith("-")]
    names = [w.text for w in words[1:] if not w.text.startswith("-")]
    if line is None or line.unresolved or set("".join(options)) - set("-ra"):
        return _outside(interp, words, node, state)
    ifs = interp.scope(state).get("IFS")
    separators = ifs.text if isinstance(ifs, Text) else " \t\n"
    fields = split(Text(line.text, line.offsets, line.missing), separators)
    if "a" in "".join(options):
        state.store(names[0], tuple(fields), node.line)
        return 0
    names = names or ["REPLY"]
    for index, name in enumerate(names):
        if index < len(names) - 1:
            value = fields[index] if index < len(fields) else Text("", ())
        else:  # the last name takes the rest of the line, as written between the fields
            rest = fields[index:]
            start = line.text.find(rest[0].text) if rest else -1
            value = (
                Text(line.text[start:].strip(separators), (), line.missing)
                if rest
                else Text("", ())
            )
        state.store(name, value, node.line)
    return 0


def _outside(interp: Runner, words: list[ExpandedWord], node: Simple, state: State) -> Status:
    """``read``, ``getopts``, ``mapfile``: their variables come from outside the script."""
    reason = f"{words[0].text} at line {node.line}, which reads what only the running job has"
    names = [w.text for w in words[1:] if w.text.isidentifier()]
    if words[0].text == "getopts":
        names = [*names[1:], "OPTARG", "OPTIND"]
    for name in names or ["REPLY"]:
        state.store(name, Unresolved(reason), node.line)
    state.impure = state.impure or words[0].text
    return Unknown(reason)


def _command(interp: Runner, words: list[ExpandedWord], node: Simple, state: State) -> Status:
    """``command NAME ...`` runs NAME bypassing functions; ``command -v`` asks the file system."""
    rest = words[1:]
    if not rest or rest[0].text in ("-v", "-V"):
        state.impure = state.impure or "command -v"
        return Unknown(f"command -v (line {node.line}), which asks the job's file system")
    if rest[0].text == "-p":
        rest = rest[1:]
    builtin = BUILTINS.get(rest[0].text) if rest else None
    if builtin is not None:
        return builtin(interp, rest, node, state)
    return interp.external(rest, node, state) if rest else 0


def _exec(interp: Runner, words: list[ExpandedWord], node: Simple, state: State) -> Status:
    if len(words) == 1:
        return 0  # exec with redirections only
    status = interp.command(words[1:], node, state)
    raise Exit(status, f"line {node.line}: exec ends the script")


def _shopt(interp: Runner, words: list[ExpandedWord], node: Simple, state: State) -> Status:
    """``shopt -s extglob`` (or another option of how words are read): what follows is read
    differently by bash, so everything after is unknown here."""
    changes = [w.text for w in words[1:] if not w.text.startswith("-")]
    reading = {"nullglob", "failglob", "nocaseglob", "nocasematch", "expand_aliases"}
    turned_on = "-s" in (w.text for w in words)
    if turned_on and "extglob" in changes:
        state.options.add("extglob")  # its patterns are refused where they appear
    if turned_on and reading & set(changes):
        state.poison(
            f"shopt -s {' '.join(changes)} (line {node.line}), which this reader does not follow"
        )
    return 0


def _not_followed(interp: Runner, words: list[ExpandedWord], node: Simple, state: State) -> Status:
    """Builtins that change nothing a launch line reads (``trap``, ``ulimit``, ``wait``...)."""
    return 0


def whole_word(interp: Runner, word: Word, state: State) -> ExpandedWord:
    return expand_whole(word, interp.scope(state))


def matches(interp: Runner, subject: ExpandedWord, pattern: Word, state: State) -> bool | Unknown:
    if subject.unresolved:
        return Unknown(f"a case on {subject.unresolved}")
    interp.decided_by += list(subject.missing)
    answer = case_matches(subject, pattern, interp.scope(state))
    return Unknown(answer.reason) if isinstance(answer, NoAnswer) else answer


BUILTINS: dict[str, Builtin] = {
    **OUTPUT_BUILTINS,
    ":": _true,
    "true": _true,
    "false": _false,
    "test": _test,
    "[": _test,
    "let": _let,
    "set": _set,
    "shift": _shift,
    "unset": _unset,
    "eval": _eval,
    "source": _source,
    ".": _source,
    "exit": _exit,
    "return": _return,
    "break": _break,
    "continue": _break,
    "read": _read,
    "getopts": _outside,
    "mapfile": _outside,
    "readarray": _outside,
    "command": _command,
    "builtin": _command,
    "exec": _exec,
    "shopt": _shopt,
    **dict.fromkeys(
        [
            "trap",
            "ulimit",
            "umask",
            "wait",
            "hash",
            "alias",
            "unalias",
            "type",
            "kill",
            "pushd",
            "popd",
            "disown",
            "enable",
            "history",
            "times",
            "caller",
            "complete",
            "suspend",
        ],
        _not_followed,
    ),
}
