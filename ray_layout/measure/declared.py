"""A log against what its run was declared to be: nothing is stored or fitted that its own lines
contradict.

A run reaches ``ingest`` or ``fit`` as a layout, parallel sizes and maybe a micro-batch count,
given by a person.  The log says much of the same again: the world rank 0 states at start-up,
the ranks its timers name, which ranks never receive a forward activation (the first pipeline
stage), the global batch size, how many complete timer blocks it holds.  Where they disagree the
declaration is refused with one line naming both; where the user left a size to the config
(not ``explicit``), the log's is taken and a note says so.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from ray_layout.errors import ConfigError, LayoutError, MeasurementError
from ray_layout.measure.log_records import MIN_STEADY_INTERVALS, WARMUP_INTERVALS, ParsedLog
from ray_layout.measure.log_world import INTEGER, LogWorld
from ray_layout.measure.observations import unmeasurable
from ray_layout.model.costs import stage_units
from ray_layout.model.fields import ModelSpec
from ray_layout.model.layout import Layout, validate
from ray_layout.model.sizing import DECODER, EMBEDDING, LOSS, MTP
from ray_layout.model.spec import ParallelConfig

_COMPUTE = ("forward-compute", "backward-compute")


@dataclass(frozen=True)
class CheckedRun:
    """A run as its log confirms it: what to store and fit, and what was taken from the log."""

    parsed: ParsedLog  # without a timer block the log's end cut short
    layout: Layout
    parallel: ParallelConfig
    num_microbatches: int
    notes: tuple[str, ...] = ()


def check_log(
    parsed: ParsedLog,
    layout: Layout,
    parallel: ParallelConfig,
    num_microbatches: int | None,
    source: str,
    explicit: Collection[str] = (),
    model: ModelSpec | None = None,
) -> CheckedRun:
    """The run ``parsed`` shows, checked against the declared layout, sizes, micro-batches and,
    when given, ``model`` (the shape its arguments print).

    ``explicit`` names the sizes (``ParallelConfig`` fields: tp, pp, dp, ...) the user gave
    for this run; any other size the log states replaces the declared one, with a note.
    Raises :class:`ConfigError` when the log contradicts the declaration and
    :class:`MeasurementError` when it is too short, lacks ranks or holds more than one run.
    """
    if model is not None:
        check_shape(parsed.arguments, model, source)
    stated = {ARGUMENT_SIZES[k]: v for k, v in _integers(parsed.arguments).items()}
    parallel, notes = take_stated(stated, parallel, explicit, source)
    parallel, world_notes = settle_world(parsed.world, parallel, explicit, source)
    notes += world_notes
    if parallel.pp != layout.pp:
        try:
            layout = Layout.parse(str(layout), parallel.pp)
        except LayoutError as exc:
            raise ConfigError(f"{source}: with the log's PP {parallel.pp}: {exc}") from None
        notes += (f"{source}: layout {layout} read with the log's PP {parallel.pp}",)
    parallel = replace(parallel, vpp=layout.vpp)
    check_one_run(parsed, source)
    parsed, cut = complete_blocks(parsed, parallel.world_size, source)
    notes += cut
    if (problem := unmeasurable(parsed.timers)) is not None:
        raise MeasurementError(f"{source}: {problem}")  # no fit may use it: not stored either
    check_pipeline(parsed, layout, source)
    check_stated_layout(parsed, layout, source)
    microbatches = check_microbatches(parsed, parallel, num_microbatches, source, explicit)
    return CheckedRun(parsed, layout, parallel, microbatches, notes)


# Megatron's argument names for the sizes a log states, as ``ParallelConfig`` names them.
ARGUMENT_SIZES = {
    "tensor_model_parallel_size": "tp",
    "pipeline_model_parallel_size": "pp",
    "context_parallel_size": "cp",
    "expert_model_parallel_size": "ep",
    "expert_tensor_parallel_size": "etp",
    "data_parallel_size": "dp",
    "micro_batch_size": "micro_batch_size",
    "global_batch_size": "global_batch_size",
}
# The model's shape as the arguments print it (``ModelSpec``'s names); those printed ``None``
# for 0 in NONE_IS_ZERO, the experts' own only compared for MoE models.
SHAPE_ARGUMENTS = (
    "num_layers",
    "hidden_size",
    "num_attention_heads",
    "ffn_hidden_size",
    "seq_length",
    "num_experts",
    "mtp_num_layers",
)
MOE_ARGUMENTS = ("moe_ffn_hidden_size", "moe_router_topk")
NONE_IS_ZERO = frozenset({"num_experts", "mtp_num_layers"})
# p2p timers only one of Megatron's two pipeline schedules times (megatron/core/pipeline_parallel/
# schedules.py): the interleaved one combines a send with the next receive in one direction.
ONE_F_ONE_B_TIMERS = frozenset(
    {"forward-send", "backward-send", "forward-send-backward-recv", "backward-send-forward-recv"}
)
INTERLEAVED_TIMERS = frozenset(
    {
        "forward-send-forward-recv",
        "backward-send-backward-recv",
        "forward-backward-send-forward-backward-recv",
    }
)


def _integers(arguments: Mapping[str, str], names: Collection[str] = ARGUMENT_SIZES) -> dict:
    """The named arguments printed as integers (``None`` as 0 where NONE_IS_ZERO says so)."""
    found = {}
    for name in names:
        text = arguments.get(name)
        if text is not None and re.fullmatch(INTEGER, text):
            found[name] = int(text)
        elif text == "None" and name in NONE_IS_ZERO:
            found[name] = 0
    return found


def check_shape(arguments: Mapping[str, str], model: ModelSpec, source: str) -> None:
    """Refuse the log of another model: a shape its arguments print that the config's lacks."""
    printed = _integers(arguments, SHAPE_ARGUMENTS)
    if printed.get("num_experts") and model.num_experts:
        printed |= _integers(arguments, MOE_ARGUMENTS)
    for name, value in printed.items():
        if value != getattr(model, name):
            raise ConfigError(
                f"{source}: the log's arguments say {name} {value}, but the config's model "
                f"{model.name!r} has {getattr(model, name)}: a log of another model"
            )


