"""Megatron-LM's argparse table, and command lines walked the way Megatron's argparse walks them.

The table is megatron-core 0.16.1's (``data/megatron_args_core_v0.16.1.json``: every option's
dest, nargs, type, choices and default), so a typo is an error rather than an ignored setting.
A flag the table does not know is, for the commands that do not launch Megatron, passed through
with a note (Megatron moves fast); ``tune`` checks every flag against the cluster's own table.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from ray_layout.errors import ConfigError, quoted
from ray_layout.options.checks import decimal, integer

_FLAG_TABLE = Path(__file__).parent / "data" / "megatron_args_core_v0.16.1.json"
_NEGATIVE_NUMBER = re.compile(r"-\d+|-\d*\.\d+")
# Megatron's argparse reads its numbers with int() and float(), which also take 1_0, " 7", nan and
# inf; the tuner writes these flags back and reasons with their values, so it reads them as every
# number written as text is read (ray_layout.options.checks): digits, or a finite decimal.
_CONVERTERS = {"int": integer, "float": decimal, "str": str, None: str}
_WRITTEN = {"int": "an integer in digits 0-9", "float": "a finite decimal number"}


@dataclass(frozen=True)
class UnresolvedArgument:
    """A flag of the user's whose value the reader does not have (it comes from the job's
    environment): ``flag`` is "" for a word no flag takes."""

    flag: str
    text: str  # the flag's words as written
    where: str  # "script.sh:116"
    reason: str  # "$1, the script's own argument (give --env 1=VALUE)"

    @property
    def message(self) -> str:
        what = f"{self.flag} uses" if self.flag else f"{self.text} is"
        return f"{self.where}: {what} {self.reason}"


FlagTable = dict[str, dict[str, Any]]  # option string -> argparse entry


@cache
def megatron_flag_table() -> FlagTable:
    """Every option string of Megatron's parser -> its argparse entry (dest, nargs, type, choices,
    default), as dumped from megatron-core 0.16.1.  Cached: treat it as read-only."""
    entries = json.loads(_FLAG_TABLE.read_text())
    return {flag: entry for entry in entries for flag in entry["flags"]}


@dataclass(frozen=True)
class FlagUse:
    """One option of a command line as Megatron's argparse takes it."""

    flag: str  # the option string as written, before any "="
    entry: dict[str, Any]  # its argparse entry in the flag table (``unknown_entry`` if none)
    values: tuple[str, ...]  # the words it takes; none for a switch
    position: int = 0  # the index of the flag's word in the walked words
    inline: bool = False  # written as --flag=value, one word

    @property
    def known(self) -> bool:
        return self.entry["dest"] is not None

    @property
    def span(self) -> range:
        """The indices of the flag's word and of the words it takes, in the walked words (one
        word for the ``--flag=value`` form)."""
        return range(self.position, self.position + 1 + (0 if self.inline else len(self.values)))


def unknown_entry(flag: str) -> dict[str, Any]:
    """The entry of a flag the table does not know: it takes the words up to the next flag."""
    return {
        "flags": [flag],
        "dest": None,
        "nargs": "*",
        "type": None,
        "choices": None,
        "default": None,
    }


def walk_flags(
    words: Sequence[str],
    source: str,
    *,
    strict: bool,
    table: FlagTable | None = None,
    keep_unknown: bool = False,
) -> Iterator[FlagUse]:
    """Walk ``words`` as Megatron's argparse does (``table``: the bundled one unless given): each
    option with the words it takes.

    Raises :class:`ConfigError` (prefixed by ``source``) at an unknown flag (unless
    ``keep_unknown``: then it takes the words up to the next flag), a value given to a switch or
    too few values.  A word that no option takes is an error when ``strict``; otherwise it is
    skipped.
    """
    table = table or megatron_flag_table()
    i = 0
    while i < len(words):
        word = words[i]
        position = i
        i += 1
        flag, has_inline, inline = word.partition("=")
        if not flag.startswith("--"):
            if not strict:
                continue
            if not flag.startswith("-"):
                raise ConfigError(
                    f"{source}: argument {word!r} is not a flag and follows no flag that takes it"
                )
        entry = table.get(flag)
        if entry is None and keep_unknown and flag.startswith("--"):
            entry = unknown_entry(flag)
        if entry is None:
            raise ConfigError(f"{source}: unknown Megatron flag {flag}")
        nargs = entry["nargs"]
        if nargs == 0:
            if has_inline:
                raise ConfigError(f"{source}: {flag} takes no value, got {word!r}")
            yield FlagUse(flag, entry, (), position)
            continue
        least, most = _arity(nargs)
        if has_inline:
            values = [inline]
        else:
            end = i
            while end < len(words) and (most is None or end - i < most) and _is_value(words[end]):
                end += 1
            values, i = list(words[i:end]), end
        if len(values) < least:
            count = f"{'at least ' if most is None else ''}{least} value{'s' * (least > 1)}"
            raise ConfigError(f"{source}: {flag} expects {count}, got {len(values)}")
        yield FlagUse(flag, entry, tuple(values), position, bool(has_inline))


