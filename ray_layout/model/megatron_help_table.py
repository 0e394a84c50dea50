"""The flag table of the Megatron a cluster runs, read from ``pretrain_gpt.py --help``.

Megatron's flags move between versions, so the bundled megatron-core 0.16.1 table can be wrong
for the cluster's checkout: a flag it removed would fail minutes later on a GPU node.  argparse's
help lists every option string and how many values it takes (from its metavar: ``X``, ``[X]``,
``[X ...]``, ``X [X ...]``, ``X X``), but not its type or default; so a flag the bundled table
knows with the same option strings and arity keeps the bundled entry, and the others get an entry
of the same shape with argparse's dest and text values.  A flag hidden from help
(``help=argparse.SUPPRESS``) cannot be told from a removed one and counts as unknown; core_v0.16.1
hides one, ``--disable-chunked-prefill`` (inference only).  Its whole help parses back to the
bundled table but for that one (tried by hand; ``tests/runtime/test_megatron_help_probe.py``
keeps an excerpt).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ray_layout.model.megatron_args import FlagTable

Entry = dict[str, Any]  # one argparse entry, the shape of data/megatron_args_core_v0.16.1.json

# An option line of argparse's help: two spaces of section indent, then the invocation, then
# (after two or more spaces) the help text, which may instead start on the next line.
_OPTION_LINE = re.compile(r" {2}(-\S.*?)(?: {2,}.*)?")
_CHOICES = re.compile(r"\{([^{}]*)\}")


def parse_help(text: str) -> list[Entry]:
    """The entries of every option in argparse help ``text``, in the order shown."""
    return [
        _entry(match[1]) for line in text.splitlines() if (match := _OPTION_LINE.fullmatch(line))
    ]


def _entry(invocation: str) -> Entry:
    """``--foo-bar {a,b}`` or ``-h, --help`` as an entry: option strings, dest, nargs, choices."""
    options = [part.partition(" ")[::2] for part in invocation.split(", ")]
    flags = [flag for flag, _ in options]
    metavar = options[0][1]
    choices = _CHOICES.fullmatch(metavar.split(" ")[0]) if metavar else None
    long = next((f for f in flags if f.startswith("--")), flags[0])
    return {
        "flags": flags,
        "dest": long.lstrip("-").replace("-", "_"),
        "nargs": _nargs(metavar),
        "type": None,
        "choices": choices[1].split(",") if choices else None,
        "default": None,
    }


def _nargs(metavar: str) -> int | str | None:
    """argparse's nargs from how its help writes the values (None: exactly one)."""
    if not metavar:
        return 0
    words = metavar.split(" ")
    repeated = len(words) > 1 and words[-1] == "...]"  # a choice may itself hold "..."
    if metavar.startswith("["):
        return "*" if repeated else "?"
    if repeated:
        return "+"
    return None if len(words) == 1 else len(words)


def _arity(nargs: int | str | None) -> int | str | None:
    """nargs as help shows it: ``nargs=1`` and no nargs both print one metavar."""
    return None if nargs == 1 else nargs


def merge_with_bundled(helped: list[Entry], bundled: Mapping[str, Entry]) -> FlagTable:
    """option string -> entry for every option in ``helped``: the bundled entry where it has the
    same option strings and arity (its types, choices and defaults check values), else the help's.
    A flag missing from ``helped`` is missing from the result: that Megatron does not know it."""
    table: FlagTable = {}
    for entry in helped:
        known = bundled.get(entry["flags"][0])
        same = (
            known is not None
            and set(known["flags"]) == set(entry["flags"])
            and _arity(known["nargs"]) == entry["nargs"]
        )
        chosen = known if same else entry
        table.update({flag: chosen for flag in entry["flags"]})
    return table
