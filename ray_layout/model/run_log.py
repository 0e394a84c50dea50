"""A Megatron run log: the arguments block rank 0 prints at start-up, read as CONFIG.

Every Megatron run, and every fork's, prints its whole ``args`` after checking them
(``megatron/training/arguments.py`` ``_print_args``)::

    ------------------------ arguments ------------------------
      accumulate_allreduce_grads_in_fp32 .............. False
      hidden_size ..................................... 1024
    -------------------- end of arguments ---------------------

one ``'  {name} {dots} {value}'`` a line, the dots filling the name to 48 characters (none for a
longer name: two blanks), after whatever prefix a launcher adds (``[default0]:``).  So the log
says exactly what the run was, whatever launched it: the model, the parallel sizes, the batch and
the split.  This module finds the blocks (``ray_layout.measure`` reads them too) and builds the
recipe: the block becomes the ``pretrain_gpt.py`` command line that makes the same run
(``run_log_flags``), read by the same loader as any command line.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from ray_layout.errors import ConfigError
from ray_layout.model.megatron_recipe import Overrides, load_megatron_command_line
from ray_layout.model.run_log_flags import (
    BlockFlags,
    block_flags,
    check_deepspeed_moe,
    int_value,
)
from ray_layout.model.spec import Recipe

# From a run of dashes' first (a search from every dash of a long run would be quadratic).
_HEADER = re.compile(r"(?<!-)-{3,} arguments -{3,}")
_END = re.compile(r"(?<!-)-{3,} end of arguments -{3,}")
# A header that ends its line: what makes a file a run log (an ``echo "--- arguments ---"`` in
# a launch script does not).
_HEADER_LINE = re.compile(r"(?<!-)-{3,} arguments -{3,}+[ \t\r]*$", re.MULTILINE)
# ``  hidden_size ...... 2048``: from a word's start (after any prefix), the value (maybe empty)
# to the line's end; a name of 48 characters or more has no dots, two blanks.
_DOTTED = re.compile(r"(?<![\w.])(?P<name>[A-Za-z_]\w*) \.+(?: (?P<value>.*))?$")
_UNDOTTED = re.compile(r"(?<![\w.])(?P<name>[A-Za-z_]\w{47,})  (?P<value>.*)$")
# megatron/training/tokenizer: `` > padded vocab (size: 50257) with 175 dummy tokens (new size:
# 50432)``, printed by rank 0 right after the block.
_PADDED = re.compile(
    r"padded vocab \(size: (?P<size>[0-9]{1,9})\) with [0-9]{1,9} dummy tokens "
    r"\(new size: (?P<padded>[0-9]{1,9})\)"
)
_PARALLEL_SIZES = {"tp": "tensor_model_parallel_size", "pp": "pipeline_model_parallel_size"}
_PARALLEL_SIZES |= {"cp": "context_parallel_size"}


@dataclass(frozen=True)
class ArgumentsBlock:
    """One arguments block: name -> value as printed, and the line of each (1-based)."""

    line: int  # the header's
    end_line: int | None  # the end line's; None when the log stops (or restarts) before it
    values: Mapping[str, str] = field(hash=False)
    lines: Mapping[str, int] = field(hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "values", MappingProxyType(dict(self.values)))
        object.__setattr__(self, "lines", MappingProxyType(dict(self.lines)))


def holds_arguments_block(text: str) -> bool:
    """Whether ``text`` holds a line that opens Megatron's arguments block."""
    return _HEADER_LINE.search(text) is not None


def arguments_blocks(text: str) -> tuple[ArgumentsBlock, ...]:
    """Every arguments block of the log, in order; a block runs to its end line, or is cut off by
    the next header (a restart) or the end of the text.  Lines in it that are no ``name ...
    value`` (another rank's output) are skipped; a name printed twice keeps its last value."""
    headers = list(_HEADER.finditer(text))
    blocks = []
    line, counted = 1, 0
    for index, header in enumerate(headers):
        line += text.count("\n", counted, header.start())
        counted = header.start()
        limit = headers[index + 1].start() if index + 1 < len(headers) else len(text)
        end = _END.search(text, header.end(), limit)
        values, lines = {}, {}
        body = text[header.end() : end.start() if end else limit].split("\n")
        for offset, row in enumerate(body):
            match = _DOTTED.search(row) or _UNDOTTED.search(row)
            if match:
                values[match["name"]] = (match["value"] or "").strip()  # "" printed as nothing
                lines[match["name"]] = line + offset
        end_line = line + text.count("\n", header.start(), end.start()) if end else None
        blocks.append(ArgumentsBlock(line, end_line, values, lines))
    return tuple(blocks)


