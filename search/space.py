"""Every layout Megatron accepts for a model shape, enumerated lazily and counted without
enumeration.

A valid layout is the sequence ``E t^N m^K L`` cut into PP x VPP contiguous stages, with all MTP
layers in one stage that sits in the last virtual chunk of its rank (Megatron's rules, see
``ray_layout.model.layout.validate``), and not PP rank 0's with VPP > 1, which megatron-core
0.16.1 accepts but cannot build (``ray_layout.model.layout.build_problem``).  Treating ``m^K``
as one block, a layout is a choice of cut points between the items ``E, t_1..t_N, M, L``: the
enumeration walks those choices with ``itertools`` and the count runs a dynamic programme over
(item, stage), so the two are independent and can check each other.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ray_layout.errors import LayoutError
from ray_layout.model.fields import ModelSpec
from ray_layout.model.layout import (
    DECODER,
    EMBEDDING,
    LOSS,
    MTP,
    Layout,
    first_mtp_stage,
    format_stages,
)
from ray_layout.model.spec import ParallelConfig


@dataclass(frozen=True)
class SpaceCount:
    valid: int  # layouts Megatron accepts under the space's stage rules, standalone included
    standalone: int  # MTP-standalone layouts among them

    total: int  # what the space enumerates: valid, less standalone unless they are allowed


@dataclass(frozen=True)
class LayoutSpace:
    """The layouts of ``num_layers`` decoder and ``mtp_num_layers`` MTP layers on PP x VPP.

    By default every stage is non-empty, E sits in stage 0 and L in the last stage (where
    Megatron builds them whatever the string says), and MTP-standalone layouts are left out.
    ``require_placement=False`` with empty stages allowed counts exactly what megatron-core's
    validator accepts.
    """

    num_layers: int
    mtp_num_layers: int
    pp: int
    vpp: int = 1
    allow_empty_stages: bool = False
    allow_standalone_mtp: bool = False
    require_placement: bool = True
    tied_embeddings: bool = True  # Megatron's default; where MTP may stand alone (build_problem)

    @classmethod
    def of(
        cls,
        model: ModelSpec,
        parallel: ParallelConfig,
        *,
        allow_empty_stages: bool = False,
        allow_standalone_mtp: bool = False,
    ) -> LayoutSpace:
        """The layouts of ``model`` on ``parallel``'s PP x VPP."""
        return cls(
            model.num_layers,
            model.mtp_num_layers,
            parallel.pp,
            parallel.vpp,
            allow_empty_stages=allow_empty_stages,
            allow_standalone_mtp=allow_standalone_mtp,
            tied_embeddings=model.tied_embeddings,
        )

    def __post_init__(self) -> None:
        if self.num_layers < 0 or self.mtp_num_layers < 0:
            raise LayoutError("layer counts cannot be negative")
        if self.pp < 1 or self.vpp < 1:
            raise LayoutError(f"PP and VPP must be >= 1, got PP={self.pp} VPP={self.vpp}")

    @property
    def num_stages(self) -> int:
        return self.pp * self.vpp

    @cached_property
    def _items(self) -> tuple[str, ...]:
        block = (MTP * self.mtp_num_layers,) if self.mtp_num_layers else ()
        return (EMBEDDING,) + (DECODER,) * self.num_layers + block + (LOSS,)

    @property
    def _mtp_item(self) -> int | None:
        return self.num_layers + 1 if self.mtp_num_layers else None

    @property
    def first_mtp_stage(self) -> int:
        """The first flat stage the MTP block may sit in (Megatron's rule, and what
        megatron-core 0.16.1 builds: ``ray_layout.model.layout.build_problem``)."""
        return first_mtp_stage(self.pp, self.vpp, tied_embeddings=self.tied_embeddings)

    def _mtp_stage_allowed(self, stage: int) -> tuple[bool, bool]:
        """(valid, standalone) for the MTP block sitting in flat stage ``stage``."""
        valid = stage >= self.first_mtp_stage
        standalone = stage != self.num_stages - 1
        return valid, standalone

    @classmethod
    def holding(cls, layout: Layout) -> tuple[LayoutSpace, np.ndarray]:
        """The widest space that contains ``layout`` (everything megatron-core accepts, built
        untied), and
        the layout's cut points in it: stage boundaries in items, the MTP block one item."""
        flat = layout.flat
        mtp = flat.count(MTP)
        space = cls(
            flat.count(DECODER),
            mtp,
            layout.pp,
            layout.vpp,
            allow_empty_stages=True,
            allow_standalone_mtp=True,
            require_placement=False,
            tied_embeddings=False,
        )
        bounds = np.cumsum([len(s) for s in layout.stages])[:-1]
        mtp_start = flat.find(MTP) if mtp else len(flat)
        cuts = [b if b <= mtp_start else b - mtp + 1 for b in bounds]
        return space, np.array(cuts, dtype=np.int64)

    # ---- counting -------------------------------------------------------------------------

    def count(self) -> SpaceCount:
        """Dynamic programme over items and stages: ways[s] = ways to have placed the items so
        far with the latest one in stage s, split by whether M went to a standalone stage."""
        stages, items = self.num_stages, self._items
        placed = self.require_placement or not self.allow_empty_stages
        first_stages = range(1) if placed else range(stages)
        kept = [0] * stages  # ways with M (if any) in a valid, counted stage
        alone = [0] * stages  # ways with M in a valid standalone stage
        for s in first_stages:
            kept[s] = 1
        for index in range(1, len(items)):
            new_kept, new_alone = [0] * stages, [0] * stages
            prefix_kept = prefix_alone = 0
            for s in range(stages):
                if self.allow_empty_stages:
                    prefix_kept += kept[s]
                    prefix_alone += alone[s]
                    reach_kept, reach_alone = prefix_kept, prefix_alone  # any earlier stage
                else:
                    reach_kept = kept[s] + (kept[s - 1] if s else 0)  # same or next stage
                    reach_alone = alone[s] + (alone[s - 1] if s else 0)
                if index == self._mtp_item:
                    valid, standalone = self._mtp_stage_allowed(s)
                    if valid:
                        if standalone:
                            new_alone[s] = reach_kept + reach_alone
                        else:
                            new_kept[s] = reach_kept + reach_alone
                else:
                    new_kept[s], new_alone[s] = reach_kept, reach_alone
            kept, alone = new_kept, new_alone
        last_stages = [stages - 1] if placed else range(stages)
        total_kept = sum(kept[s] for s in last_stages)
        total_alone = sum(alone[s] for s in last_stages)
        total = total_kept + (total_alone if self.allow_standalone_mtp else 0)
        return SpaceCount(valid=total_kept + total_alone, standalone=total_alone, total=total)

    # ---- enumeration ----------------------------------------------------------------------

    def _cut_sets(self) -> Iterator[tuple[int, ...]]:
        """Cut positions: cut c puts items[:c] before it; S-1 cuts make S stages."""
        n, cuts = len(self._items), self.num_stages - 1
        if not self.allow_empty_stages:
            return itertools.combinations(range(1, n), cuts)
        low, high = (1, n - 1) if self.require_placement else (0, n)
        return itertools.combinations_with_replacement(range(low, high + 1), cuts)

    def cut_points(self) -> Iterator[tuple[tuple[int, ...], bool]]:
        """(cuts, mtp_standalone) for every layout of the space, lazily."""
        mtp_item = self._mtp_item
        for cuts in self._cut_sets():
            standalone = False
            if mtp_item is not None:
                mtp_stage = sum(1 for c in cuts if c <= mtp_item)
                valid, standalone = self._mtp_stage_allowed(mtp_stage)
                if not valid or (standalone and not self.allow_standalone_mtp):
                    continue
            yield cuts, standalone

    def cut_blocks(self, block_size: int = 4096) -> Iterator[np.ndarray]:
        """The space's cut sets as (n, S - 1) integer arrays, in enumeration order."""
        raw = self._cut_sets()
        while True:
            block = np.array(list(itertools.islice(raw, block_size)), dtype=np.int64)
            if not len(block):
                return
            block = block.reshape(len(block), self.num_stages - 1)
            if self._mtp_item is not None:
                mtp_stage = (block <= self._mtp_item).sum(axis=1)
                valid = mtp_stage >= self.first_mtp_stage
                if not self.allow_standalone_mtp:
                    valid &= mtp_stage == self.num_stages - 1
                block = block[valid]
            if len(block):
                yield block

    def unit_counts(
        self, cuts: np.ndarray, units: Sequence[str], moe_pattern: Sequence[bool]
    ) -> np.ndarray:
        """(n, S, U) how many of each unit every stage holds; decoder units are ``t`` or, for a
        model that mixes them, ``t_dense`` and ``t_moe`` by ``moe_pattern``."""
        n_items = len(self._items)
        bounds = np.concatenate(
            [np.zeros((len(cuts), 1), dtype=np.int64), cuts, np.full((len(cuts), 1), n_items)],
            axis=1,
        )
        low, high = bounds[:, :-1], bounds[:, 1:]
        layers = self.num_layers
        first_layer = np.clip(low - 1, 0, layers)
        end_layer = np.clip(high - 1, 0, layers)
        moe_prefix = np.concatenate([[0], np.cumsum(np.asarray(moe_pattern, dtype=np.int64))])
        moe = moe_prefix[end_layer] - moe_prefix[first_layer]
        decoder = end_layer - first_layer
        counts = np.zeros((*low.shape, len(units)))
        columns = {
            EMBEDDING: (low == 0) & (high > 0),
            LOSS: high == n_items,
            DECODER: decoder,
            "t_moe": moe,
            "t_dense": decoder - moe,
            MTP: np.zeros(low.shape),
        }
        if self._mtp_item is not None:
            holds = (low <= self._mtp_item) & (high > self._mtp_item)
            columns[MTP] = holds * self.mtp_num_layers
        for index, unit in enumerate(units):
            counts[:, :, index] = columns[unit]
        return counts

    def item_counts(self, units: Sequence[str], moe_pattern: Sequence[bool]) -> np.ndarray:
        """(items, U) the units of each item E, t_1..t_N, the MTP block, L: a layout's stage
        counts are sums of consecutive rows."""
        one_per_stage = np.arange(1, len(self._items), dtype=np.int64)[None, :]
        return self.unit_counts(one_per_stage, units, moe_pattern)[0]

    def stages_from_cuts(self, cuts: tuple[int, ...]) -> tuple[str, ...]:
        bounds = (0, *cuts, len(self._items))
        return tuple("".join(self._items[a:b]) for a, b in itertools.pairwise(bounds))

    def layout_string(self, cuts: Sequence[int]) -> str:
        return format_stages(self.stages_from_cuts(tuple(int(c) for c in cuts)))

    def __iter__(self) -> Iterator[Layout]:
        for cuts, _ in self.cut_points():
            yield Layout(self.stages_from_cuts(cuts), self.pp)
