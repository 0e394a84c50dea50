"""The parallel sizes a Megatron log states about its own world.

Rank 0 prints them once at start-up (``megatron/training/arguments.py``), in wordings that
changed over the years and across forks::

    using world size: 8, data-parallel size: 2, context-parallel size: 1, hierarchical
    context-parallel sizes: None, tensor-model-parallel size: 1, pipeline-model-parallel size: 4
    using world size: 2, data-parallel size: 2, context-parallel size: 1 tensor-model-parallel
    size: 1, pipeline-model-parallel size: 1
    using world size: 8, data-parallel-size: 8, tensor-model-parallel size: 1, pipeline-model-
    parallel size: 1

(each on one line), so every ``<name> size: N`` of the line with a name this tool knows is read;
``encoder-…`` sizes and the plural ``hierarchical … sizes`` are not these.

Rank 0 also prints every argument, between ``---- arguments ----`` and ``---- end of arguments
----``, one ``  name ........ value`` a line: the model's shape, the batch sizes, the layout and
VPP the run really had: ``ray_layout.model.run_log`` reads that block (a run log is also a
CONFIG).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from ray_layout.errors import MeasurementError
from ray_layout.measure.log_numbers import read_count

# A count as a log prints it: ASCII digits, few enough to be a number (int() refuses 4,300)
INTEGER = r"[0-9]{1,18}(?![0-9])"
_WORLD = re.compile(rf"\busing world size:\s*(?P<world>{INTEGER})\s*,(?P<rest>.*)$", re.MULTILINE)
# Megatron's names -> ParallelConfig's fields
SIZE_NAMES = {
    "data-parallel": "dp",
    "context-parallel": "cp",
    "tensor-model-parallel": "tp",
    "pipeline-model-parallel": "pp",
    "expert-model-parallel": "ep",
    "expert-tensor-parallel": "etp",
}
# Not after "-" (``encoder-tensor-model-parallel``), but after any letter: forks glue the names
# onto the value before them (``sizes: Nonetensor-model-parallel size: 2``).  A value ends where
# a separator or such a glued name begins; the whole of it is a count (or None), or the log is
# refused: ``size: 8x`` is not read as 8.
_NAMES = "|".join(SIZE_NAMES)
_GLUED = rf"(?:{_NAMES}|hierarchical|encoder)[ -]"
_SIZE = re.compile(
    rf"(?<!-)(?P<name>{_NAMES})[ -]size:\s*(?P<value>[^\s,;]*?)(?=[\s,;]|$|{_GLUED})"
)


@dataclass(frozen=True)
class LogWorld:
    """``using world size: W, …``: the world size and the sizes the line names (dp, cp, tp,
    pp, and ep/etp where a fork prints them), keyed as :class:`ParallelConfig` names them."""

    world_size: int
    sizes: Mapping[str, int] = field(hash=False)
    line: int  # where the log states it
    earlier: tuple[int, ...] = ()  # the lines of earlier starts' statements: a restart's log

    def __post_init__(self) -> None:
        object.__setattr__(self, "sizes", MappingProxyType(dict(self.sizes)))

    def describe(self) -> str:
        named = ", ".join(f"{name.upper()} {size}" for name, size in self.sizes.items())
        return f"a world of {self.world_size} ({named})"


def parse_world(text: str, source: str = "log") -> LogWorld | None:
    """The last world the log states (a restart appended to the log states its own), or None;
    :class:`MeasurementError` for a stated size that is no count."""
    lines, line, counted = [], 1, 0
    for match in _WORLD.finditer(text):  # newlines counted from the last match: linear
        line += text.count("\n", counted, match.start())
        lines.append(line)
        counted = match.start()
    if not lines:
        return None
    sizes = {}
    for size in _SIZE.finditer(match["rest"]):
        if size["value"] == "None":  # Megatron prints None for a size it leaves unset
            continue
        count = read_count(size["value"])
        if count is None or count < 0:
            raise MeasurementError(
                f"{source}: line {lines[-1]}: {size['name']} size {size['value']!r} is not a "
                "count; nothing of this log is used"
            )
        sizes[SIZE_NAMES[size["name"]]] = count
    return LogWorld(int(match["world"]), sizes, lines[-1], tuple(lines[:-1]))
