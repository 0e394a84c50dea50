"""Read Megatron-LM training logs: timer blocks, iteration lines and memory lines.

The formats are core_v0.16.1's (section 4 of the shared ``docs/megatron.md``):
``megatron/core/timers.py`` prints a timer block (``--timing-log-option all``, ``max`` or
``minmax``) through Python logging on the last rank, ``training.py:training_log`` prints the
iteration line just before it, and
``training/utils.py:report_memory`` prints one memory line per rank with DP rank 0.

Real logs are messier than the formats: every line may carry a launcher prefix (Ray's
``(RankActor pid=…, ip=…)``, torchrun's ``[default0]:``, srun's ``3:``), a timestamp or a logging
prefix, or sit in a container runtime's record (``log_wrappers`` takes them off); several ranks
write at once, so other ranks' lines land inside a timer block; progress bars overwrite lines
with ``\\r``; a killed job leaves its last line cut.  Lines of other programs are ignored; lines
that look like one of the three formats but do not parse, a value that is no number among them
(every number is read whole by ``log_numbers``), are skipped and counted, so a caller can tell a
clean log from a damaged one.  Values are kept exactly as printed, quirks included (see
``log_records.steady_intervals``).  What the lines become lives in
``ray_layout.measure.log_records``; its names are importable from here too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from math import gcd
from pathlib import Path
from typing import Any

from ray_layout.errors import MeasurementError
from ray_layout.measure.log_numbers import read_count, read_number
from ray_layout.measure.log_records import (
    SKIPPED_EXAMPLES,
    IterationRecord,
    MemoryRecord,
    ParsedLog,
    TimerRecord,
    impossible_iteration,
    impossible_memory,
    impossible_timer,
)
from ray_layout.measure.log_world import parse_world
from ray_layout.measure.log_wrappers import ANSI, LINE_BREAK, content, printed_text
from ray_layout.model.files import read_bytes
from ray_layout.model.run_log import parse_arguments

_EXCERPT_CHARS = 80
# Megatron's longest lines (an iteration line, a one-line timer block) are a few hundred
# characters: a longer line is no record of its, and capping it bounds the work per line.
MAX_LINE_CHARS = 1 << 16
# 20 iterations of every timer of 1,024 ranks is about 10 MB; logs are read at about 2 MB/s, so
# a log at the cap is read and stored in about 15 s and 0.8 GB (2 cores).
MAX_LOG_BYTES = 16 * 2**20

_HEADER = re.compile(r"(?P<option>\(min, max\) time|max time|times) across ranks \(ms\):\s*$")
# A rank or iteration count where a record starts: from its first digit to the next blank,
# read whole by log_numbers (a sign too, so that a negative rank is refused, not passed over).
_COUNT_TOKEN = r"[-+]?[0-9][^\]\s/|()]*"
# Where a record starts inside a physical line that unsynchronised writers glued together.
_GLUED = re.compile(
    rf"\[Rank\s+{_COUNT_TOKEN}\]\s+\(|(?:\(min, max\) time|max time|times) across ranks \(ms\):"
)
# Another writer's text right after a closing ")", or blanks to the end; the two branches start
# with different characters, so no run of blanks is scanned twice (every pattern here is linear).
_GLUED_TAIL = r"(?:(?P<tail>[^\s\d.].*)|\s*)$"
_OPTIONS = {"(min, max) time": "minmax", "max time": "max", "times": "all"}
_ALL_TIMER = re.compile(r"\s*(?P<timer>[^\s:]+):\s*$")
_ALL_RANK = re.compile(r"\s*rank\s+(?P<rank>[^\s:]+):(?P<ms>.*)$")
# ``name ....: value``: the name and a blank dot-filled to 48 characters (no dots after a name of
# 47 or more), then the value to the line's end: one number (max), or two in parentheses.
_DOTTED = re.compile(r"\s*(?P<timer>\S+) (?P<dots>\.*): (?P<value>.*)$")
_UNDOTTED_NAME = 47
_PAIR = re.compile(rf"\((?P<pair>[^()]*)\){_GLUED_TAIL}")
# Megatron before core (2019-2022): ``time (ms) | name: 12.34 | …``, the last rank's values only.
_ONE_LINE = re.compile(r"time \(ms\)\s*\|")
_ENTRY_HINT = re.compile(r"\brank\s+[-+]?[0-9][^\s:]*\s*:|\S \.{3,}:|\btimes? across ranks\b")
# ``iteration   10/  100 |`` upstream; ``iteration=  10/  100 |`` with ``key=value`` fields in
# forks that log through a key-value logger (ALCF's Megatron-DeepSpeed).
_ITERATION = re.compile(
    rf"\biteration(?:\s+|\s*(?P<fork>=)\s*)(?P<iteration>{_COUNT_TOKEN})\s*/\s*"
    r"(?P<train_iters>[^\s/|]+)\s*\|(?P<rest>.*)$"
)
# The start of an iteration line in either form: a rank's heartbeat while it trains.
ITERATION_LINE_START = re.compile(rf"\biteration(?:\s+|\s*=\s*){_COUNT_TOKEN}\s*/")
_FORK_KEYS = {"elapsed_time_per_iteration_ms": "elapsed time per iteration (ms)"}
# IterationRecord's fields: the key Megatron prints each under, and how its value is read.
_ITERATION_FIELDS = {
    "consumed_samples": ("consumed samples", read_count),
    "elapsed_ms": ("elapsed time per iteration (ms)", read_number),
    "throughput_tflops": ("throughput per GPU (TFLOP/s/GPU)", read_number),
    "learning_rate": ("learning rate", read_number),
    "global_batch_size": ("global batch size", read_count),
    "loss_scale": ("loss scale", read_number),
    "grad_norm": ("grad norm", read_number),
    "skipped_iterations": ("number of skipped iterations", read_count),
    "nan_iterations": ("number of nan iterations", read_count),
}
_MEMORY = re.compile(
    rf"\[Rank\s+(?P<rank>{_COUNT_TOKEN})\]\s+\((?:after (?P<iteration>{_COUNT_TOKEN}) iterations"
    r"|[^()]*)\)\s+memory \(MB\)\s*(?P<rest>\|.*)?$"
)
_MEMORY_SIZES = ("allocated", "max allocated", "reserved", "max reserved")
_NOT_A_NUMBER = "a timer entry whose value is no number"
_KEY_END = re.compile(r"[:=]")


def parse_log_file(path: str | Path) -> ParsedLog:
    """:func:`parse_log` on a file (:func:`read_log`), errors naming the file."""
    return parse_log(read_log(path), source=str(path))


def read_log(path: str | Path) -> str:
    """A log's text: a regular file of at most MAX_LOG_BYTES (a FIFO or ``/dev/zero`` would never
    end), undecodable bytes replaced (a killed writer leaves half a character)."""
    return read_bytes(path, str(path), limit=MAX_LOG_BYTES).decode("utf-8", errors="replace")


def parse_log(text: str, source: str = "log") -> ParsedLog:
    """Every timer, iteration and memory record in ``text``.

    A timer block is printed by one rank while the others keep writing, so it stays open across
    their lines until the next header or iteration line; an entry repeated within a block is
    skipped.  Records that unsynchronised writers glued onto one physical line are split apart
    and each read.  Megatron ends every line with a newline, so a last line without one was cut
    off mid-write: it is skipped and counted even when it happens to parse.  Raises
    :class:`MeasurementError` when nothing in ``text`` is Megatron's, saying why when lines that
    looked like Megatron's were dropped, and when a value no run can have is read (naming the
    line and the value).  Container runtime records (Kubernetes' CRI files, docker's json-file)
    are read as the lines they hold (``log_wrappers.printed_text``).
    """
    printed = printed_text(text.removeprefix("\ufeff"))
    lines = LINE_BREAK.split(ANSI.sub("", printed))
    reader = _Reader(source)
    for number, raw in enumerate(lines[:-1], start=1):
        if len(raw) > MAX_LINE_CHARS:
            reader.skip(number, raw, f"longer than {MAX_LINE_CHARS:,} characters: not read")
            continue
        read = [reader.read(number, raw, piece) for piece in _pieces(content(raw))]
        reader.split_lines += sum(read) > 1
    last = lines[-1]
    if last.strip() and (len(last) > MAX_LINE_CHARS or content(last).strip()):
        reader.skip(len(lines), last, "cut off: the log ends without a newline")
    examples = tuple(f"line {n}: {_excerpt(raw)} ({why})" for n, raw, why in reader.skipped)
    if not (reader.timers or reader.iterations or reader.memory):
        if reader.skipped:
            raise MeasurementError(
                f"{source}: no Megatron timers, iteration or memory lines could be read: "
                f"{len(reader.skipped)} line(s) that look like them were dropped, first "
                f"{examples[0]}"
            )
        raise MeasurementError(
            f"{source}: no Megatron timers, iteration or memory lines found ({_first_line(lines)})"
        )
    return ParsedLog(
        timers=tuple(reader.timers),
        iterations=tuple(reader.iterations),
        memory=tuple(reader.memory),
        skipped_lines=len(reader.skipped),
        skipped_examples=examples[:SKIPPED_EXAMPLES],
        log_interval_hint=_log_interval_hint([record.iteration for record in reader.iterations]),
        unknown_segments=sum(record.unknown_segments for record in reader.iterations),
        split_lines=reader.split_lines,
        world=parse_world(printed, source),
        arguments=parse_arguments(printed),
    )


@dataclass
class _Reader:
    """The records read so far and the open timer block (``option`` None: no block open)."""

    source: str
    timers: list[TimerRecord] = field(default_factory=list)
    iterations: list[IterationRecord] = field(default_factory=list)
    memory: list[MemoryRecord] = field(default_factory=list)
    skipped: list[tuple[int, str, str]] = field(default_factory=list)  # (line, text, why)
    split_lines: int = 0
    interval: int = -1
    iteration: int | None = None
    option: str | None = None
    block_iteration: int | None = None
    timer: str | None = None  # the ``all`` block's timer whose ranks follow
    seen: set[tuple[str, int | None]] = field(default_factory=set)
    number: int = 0  # the line being read

    def skip(self, number: int, raw: str, why: str) -> None:
        self.skipped.append((number, raw, why))

    def refuse(self, problem: str | None) -> None:
        """A value no run can have (``nan``, negative, a step of days) makes the log unfit to
        measure from: refused whole, so nothing of it is stored or fitted."""
        if problem is not None:
            raise MeasurementError(
                f"{self.source}: line {self.number}: {problem}; nothing of this log is used"
            )

    def going_back(self, record: IterationRecord) -> str | None:
        """Why an iteration line cannot follow the one before it: Megatron counts up, so a
        count that goes back is a second run's (a restart appended, two runs' lines mixed)."""
        if self.iteration is None or record.iteration >= self.iteration:
            return None
        return (
            f"iteration {record.iteration} follows iteration {self.iteration}: the log holds "
            "more than one run (a restarted job appended to it, or two runs' lines mixed), "
            "give each run's own log"
        )

    def open_block(self, option: str) -> None:
        self.interval += 1
        self.option, self.block_iteration = option, self.iteration
        self.timer, self.seen = None, set()

    def add(self, timer: str, rank: int | None, values: tuple[tuple[str, float], ...]) -> None:
        self.seen.add((timer, rank))
        self.refuse(impossible_timer(timer, rank, values))
        self.timers += [
            TimerRecord(self.interval, self.block_iteration, rank, timer, ms, stat, self.number)
            for stat, ms in values
        ]

    def read(self, number: int, raw: str, line: str) -> bool:
        """One record's text (a physical line, or a piece of a glued one); whether it was one
        of Megatron's (read or dropped)."""
        before = (
            self.interval,
            len(self.timers),
            len(self.iterations),
            len(self.memory),
            len(self.skipped),
        )
        self.number = number
        self._read(number, raw, line)
        return before != (
            self.interval,
            len(self.timers),
            len(self.iterations),
            len(self.memory),
            len(self.skipped),
        )

    def _read(self, number: int, raw: str, line: str) -> None:
        if not line.strip():
            return
        if header := _HEADER.search(line):
            self.open_block(_OPTIONS[header["option"]])
        elif ITERATION_LINE_START.search(line):
            if (record := _iteration_record(line)) is None:
                self.skip(
                    number, raw, "an iteration line cut short or with a value that is no number"
                )
            else:
                self.refuse(impossible_iteration(record) or self.going_back(record))
                self.iterations.append(record)
                self.iteration, self.option = record.iteration, None  # the printer moved on
        elif "memory (MB)" in line:
            match = _MEMORY.search(line)
            if match is not None and match["iteration"] is None:
                return  # reports around save_checkpoint: not an iteration's memory
            if (record := _memory_record(match)) is None:
                self.skip(
                    number,
                    raw,
                    "a memory line without its rank, iteration and four sizes, each a number",
                )
            else:
                self.refuse(impossible_memory(record))
                self.memory.append(record)
        elif _ONE_LINE.match(line):
            if (one_line := _one_line_block(line)) is None:
                self.skip(number, raw, "a one-line timer block with an entry no `name: number`")
                return
            self.open_block("last")
            for timer, ms in one_line:
                self.add(timer, None, (("last", ms),))
            self.option = None  # the whole block is this one line
        elif self.option == "all" and (match := _ALL_TIMER.match(line)):
            self.timer = match["timer"]
        elif (entry := _timer_entry(line, self.option, self.timer)) is not None:
            if isinstance(entry, str):
                self.skip(number, raw, entry)
                return
            timer, rank, values, glued = entry
            if (timer, rank) in self.seen:
                self.skip(number, raw, "repeats an entry of its timer block")
            else:
                self.add(timer, rank, values)
                self.split_lines += glued
        elif _ENTRY_HINT.search(line):
            if "across ranks" in line:
                self.option = None  # a damaged header: what follows belongs to no known block
                self.skip(number, raw, "a damaged timer block header")
            elif self.option is None:
                self.skip(number, raw, "a timer entry outside any timer block")
            else:
                self.skip(number, raw, _NOT_A_NUMBER)