def check_stated_layout(parsed: ParsedLog, layout: Layout, source: str) -> None:
    """The layout and VPP the log states (its arguments, the p2p timers its schedule times)
    against the declared layout: a VPP-2 layout declared for a VPP-1 log is refused."""
    vpp_text = parsed.arguments.get("virtual_pipeline_model_parallel_size")
    if vpp_text is not None and (re.fullmatch(INTEGER, vpp_text) or vpp_text == "None"):
        vpp = 1 if vpp_text == "None" else int(vpp_text)
        if vpp != layout.vpp:
            raise ConfigError(
                f"{source}: the log's arguments say virtual_pipeline_model_parallel_size "
                f"{vpp_text}, but layout {layout} is VPP {layout.vpp} on PP {layout.pp}"
            )
    stated = parsed.arguments.get("pipeline_model_parallel_layout", "None").strip("'\"")
    if stated != "None":
        try:
            theirs = Layout.parse(stated, layout.pp)
        except LayoutError:
            theirs = None  # a form this reader does not take: the timers still judge it
        if theirs is not None and str(theirs) != str(layout):
            raise ConfigError(
                f"{source}: the log's arguments say pipeline_model_parallel_layout {theirs}, "
                f"but the run was declared as layout {layout}"
            )
    timed = {record.timer for record in parsed.timers if record.rank is not None}
    interleaved, plain = sorted(timed & INTERLEAVED_TIMERS), sorted(timed & ONE_F_ONE_B_TIMERS)
    if interleaved and layout.vpp == 1:
        raise ConfigError(
            f"{source}: the timers show the interleaved schedule ({interleaved[0]}), so VPP "
            f"over 1, but layout {layout} is VPP 1 on PP {layout.pp}"
        )
    if plain and not interleaved and layout.vpp > 1:
        raise ConfigError(
            f"{source}: the timers show the non-interleaved schedule ({plain[0]}, and none "
            f"of the interleaved one's), so VPP 1, but layout {layout} is VPP {layout.vpp} on "
            f"PP {layout.pp}"
        )


