"""The lines Megatron printed, out of what wraps them on their way into a file.

Two kinds of wrapping, each taken off in one place:

- A container runtime's record around every line of a container's output, which changes what
  a line is: a Kubernetes node's files (``/var/log/pods/…``, the CRI format) hold
  ``2026-12-05T10:31:07.123456789Z stdout F <text>``, with ``P`` for a partial record whose
  text the next record of the same stream continues; docker's json-file driver holds
  ``{"log":"<text>\\n","stream":"stdout","time":"…"}``, a text without its ``\\n`` being
  partial.  :func:`printed_text` replaces each record by its text, partial ones joined.
- Prefixes in front of the text (Ray's ``(RankActor pid=…, ip=…)``, torchrun's
  ``[default0]:``, srun's ``3:``, timestamps, logging prefixes), stripped one at a time by
  :func:`content`.
"""

from __future__ import annotations

import json
import re

LINE_BREAK = re.compile(r"\r\n|\r|\n")
ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")
_TIMESTAMP = (
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]+)?(?:Z|[+-][0-9]{2}:[0-9]{2})"
)
# A CRI record: RFC 3339 time, stream, tag (P partial, F full), one blank, the text.
_CRI = re.compile(rf"{_TIMESTAMP} (?P<stream>stdout|stderr) (?P<tag>[PF])(?: (?P<text>.*))?")
_DOCKER = '{"log":'
# Whether a text holds any container record: one scan of the whole text before a line's.
_ANY_RECORD = re.compile(rf"^(?:{_TIMESTAMP} (?:stdout|stderr) [PF]|\{{\"log\":)", re.MULTILINE)

_RAY_DEDUP = re.compile(r"\[repeated \d+x across cluster\]\s*$")
# What launchers, loggers and log collectors put in front of a line, stripped one at a time.
_PREFIX = re.compile(
    r"""\s*(?:
        (?P<ray>\((?:[^()]|\([^()]*\))*+\))           # Ray: (RankActor pid=1, ip=…), see below
      | \[(?:default|rank)\d+\]:                                  # torchrun: [default0]: [rank3]:
      | \d{1,6}:(?=[\s(\[]|$)                                     # srun --label: 3:
      | \[?\d{4}-\d\d-\d\d[T\ ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?\]?  # timestamps
      | \[?(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\b\]?(?::[\w.]+:|\s*[-:|]?)  # INFO:name:
      | [A-Za-z_]\w*(?:\.\w+)+\s*[-|:](?=\s)                      # megatron.core.timers -
      | [-|]
    )""",
    re.VERBOSE,
)
# A parenthesised prefix is Ray's when it names a pid: checked apart, since a pattern that finds
# "pid=" inside the parentheses backtracks over every "pid=" of a line that never closes them.
_RAY_PID = re.compile(r"\bpid=\d")


def printed_text(text: str) -> str:
    """``text`` as its writers printed it: each container runtime record replaced by its text
    on the record's line, a partial record's line left blank and its text joined to the line of
    the record that completes it (so every line keeps its number in the file), partial texts
    nothing completes put last, after the final newline (a cut line).  ``text`` itself when it
    holds no such record."""
    if _ANY_RECORD.search(text) is None:
        return text
    lines = text.split("\n")
    partial: dict[str, list[str]] = {}  # stream -> texts waiting for the rest of their line
    for number, line in enumerate(lines):
        record = _record(line)
        if record is None:
            continue
        stream, piece, complete = record
        waiting = partial.setdefault(stream, [])
        waiting.append(piece)
        lines[number] = "".join(waiting) if complete else ""
        if complete:
            del partial[stream]
    cut = "".join(piece for pieces in partial.values() for piece in pieces)
    return "\n".join(lines) + ("\n" + cut if cut and lines[-1] else cut)


def _record(line: str) -> tuple[str, str, bool] | None:
    """(stream, text, whether the text ends its line) of one container record, or None when
    ``line`` is none."""
    if cri := _CRI.fullmatch(line):
        return cri["stream"], cri["text"] or "", cri["tag"] == "F"
    if not line.startswith(_DOCKER):
        return None
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):
        return None  # a cut or foreign line: read as the text it is
    if not isinstance(record, dict) or not isinstance(record.get("log"), str):
        return None
    text = record["log"]
    return str(record.get("stream")), text.removesuffix("\n"), text.endswith("\n")


def content(raw: str) -> str:
    """The line as its writer printed it: launcher, time and logging prefixes taken off."""
    # found from its bracket, then the blanks before it trimmed: a leading \s* would rescan
    # every run of blanks from each of its positions (quadratic on a blank-heavy line)
    dedup = _RAY_DEDUP.search(raw)
    line = raw[: dedup.start()].rstrip() if dedup else raw
    start = 0  # advanced, not sliced: a line of a thousand prefixes is not copied a thousand times
    while (match := _PREFIX.match(line, start)) and not (
        match["ray"] and not _RAY_PID.search(match["ray"])
    ):
        start = match.end()
    return line[start:]