def parse_arguments(text: str) -> Mapping[str, str]:
    """The last arguments block rank 0 printed (a restart prints its own), name -> value as
    printed; empty when the log holds none."""
    blocks = arguments_blocks(text)
    return blocks[-1].values if blocks else MappingProxyType({})


def load_run_log(text: str, source: str, name: str, overrides: Overrides | None = None) -> Recipe:
    """The recipe of the run a log's first arguments block describes: its model, its parallel
    sizes (DP from the block's world), its batch and its split, exactly; ``overrides`` replace
    them as they replace a launch script's."""
    overrides = overrides or Overrides()
    blocks = arguments_blocks(text)
    if not blocks:
        raise ConfigError(f"{source}: no Megatron arguments block ('---- arguments ----')")
    block = blocks[0]
    if block.end_line is None:
        raise ConfigError(
            f"{source}:{block.line}: the arguments block is cut off: no "
            "'---- end of arguments ----' line follows it"
        )
    if block.values.get("num_layers", "None") == "None":
        raise ConfigError(
            f"{source}:{block.line}: the arguments block states no num_layers: no GPT run's"
        )
    flags = block_flags(block.values, block.lines, source)
    padded = _padded_vocab(text, block, blocks)
    world = _world(block, overrides, source)
    sizes = world | _vocab(padded, overrides) | dict(overrides.sizes)
    command = "python pretrain_gpt.py " + " ".join(map(shlex.quote, flags.words))
    try:
        recipe = load_megatron_command_line(command, source, replace(overrides, sizes=sizes))
    except ConfigError as exc:
        raise ConfigError(_placed(str(exc), source, flags, block)) from None
    recipe = replace(recipe, model=replace(recipe.model, name=name))
    _check_vocab(recipe, block, padded, overrides, source)
    _check_vpp(recipe, block, overrides, source)
    if flags.deepspeed_moe is not None:
        check_deepspeed_moe(flags.deepspeed_moe, recipe, set(overrides.sizes), source)
    notes = [*recipe.notes, *flags.notes]
    if len(blocks) > 1:
        notes.append(_blocks_note(blocks, source))
    if "dp" not in sizes:
        notes.append(
            f"{source}: the block states no world size (world_size, data_parallel_size): DP is "
            "the smallest the grid allows (give --dp)"
        )
    return replace(recipe, notes=tuple(notes))