def check_one_run(parsed: ParsedLog, source: str) -> None:
    """Refuse a log of several runs: a restarted job appended to the same file, or two runs'
    lines mixed, shows an iteration counter that goes back (or stands still); rank 0 states
    its world again at each start."""
    if parsed.world is not None and parsed.world.earlier:
        raise MeasurementError(
            f"{source}: the log states its world at lines "
            f"{', '.join(map(str, (*parsed.world.earlier, parsed.world.line)))}: a job started "
            "more than once into it (a restart appended); give each run's own log"
        )
    for before, after in itertools.pairwise(parsed.iterations):
        if after.iteration <= before.iteration:
            raise MeasurementError(
                f"{source}: iteration {after.iteration} follows iteration {before.iteration}: "
                "the log holds more than one run (a restarted job appended to it, or two "
                "runs' lines mixed); give each run's own log"
            )


def settle_world(
    world: LogWorld | None, parallel: ParallelConfig, explicit: Collection[str], source: str
) -> tuple[ParallelConfig, tuple[str, ...]]:
    """The sizes the run had: the log's where it states them, refused where the user gave
    another explicitly, and checked to multiply to the log's world size."""
    if world is None:
        return parallel, ()
    where = f"{source} (line {world.line}) states {world.describe()}"
    settled, notes = take_stated(world.sizes, parallel, explicit, source, where)
    if settled.world_size != world.world_size:
        raise ConfigError(
            f"{where}, but TP·CP·DP·PP = {settled.world_size} for the run "
            f"(TP {settled.tp}, CP {settled.cp}, DP {settled.dp}, PP {settled.pp})"
        )
    per_stage = settled.tp * settled.cp * settled.dp
    if per_stage % (settled.ep * settled.etp):
        raise ConfigError(
            f"{where}: {per_stage} GPU(s) per pipeline stage cannot hold EP {settled.ep} × "
            f"ETP {settled.etp} of the run's config"
        )
    return settled, notes


def take_stated(
    stated: Mapping[str, int],
    parallel: ParallelConfig,
    explicit: Collection[str],
    source: str,
    where: str | None = None,
) -> tuple[ParallelConfig, tuple[str, ...]]:
    """The sizes a log states (``where``: the line that states them all; default: its
    arguments) in place of the declared ones; refused where the user gave another explicitly,
    noted where it came from the config."""
    taken, notes = {}, []
    for name, size in stated.items():
        declared = getattr(parallel, name)
        if size == declared:
            continue
        label = name.replace("_", " ") if "batch" in name else name.upper()
        if name in explicit:
            said = where or f"{source}: the log's arguments state {label} {size}"
            raise ConfigError(f"{said}, but the run was given {label} {declared}")
        taken[name] = size
        notes.append(f"{source}: {label} {size} from the log (the config says {declared})")
    return replace(parallel, **taken), tuple(notes)