def _pieces(line: str) -> list[str]:
    """``line`` cut before every record that starts inside it (after other text)."""
    text_from = len(line) - len(line.lstrip())  # where its first non-blank is
    cuts = [m.start() for m in _GLUED.finditer(line) if m.start() > text_from]
    return [line[a:b] for a, b in zip([0, *cuts], [*cuts, len(line)], strict=True)]


def parse_iteration_line(raw: str) -> IterationRecord | None:
    """One iteration line as a live watcher sees it (prefixes allowed), or None."""
    return _iteration_record(content(raw))


_Entry = tuple[str, int | None, tuple[tuple[str, float], ...], bool]


def _timer_entry(line: str, option: str | None, timer: str | None) -> _Entry | str | None:
    """(timer, rank, ((stat, ms), …), whether other text was glued on) for one entry of the open
    block; why it is dropped when a value of it is no number (``log_numbers``); None when
    ``line`` is no entry of the block."""
    if option == "all" and timer is not None and (match := _ALL_RANK.match(line)):
        rank, ms = read_count(match["rank"]), read_number(match["ms"].strip())
        if rank is None or ms is None:
            return _NOT_A_NUMBER
        return timer, rank, (("rank", ms),), False
    match = _DOTTED.match(line) if option in ("max", "minmax") else None
    if match is None or not (match["dots"] or len(match["timer"]) >= _UNDOTTED_NAME):
        return None
    if option == "max":
        ms = read_number(match["value"].strip())
        return _NOT_A_NUMBER if ms is None else (match["timer"], None, (("max", ms),), False)
    pair = _PAIR.match(match["value"])
    values = [read_number(value) for value in pair["pair"].split(", ")] if pair else []
    if pair is None or len(values) != 2 or values[0] is None or values[1] is None:
        return _NOT_A_NUMBER
    minmax = (("min", values[0]), ("max", values[1]))
    return match["timer"], None, minmax, bool(pair["tail"])


