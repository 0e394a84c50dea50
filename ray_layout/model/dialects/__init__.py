"""The forks around Megatron-LM, each a module with a table of its flags: MindSpeed-LLM
(``mindspeed``), Megatron-DeepSpeed's MoE (``deepspeed_moe``) and Pai-Megatron-Patch (``pai``).
A command line is a fork's by the flags (or entry point) only that fork has; its flags that change
the model are read into this project's fields, the rest passed on, and one that changes the model
in a way this tool does not model is refused in one line."""

from __future__ import annotations

from collections.abc import Sequence

from ray_layout.errors import ConfigError
from ray_layout.model.dialects.deepspeed_moe import DEEPSPEED_MOE
from ray_layout.model.dialects.dialect import CORE, Dialect, DialectReading, ReadContext
from ray_layout.model.dialects.flag import looks_like_shape
from ray_layout.model.dialects.mindspeed import MINDSPEED
from ray_layout.model.dialects.pai import PAI
from ray_layout.model.megatron_args import FlagTable

DIALECTS: tuple[Dialect, ...] = (MINDSPEED, DEEPSPEED_MOE, PAI)

__all__ = [
    "CORE",
    "DIALECTS",
    "Dialect",
    "DialectReading",
    "ReadContext",
    "dialect_of",
    "looks_like_shape",
    "table_of",
]


def table_of(dialect: str) -> FlagTable:
    """The flag table a recipe's ``dialect`` (a fork's name, "" for Megatron-LM) parses with."""
    return next((d for d in DIALECTS if d.name == dialect), CORE).table()


def dialect_of(words: Sequence[str], entry_point: str, source: str) -> Dialect:
    """The fork whose flags (or entry point) ``words`` has; Megatron-LM's when none.  A flag two
    forks have says neither where another flag says one (Pai's legacy --expert-interval is
    Megatron-DeepSpeed's too); flags of two forks at once are an error: their tables disagree on
    what some flags mean."""
    hits = [(d, marks) for d in DIALECTS if (marks := d.marks(words, entry_point))]
    if len(hits) > 1:
        hits = [(d, own) for d, marks in hits if (own := _own(d, marks, hits))]
    if not hits:
        return CORE
    if len(hits) > 1:
        said = "; ".join(f"{d.name} ({', '.join(marks[:3])})" for d, marks in hits)
        raise ConfigError(f"{source}: the command line has flags of more than one fork: {said}")
    return hits[0][0]


def _own(
    dialect: Dialect, marks: Sequence[str], hits: Sequence[tuple[Dialect, object]]
) -> tuple[str, ...]:
    """The marks of ``dialect`` that no other fork found in the words has in its table."""
    others = {f.name for other, _ in hits if other is not dialect for f in other.flags}
    return tuple(mark for mark in marks if mark not in others)