def complete_blocks(
    parsed: ParsedLog, world_size: int, source: str
) -> tuple[ParsedLog, tuple[str, ...]]:
    """The log without a last training block that a cut left short (a note says so), refused
    when a rank is outside the world, an earlier block lacks ranks, or too few blocks remain.

    A block is whole when every rank of the world reports forward- and backward-compute, and
    the last one, printed last, when it also holds every (timer, rank) the block before it
    holds.  Logs without per-rank timers are left as they are (the fit refuses them), but the
    ranks of their memory lines must still be in the world."""
    ranks = {record.rank for record in parsed.timers if record.rank is not None}
    if ranks and max(ranks) + 1 != world_size:
        raise ConfigError(
            f"{source}: the timers name ranks up to {max(ranks)}, a world of "
            f"{max(ranks) + 1} GPUs, but the run's TP·CP·DP·PP is {world_size}; "
            "check its parallel sizes"
        )
    printing = max((record.rank for record in parsed.memory), default=-1)
    if printing >= world_size:
        raise ConfigError(
            f"{source}: rank {printing} prints its memory, outside the run's world of "
            f"TP·CP·DP·PP = {world_size}; check its parallel sizes"
        )
    if not ranks:
        return parsed, ()
    entries: dict[int, set[tuple[str, int]]] = {}
    for record in parsed.timers:
        if record.rank is not None:
            entries.setdefault(record.interval, set()).add((record.timer, record.rank))
    blocks = [i for i in parsed.training_intervals if (_COMPUTE[0], 0) in entries.get(i, ())]
    if not blocks:
        return parsed, ()  # no forward-compute (--timing-log-level 1): the fit says so
    everyone = {(timer, rank) for timer in _COMPUTE for rank in range(world_size)}
    notes: tuple[str, ...] = ()
    if len(blocks) > 1 and not entries[blocks[-2]] <= entries[blocks[-1]]:
        cut = blocks.pop()
        parsed = replace(parsed, timers=tuple(r for r in parsed.timers if r.interval != cut))
        notes = (f"{source}: the last timer block (interval {cut}) is cut short and left out",)
    for block in blocks:
        missing = sorted({rank for _, rank in everyone - entries[block]})
        if missing:
            raise MeasurementError(
                f"{source}: the timer block of interval {block} lacks rank(s) "
                f"{_ranks(missing)} of {world_size}; the log is cut or mixes runs"
            )
    steady = len(blocks) - WARMUP_INTERVALS
    if steady < MIN_STEADY_INTERVALS:
        raise MeasurementError(
            f"{source}: {len(blocks)} complete training timer block(s), {max(steady, 0)} after "
            f"the first {WARMUP_INTERVALS}; the fit needs {MIN_STEADY_INTERVALS} (was the log "
            "cut off? run more iterations with --log-interval 1)"
        )
    return parsed, notes


def check_pipeline(parsed: ParsedLog, layout: Layout, source: str) -> None:
    """The number of pipeline stages the timers show against the declared PP: the first stage's
    ranks never time a ``forward-recv`` (in 1F1B and interleaved schedules alike), every other
    rank does, so a world of W with F such ranks has W / F stages."""
    receiving = {r.rank for r in parsed.timers if r.rank is not None and r.timer == "forward-recv"}
    computing = {r.rank for r in parsed.timers if r.rank is not None and r.timer == _COMPUTE[0]}
    if not computing:
        return
    first = computing - receiving
    shown = len(computing) // len(first) if first and receiving else 1
    if shown != layout.pp:
        raise ConfigError(
            f"{source}: the timers show {shown} pipeline stage(s) ({len(first)} of "
            f"{len(computing)} ranks never receive a forward activation), but the run was "
            f"declared with PP {layout.pp} (layout {layout}, VPP {layout.vpp})"
        )


def check_microbatches(
    parsed: ParsedLog,
    parallel: ParallelConfig,
    given: int | None,
    source: str,
    explicit: Collection[str] = (),
) -> int:
    """Micro-batches per step: the log's global batch size / (micro-batch size × DP), which a
    given count (and a global batch size given explicitly) must equal; the given count where
    the log prints no batch size."""
    sizes = {it.global_batch_size for it in parsed.iterations if it.global_batch_size}
    if "global_batch_size" in explicit and sizes and sizes != {parallel.global_batch_size}:
        raise ConfigError(
            f"{source}: the log's global batch size is {min(sizes)}, but "
            f"--global-batch-size {parallel.global_batch_size} was given"
        )
    if len(sizes) > 1:
        raise MeasurementError(
            f"{source}: the global batch size changes within the log ({sorted(sizes)}): a "
            "batch-size ramp-up is no steady profile"
        )
    if not sizes:
        if given:
            return given
        raise MeasurementError(
            f"{source}: the number of micro-batches is unknown: the log shows no global batch "
            "size; give --micro-batches"
        )
    batch, per_microbatch = sizes.pop(), parallel.micro_batch_size * parallel.dp
    logged, rest = divmod(batch, per_microbatch)
    if rest or not logged:
        raise ConfigError(
            f"{source}: the log's global batch size {batch} is no multiple of micro-batch size "
            f"{parallel.micro_batch_size} × DP {parallel.dp}; check the run's sizes"
        )
    if given and given != logged:
        raise ConfigError(
            f"{source}: the log's global batch size {batch} / (micro-batch size "
            f"{parallel.micro_batch_size} × DP {parallel.dp}) = {logged} micro-batches, but "
            f"{given} were given"
        )
    return logged