def _fields(segments: list[str]) -> tuple[dict[str, str], int]:
    """``key: value`` segments of a ``|``-separated line, and how many segments were not."""
    pairs = [_key_value(segment.strip()) for segment in segments]
    fields = dict(pair for pair in pairs if pair is not None)
    return fields, sum(pair is None for pair in pairs)


def _key_value(segment: str) -> tuple[str, str] | None:
    """``key: value`` or ``key=value``: the key up to the first ``:`` or ``=`` (blanks before it
    trimmed), the value one word; None otherwise.  String methods, not a pattern with two
    blank-eating parts, so a segment of blanks costs its length once."""
    found = _KEY_END.search(segment)
    if found is None:
        return None
    key, value = segment[: found.start()].rstrip(), segment[found.end() :].lstrip()
    if not key or not value or len(value.split(maxsplit=1)) != 1:
        return None
    return key, value


def _one_line_block(line: str) -> list[tuple[str, float]] | None:
    """The ``name: ms`` entries of Megatron's old one-line timer block (``time (ms)``, then
    entries each after a ``|``, a ``|`` at the end allowed), or None when one is none."""
    segments = line.split("|")[1:]
    if not segments[-1].strip() and len(segments) > 1:
        segments.pop()  # the closing "|"
    entries = []
    for segment in segments:
        name, colon, value = segment.partition(":")
        ms = read_number(value.strip())
        if not colon or not name.strip() or ms is None:
            return None
        entries.append((name.strip(), ms))
    return entries


