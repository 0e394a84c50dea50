"""Megatron's pipeline layout language (``--pipeline-model-parallel-layout``).

One concept: a layout is the flat list of stage strings Megatron reads, stage ``k`` belonging to
PP rank ``k % PP`` and virtual chunk ``k // PP``.  Parsing reproduces Megatron's grammar exactly
(commas dropped, ``(X)*n`` unrolled, then ``x*n``); validation reproduces
``PipelineParallelLayerLayout.validate_layer_layout`` rule for rule, with messages that say what
is wrong; formatting writes the compact form that parses back to the same layout.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ray_layout.errors import LayoutError

EMBEDDING, DECODER, MTP, LOSS = "E", "t", "m", "L"
SYMBOLS = frozenset("EtmL")
MAX_EXPANDED_LENGTH = 1_000_000  # Megatron has no cap; a typo like t*99999999 should not hang us
MAX_LAYOUT_TEXT = MAX_EXPANDED_LENGTH  # characters of a layout string as written

_COUNT = re.compile(r"\*(\d+)")  # Megatron's ``\d``: any script's digits, as int() reads them
_SYMBOL_REPEAT = re.compile(r"(.)\*(\d+)")


class _Expansion:
    """The length of a layout while it is unrolled: the cap holds for the whole layout, so that a
    thousand repeats that are each under it cannot add up to gigabytes."""

    def __init__(self, length: int) -> None:
        self.length = length

    def repeat(self, unit: str, digits: str, written: int) -> str:
        """``unit`` ``digits`` times, in place of the ``written`` characters that said so."""
        digits = digits.lstrip("0")
        # more digits than the cap has: too many, and never turned into an int (Python refuses
        # over 4,300 digits)
        times = int(digits or "0") if len(digits) <= len(str(MAX_EXPANDED_LENGTH)) else None
        if times is not None:
            self.length += len(unit) * times - written
        if times is None or self.length > MAX_EXPANDED_LENGTH:
            raise LayoutError(f"layout expands to more than {MAX_EXPANDED_LENGTH:,} symbols")
        return unit * times


def _unroll_groups(text: str, expansion: _Expansion) -> str:
    r"""``(X)*n`` unrolled as Megatron's ``re.sub(r'\(([^)]+)\)\*(\d+)', ...)`` unrolls it, in
    linear time: the regex tries every ``(`` of a run of them and scans from each to the next
    ``)``, minutes for a string of 100,000.  A match is the leftmost ``(`` before a ``)`` that
    ``*n`` follows, with a character between them; ``X`` may hold ``(`` (the regex's does)."""
    parts, copied, searched = [], 0, 0
    while (close := text.find(")", searched)) != -1:
        count = _COUNT.match(text, close + 1)
        opening = text.find("(", searched, max(close - 1, 0))  # a character before the ")"
        if count is None or opening == -1:
            searched = close + 1
            continue
        unit = text[opening + 1 : close]
        parts += [text[copied:opening], expansion.repeat(unit, count[1], count.end() - opening)]
        copied = searched = count.end()
    return "".join([*parts, text[copied:]])


def expand(text: str) -> str:
    """The layout with every repetition unrolled, as Megatron unrolls it."""
    if len(text) > MAX_LAYOUT_TEXT:
        raise LayoutError(
            f"layout string of {len(text):,} characters, more than the {MAX_LAYOUT_TEXT:,} a "
            "layout may have"
        )
    text = text.replace(",", "")
    expansion = _Expansion(len(text))
    grouped = _unroll_groups(text, expansion)
    return _SYMBOL_REPEAT.sub(lambda m: expansion.repeat(m[1], m[2], len(m[0])), grouped)


def parse_stages(text: str) -> tuple[str, ...]:
    """The flat list of stages of a layout string; each stage is a string of E/t/m/L."""
    expanded = expand(text)
    stages = tuple(expanded.split("|"))
    for index, stage in enumerate(stages):
        bad = sorted(set(stage) - SYMBOLS)
        if bad:
            code = "" if bad[0].isascii() else f" (U+{ord(bad[0]):04X}, not a Latin letter)"
            raise LayoutError(
                f"invalid symbol {bad[0]!r}{code} in stage {index} ({stage[:40]!r}) of layout "
                f"{text[:80]!r}; known symbols: E, t, m, L, '|', '(X)*n', 'x*n', ','"
            )
    return stages


@dataclass(frozen=True)
class Layout:
    """A pipeline layout: flat stages in Megatron's order, and the PP size that reads them."""

    stages: tuple[str, ...]
    pp: int

    def __post_init__(self) -> None:
        if self.pp < 1:
            raise LayoutError(f"pipeline parallel size must be >= 1, got {self.pp}")
        if len(self.stages) % self.pp:
            raise LayoutError(
                f"layout has {len(self.stages)} stages, not divisible by PP={self.pp}"
            )

    @classmethod
    def parse(cls, text: str, pp: int) -> Layout:
        return cls(parse_stages(text), pp)

    @property
    def vpp(self) -> int:
        return len(self.stages) // self.pp

    def stage(self, pp_rank: int, chunk: int = 0) -> str:
        return self.stages[chunk * self.pp + pp_rank]

    def rank_chunks(self, pp_rank: int) -> tuple[str, ...]:
        """The stages PP rank ``pp_rank`` runs, chunk 0 first."""
        return self.stages[pp_rank :: self.pp]

    @property
    def flat(self) -> str:
        """Every symbol in layer order (chunk-major), as Megatron flattens it."""
        return "".join(self.stages)

    @property
    def mtp_standalone(self) -> bool:
        """Some PP rank other than the last holds MTP layers."""
        return any(MTP in self.stage(rank, self.vpp - 1) for rank in range(self.pp - 1))

    def __str__(self) -> str:
        return format_stages(self.stages)


def validate(layout: Layout, num_layers: int, mtp_num_layers: int) -> bool:
    """Megatron's checks of a layout; raises :class:`LayoutError` naming the first problem and
    returns whether the layout is MTP standalone (MTP on a rank other than the last)."""
    flat = layout.flat
    if not flat:
        raise LayoutError("layout holds no layers: it needs at least E and L")
    if flat[0] != EMBEDDING:
        raise LayoutError(
            f"the first layer must be the embedding E, but the layout starts {flat[0]!r}"
        )
    if flat[-1] != LOSS:
        raise LayoutError(f"the last layer must be the loss L, but the layout ends {flat[-1]!r}")
    if flat.count(EMBEDDING) != 1:
        raise LayoutError(f"E must appear exactly once, found {flat.count(EMBEDDING)}")
    if flat.count(LOSS) != 1:
        raise LayoutError(f"L must appear exactly once, found {flat.count(LOSS)}")
    if flat.count(DECODER) != num_layers:
        raise LayoutError(
            f"layout has {flat.count(DECODER)} decoder layers t, the model has {num_layers}"
        )
    if flat.count(MTP) != mtp_num_layers:
        raise LayoutError(
            f"layout has {flat.count(MTP)} MTP layers m, the model has {mtp_num_layers}"
        )
    if MTP in flat and DECODER in flat[flat.index(MTP) :]:
        raise LayoutError("decoder layers t must all come before the first MTP layer m")
    for rank in range(layout.pp):
        chunks = layout.rank_chunks(rank)
        for chunk, stage in enumerate(chunks[:-1]):
            if MTP in stage:
                raise LayoutError(
                    f"MTP must be in the last virtual chunk of its rank; PP rank {rank} holds m "
                    f"in chunk {chunk} of {layout.vpp}"
                )
        if MTP in chunks[-1] and chunks[-1].count(MTP) != mtp_num_layers:
            raise LayoutError(
                f"all {mtp_num_layers} MTP layers must be in one virtual stage; PP rank {rank}'s "
                f"last chunk holds {chunks[-1].count(MTP)}"
            )
    return layout.mtp_standalone


def validate_buildable(
    layout: Layout, num_layers: int, mtp_num_layers: int, *, tied_embeddings: bool
) -> bool:
    """:func:`validate`, then refuse what megatron-core 0.16.1 cannot build
    (:func:`build_problem`): the check for a layout that will run."""
    standalone = validate(layout, num_layers, mtp_num_layers)
    problem = build_problem(layout, tied_embeddings=tied_embeddings)
    if problem:
        raise LayoutError(problem)
    return standalone


def first_mtp_stage(pp: int, vpp: int, *, tied_embeddings: bool) -> int:
    """The first flat stage the MTP block may sit in: a rank's last chunk (Megatron's rule); with
    VPP > 1 and tied embeddings only the last rank's (:func:`build_problem`)."""
    if tied_embeddings and pp > 1 and vpp > 1:
        return pp * vpp - 1
    return (vpp - 1) * pp


def build_problem(layout: Layout, *, tied_embeddings: bool) -> str | None:
    """What megatron-core 0.16.1 accepts but cannot build: with VPP > 1 and tied embeddings, MTP
    on a rank other than the last.  ``pretrain_gpt.py``'s embedding group is PP rank 0, the last
    rank when the embeddings are tied, and each rank holding MTP (``get_embedding_ranks``); while
    a chunk is built it all-reduces the shared embedding over that group when it holds MTP or is
    rank 0's first or the last rank's last chunk, and on a rank inside the group on every chunk
    (``LanguageModule.setup_embeddings_and_output_layer``, ``_is_in_embd_group``).  MTP on rank
    0 makes it call twice against the last rank's once (the build hangs); MTP on a middle rank
    makes that rank call on chunks that hold no embedding (the build fails)."""
    if layout.pp == 1 or layout.vpp == 1 or not tied_embeddings:
        return None
    mtp_rank = next((r for r in range(layout.pp) if MTP in layout.rank_chunks(r)[-1]), None)
    if mtp_rank is None or mtp_rank == layout.pp - 1:
        return None
    return (
        f"layout {layout} does not build in megatron-core 0.16.1: with tied embeddings and VPP "
        f"{layout.vpp}, MTP on PP rank {mtp_rank} makes the embedding group's ranks all-reduce "
        "the shared embedding unequally while building; put MTP on the last rank's last chunk, "
        "or untie the embeddings (--untie-embeddings-and-output-weights)"
    )


def placement_problems(layout: Layout) -> list[str]:
    """What Megatron accepts but does not do: it always builds the embedding on PP rank 0,
    chunk 0 and the output layer + loss on the last rank's last chunk, whatever the string says."""
    problems = []
    if EMBEDDING not in layout.stages[0]:
        problems.append("E is not in stage 0: Megatron still builds the embedding on PP rank 0")
    if LOSS not in layout.stages[-1]:
        problems.append(
            "L is not in the last stage: Megatron still builds the output layer and loss on the "
            "last PP rank's last chunk"
        )
    return problems


def _format_stage(stage: str) -> str:
    """Runs of three or more as ``t*5``; a pair of decoder layers as ``tt`` at the end of a
    stage and ``t*2`` before other symbols, so the count stays visible (``t*2mL``, ``(tt|)*29``)."""
    parts = []
    for match in re.finditer(r"(.)\1*", stage):
        symbol, count = match.group(1), len(match.group(0))
        at_end = match.end() == len(stage)
        if count == 1 or (count == 2 and (at_end or symbol != DECODER)):
            parts.append(symbol * count)
        else:
            parts.append(f"{symbol}*{count}")
    return "".join(parts)


def format_stages(stages: tuple[str, ...] | list[str]) -> str:
    """The compact string of a layout: runs of one symbol as ``t*5`` and runs of identical
    stages as ``(tt|)*29``, whichever is shorter; parsing it gives ``stages`` back."""
    texts = [_format_stage(s) for s in stages]
    out: list[str] = []
    index = 0
    while index < len(texts):
        run = 1
        while index + run < len(texts) and texts[index + run] == texts[index]:
            run += 1
        last = index + run == len(texts)
        plain = "|".join(texts[index : index + run]) + ("" if last else "|")
        repeats = run - 1 if last else run
        grouped = f"({texts[index]}|)*{repeats}" + (texts[index] if last else "")
        out.append(grouped if repeats >= 2 and len(grouped) < len(plain) else plain)
        index += run
    return "".join(out)


def pretty(layout: Layout) -> str:
    """One line per PP rank with its chunks, like Megatron's own log of a parsed layout."""
    width = max(len(_format_stage(s) or "-") for s in layout.stages)
    lines = []
    for rank in range(layout.pp):
        chunks = [(_format_stage(s) or "-").ljust(width) for s in layout.rank_chunks(rank)]
        lines.append(f"PP rank {rank:>2}: " + "  ".join(chunks).rstrip())
    return "\n".join(lines)


def check_interleaving(pp: int, vpp: int, *, overlap_p2p_comm: bool) -> None:
    """``arguments.py:validate_args``: interleaving needs PP > 2, or PP > 1 with p2p overlap."""
    if vpp > 1 and pp <= (1 if overlap_p2p_comm else 2):
        raise LayoutError(
            f"Megatron's interleaved schedule (VPP={vpp}) needs PP > 2"
            + (
                ""
                if overlap_p2p_comm
                else " without p2p overlap (PP > 1 with it: Megatron's default, off with "
                "--no-overlap-p2p-communication)"
            )
            + f", got PP={pp}"
        )