def _ranks(ranks: list[int]) -> str:
    shown = ", ".join(map(str, ranks[:8]))
    return shown + (f" and {len(ranks) - 8} more" if len(ranks) > 8 else "")


# Sizes every run of one fit must share: unit costs hold for one micro-batch size, TP, CP, EP.
# (DP and ETP change the step tail and memory.)  PP and VPP are each run's own.
SHARED_SIZES = ("tp", "cp", "ep", "etp", "dp", "micro_batch_size")


def runs_parallel(
    parallel: ParallelConfig,
    runs: Sequence[tuple[str, ParallelConfig]],
    explicit: Collection[str] = (),
) -> tuple[ParallelConfig, tuple[str, ...]]:
    """The sizes a fit of ``runs`` (name, sizes) is for: theirs, which must agree; refused
    where they differ from a size the user gave explicitly, noted where from the config."""
    if not runs:
        return parallel, ()
    first, sizes = runs[0]
    taken, notes = {}, []
    for name in SHARED_SIZES:
        values = {getattr(run, name) for _, run in runs}
        label = name.replace("_", " ") if name == "micro_batch_size" else name.upper()
        if len(values) > 1:
            other, run = next((n, r) for n, r in runs if getattr(r, name) != getattr(sizes, name))
            raise ConfigError(
                f"runs of one fit must share {label}: {first} ran {getattr(sizes, name)}, "
                f"{other} ran {getattr(run, name)}"
            )
        (value,) = values
        if value == getattr(parallel, name):
            continue
        if name in explicit:
            raise ConfigError(
                f"the runs ran {label} {value} ({first}, ...), but {label} "
                f"{getattr(parallel, name)} was given"
            )
        taken[name] = value
        notes.append(f"{label} {value} from the runs (the config says {getattr(parallel, name)})")
    return replace(parallel, **taken), tuple(notes)


def suggest_layout(
    model: ModelSpec, layout: Layout, stage_ms: np.ndarray, unit_ms: Mapping[str, float]
) -> Layout | None:
    """The layout of ``layout.pp`` stages whose compute under ``unit_ms`` (forward + backward
    per micro-batch) best matches each rank's measured ``stage_ms``: contiguous runs of Megatron's
    layer order, the squared relative errors summed, solved by dynamic programming.  None for
    interleaved layouts (a rank's chunks are not contiguous) or when the best is no valid
    layout."""
    if layout.vpp != 1:
        return None
    symbols = EMBEDDING + DECODER * model.num_layers + MTP * model.mtp_num_layers + LOSS
    costs = [unit_ms[unit] for (unit,) in stage_units(model, list(symbols))]
    ends = np.concatenate([[0.0], np.cumsum(costs)])  # ends[j]: the first j symbols
    n, targets = len(symbols), np.maximum(np.asarray(stage_ms, dtype=float), 1e-9)
    best = np.full((layout.pp + 1, n + 1), np.inf)
    cut = np.zeros((layout.pp + 1, n + 1), dtype=int)
    best[0, 0] = 0.0
    for stage, target in enumerate(targets, start=1):
        for j in range(stage, n + 1):
            starts = np.arange(stage - 1, j)
            error = best[stage - 1, starts] + ((ends[j] - ends[starts] - target) / target) ** 2
            cut[stage, j] = starts[np.argmin(error)]
            best[stage, j] = error.min()
    bounds, j = [n], n
    for stage in range(layout.pp, 0, -1):
        j = cut[stage, j]
        bounds.append(j)
    bounds.reverse()
    found = Layout(tuple(symbols[a:b] for a, b in itertools.pairwise(bounds)), layout.pp)
    try:
        validate(found, model.num_layers, model.mtp_num_layers)
    except LayoutError:
        return None
    return found