def _iteration_record(line: str) -> IterationRecord | None:
    """The iteration line's fields; None if it is cut short or a value it has a field for is
    no number (``log_numbers``)."""
    match = _ITERATION.search(line)
    if match is None or not match["rest"].rstrip().endswith("|"):
        return None  # Megatron ends the line with " |": anything else lost its tail
    fields, unknown = _fields(match["rest"].rstrip().split("|")[:-1])
    if match["fork"]:
        fields = {_FORK_KEYS.get(k, k.replace("_", " ")): v for k, v in fields.items()}
    values: dict[str, Any] = {}
    for name, (key, read) in _ITERATION_FIELDS.items():
        values[name] = None if key not in fields else read(fields[key])
        if key in fields and values[name] is None:
            return None
    losses = {k: read_number(v) for k, v in fields.items() if "loss" in k and k != "loss scale"}
    iteration, train_iters = read_count(match["iteration"]), read_count(match["train_iters"])
    if None in (iteration, train_iters, values["elapsed_ms"], *losses.values()):
        return None
    return IterationRecord(
        iteration=iteration,
        train_iters=train_iters,
        losses=losses,
        unknown_segments=unknown,
        **values,
    )


def _memory_record(match: re.Match[str] | None) -> MemoryRecord | None:
    """The rank, iteration and four sizes of a ``(after K iterations)`` memory line; None if
    one is missing or no number (``log_numbers``)."""
    if match is None or match["rest"] is None:
        return None
    fields, _ = _fields(match["rest"].split("|")[1:])
    sizes = [read_number(fields.get(key, "")) for key in _MEMORY_SIZES]
    rank, iteration = read_count(match["rank"]), read_count(match["iteration"])
    if rank is None or iteration is None or None in sizes:
        return None
    return MemoryRecord(rank, iteration, *sizes)


def _log_interval_hint(iterations: list[int]) -> int | None:
    later = iterations[1:]
    return gcd(*later) if len(later) >= 2 and any(later) else None


def _excerpt(raw: str) -> str:
    """One printable line, however long or strange the original."""
    text = raw.strip()
    return repr(text if len(text) <= _EXCERPT_CHARS else text[:_EXCERPT_CHARS] + "…")


def _first_line(lines: list[str]) -> str:
    for number, raw in enumerate(lines, start=1):
        if raw.strip():
            return f"line {number}: {_excerpt(raw)}"
    return "the text is empty"