def _world(block: ArgumentsBlock, overrides: Overrides, source: str) -> dict[str, int]:
    """DP from the world the block states (``world_size``, ``data_parallel_size``): the run's
    own, or the same world over the user's TP, CP and PP."""
    if "dp" in overrides.sizes:
        return {}
    values, lines = block.values, block.lines
    stated = {k: int_value(values, lines, d, source) or 1 for k, d in _PARALLEL_SIZES.items()}
    world = int_value(values, lines, "world_size", source)
    dp = int_value(values, lines, "data_parallel_size", source)
    grid = stated["tp"] * stated["cp"] * stated["pp"]
    if dp is not None and world is not None and dp * grid != world:
        raise ConfigError(
            f"{source}:{lines['data_parallel_size']}: data_parallel_size {dp} x TP·CP·PP {grid} "
            f"is not the world_size {world} of line {lines['world_size']}"
        )
    if world is None:
        if dp is None:
            return {}
        world = dp * grid
    grid = 1
    for key in ("tp", "cp", "pp"):
        grid *= overrides.sizes.get(key, stated[key])
    if world % grid:
        where = lines.get("world_size") or lines["data_parallel_size"]
        raise ConfigError(
            f"{source}:{where}: the run's world of {world} GPUs is not divisible by TP·CP·PP = "
            f"{grid}: give --dp"
        )
    return {"dp": world // grid}


@dataclass(frozen=True)
class _Padded:
    """The run's ``padded vocab`` line: the tokenizer's vocabulary, what Megatron padded it to."""

    size: int
    padded: int
    line: int


def _padded_vocab(
    text: str, block: ArgumentsBlock, blocks: tuple[ArgumentsBlock, ...]
) -> _Padded | None:
    """The first ``padded vocab`` line after the block's end and before the next block."""
    lines = text.split("\n")
    stop = blocks[1].line - 1 if len(blocks) > 1 else len(lines)
    for number in range(block.end_line or block.line, stop):
        if "padded vocab" in lines[number] and (match := _PADDED.search(lines[number])):
            return _Padded(int(match["size"]), int(match["padded"]), number + 1)
    return None


def _vocab(padded: _Padded | None, overrides: Overrides) -> dict[str, int]:
    """The vocabulary the run's tokenizer had (its ``padded vocab`` line): the block's
    ``vocab_size`` is None for every tokenizer but the null ones."""
    if padded is None or "vocab_size" in overrides.sizes:
        return {}
    return {"vocab_size": padded.size}


def _check_vocab(
    recipe: Recipe,
    block: ArgumentsBlock,
    padded: _Padded | None,
    overrides: Overrides,
    source: str,
) -> None:
    """The run's padded vocabulary is the one this tool sizes (else a ``--padded-vocab-size`` or a
    fork's padding was not read)."""
    if {"vocab_size", "tp"} & overrides.sizes.keys():
        return
    values, lines = block.values, block.lines
    tp = int_value(values, lines, "tensor_model_parallel_size", source) or 1
    ours = recipe.model.padded_vocab_size(tp)
    stated = int_value(values, lines, "padded_vocab_size", source)
    line = lines.get("padded_vocab_size")
    if stated is None and padded is not None:
        stated, line = padded.padded, padded.line
    if stated is not None and stated != ours:
        raise ConfigError(
            f"{source}:{line}: the run's vocabulary is padded to {stated} rows; this tool reads "
            f"{recipe.model.vocab_size} padded to {ours}: refused rather than sized wrong"
        )


def _check_vpp(recipe: Recipe, block: ArgumentsBlock, overrides: Overrides, source: str) -> None:
    """The virtual pipeline size Megatron derived and printed is the one the split gives."""
    if {"pp", "vpp"} & overrides.sizes.keys():
        return
    key = "virtual_pipeline_model_parallel_size"
    if key not in block.values:
        return
    stated = int_value(block.values, block.lines, key, source)
    if (stated or 1) != recipe.parallel.vpp:
        raise ConfigError(
            f"{source}:{block.lines[key]}: {key} {stated} but the split read gives VPP "
            f"{recipe.parallel.vpp}"
        )


_NAMED = re.compile(r"--[a-z0-9][a-z0-9-]*|[A-Za-z_]\w*")


def _placed(message: str, source: str, flags: BlockFlags, block: ArgumentsBlock) -> str:
    """A loader error about the whole file placed at the line of the first key it names."""
    prefix = f"{source}: "
    if not message.startswith(prefix):
        return message
    rest = message[len(prefix) :]
    for word in _NAMED.findall(rest):
        line = flags.lines.get(word) or block.lines.get(word)
        if line:
            return f"{source}:{line}: {rest}"
    return message


def _blocks_note(blocks: tuple[ArgumentsBlock, ...], source: str) -> str:
    """Which block was read, and what the later ones change."""
    first = blocks[0].values
    changed = sorted(
        {k for b in blocks[1:] for k in {*b.values, *first} if b.values.get(k) != first.get(k)}
    )
    where = ", ".join(str(b.line) for b in blocks)
    differ = f"; the later ones differ in {', '.join(changed[:6])}" if changed else ", all alike"
    more = f" and {len(changed) - 6} more" if len(changed) > 6 else ""
    return (
        f"{source}: {len(blocks)} arguments blocks (lines {where}): the first is read{differ}{more}"
    )