def typed_value(use: FlagUse, text: str, source: str) -> Any:
    """The value argparse would store for one of ``use``'s words; Megatron's own converters
    (moe_freq_type, enums, ...) are not in the flag table, so their values keep their text.
    Raises :class:`ConfigError` for a value of the wrong type or outside the flag's choices."""
    entry = use.entry
    convert = _CONVERTERS.get(entry["type"])
    if convert is None:
        return text
    try:
        value = convert(text)
    except ValueError:
        raise ConfigError(
            f"{source}: {use.flag} needs a value of type {entry['type']}, got {quoted(text)} "
            f"({_WRITTEN[entry['type']]})"
        ) from None
    if entry["choices"] is not None and value not in entry["choices"]:
        choices = ", ".join(map(str, entry["choices"]))
        raise ConfigError(f"{source}: {use.flag} must be one of {choices}, got {text!r}")
    return value


def check_arguments(
    args: Sequence[str], source: str, table: FlagTable | None = None, *, keep_unknown: bool = False
) -> tuple[str, ...]:
    """Walk ``args`` as Megatron's argparse would and raise :class:`ConfigError` at the first
    unknown flag (unless ``keep_unknown``), stray word, wrong number of values, value of the
    wrong type or value outside the flag's choices; return the unknown flags kept.  Values of
    Megatron's own converters (``--moe-layer-freq``, enums, ...) are not in the flag table and
    are not checked."""
    unknown: list[str] = []
    for use in walk_flags(args, source, strict=True, table=table, keep_unknown=keep_unknown):
        if not use.known:
            unknown.append(use.flag)
            continue
        for text in use.values:
            typed_value(use, text, source)
    return tuple(dict.fromkeys(unknown))


def unknown_flags_note(flags: Sequence[str], source: str) -> str:
    """The one note that says which flags Megatron core_v0.16.1's table does not know."""
    return (
        f"{source}: {', '.join(flags)} unknown to Megatron core_v0.16.1's flag table: passed "
        "through as written (tune checks them against the cluster's own Megatron)"
    )


def parse_flags(
    words: Sequence[str],
    source: str,
    unresolved: Sequence[bool] | None = None,
    table: FlagTable | None = None,
    only: Collection[str] | None = None,
) -> dict[str, Any]:
    """Megatron's argparse over a command's arguments: dest -> typed value, the last one winning
    (``table``: a fork's, else core's; ``only``: the dests the caller reads, the others walked
    over untyped, so that a fork's own value of a flag core types otherwise is no error).

    Words that no flag takes, and flags the table does not know, are skipped.  A word marked in
    ``unresolved`` (a value the job's environment gives) keeps its text untyped: it is an error
    only for a flag this tool uses.
    """
    parsed: dict[str, Any] = {}
    for use in walk_flags(words, source, strict=False, table=table, keep_unknown=True):
        entry = use.entry
        if not use.known or (only is not None and entry["dest"] not in only):
            continue
        if entry["nargs"] == 0:
            parsed[entry["dest"]] = _switch(use.flag, entry)
            continue
        first = use.position + (not use.inline)
        marks = unresolved or ()
        values = [
            text if first + k < len(marks) and marks[first + k] else typed_value(use, text, source)
            for k, text in enumerate(use.values)
        ]
        parsed[entry["dest"]] = values[0] if entry["nargs"] is None else values
    return parsed


def _arity(nargs: int | str | None) -> tuple[int, int | None]:
    """argparse's nargs as (fewest, most) values; None for no upper bound."""
    if nargs is None:
        return 1, 1
    if isinstance(nargs, int):
        return nargs, nargs
    return {"?": (0, 1), "*": (0, None), "+": (1, None)}[nargs]


def _is_value(word: str) -> bool:
    """Whether argparse would take ``word`` as a value rather than as the next option."""
    return not word.startswith("-") or bool(_NEGATIVE_NUMBER.fullmatch(word))


def _switch(flag: str, entry: dict[str, Any]) -> bool:
    """store_true/store_false store ``not default``; BooleanOptionalAction pairs --x with --no-x."""
    if flag.startswith("--no-") and f"--{flag[5:]}" in entry["flags"]:
        return False
    if f"--no-{flag[2:]}" in entry["flags"]:
        return True
    return not entry["default"]
