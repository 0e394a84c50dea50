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
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

_WORLD = re.compile(r"\busing world size:\s*(?P<world>\d+)\s*,(?P<rest>.*)$", re.MULTILINE)
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
# onto the value before them (``sizes: Nonetensor-model-parallel size: 2``).
_SIZE = re.compile(rf"(?<!-)(?P<name>{'|'.join(SIZE_NAMES)})[ -]size:\s*(?P<value>\d+)")


@dataclass(frozen=True)
class LogWorld:
    """``using world size: W, …``: the world size and the sizes the line names (dp, cp, tp,
    pp, and ep/etp where a fork prints them), keyed as :class:`ParallelConfig` names them."""

    world_size: int
    sizes: Mapping[str, int] = field(hash=False)
    line: int  # where the log states it

    def __post_init__(self) -> None:
        object.__setattr__(self, "sizes", MappingProxyType(dict(self.sizes)))

    def describe(self) -> str:
        named = ", ".join(f"{name.upper()} {size}" for name, size in self.sizes.items())
        return f"a world of {self.world_size} ({named})"


def parse_world(text: str) -> LogWorld | None:
    """The last world the log states (a restart appended to the log states its own), or None."""
    found = None
    for match in _WORLD.finditer(text):
        sizes = {
            SIZE_NAMES[size["name"]]: int(size["value"]) for size in _SIZE.finditer(match["rest"])
        }
        line = text.count("\n", 0, match.start()) + 1
        found = LogWorld(int(match["world"]), sizes, line)
    return found
