"""How a config splits the model over pipeline stages: Megatron's split flags, and the layout
they give.

A launch script says how its job is split in one of two ways: a layout string
(``--pipeline-model-parallel-layout``), or Megatron's default split shaped by
``--decoder-first/last-pipeline-num-layers``, ``--account-for-embedding/loss-in-pipeline-split``
and the virtual pipeline size (``--num-layers-per-virtual-pipeline-stage`` or
``--num-virtual-stages-per-pipeline-rank``).  Either way the layout it gives is the user's
*current* layout: the first thing a plan is compared with.
"""

from __future__ import annotations

from dataclasses import dataclass

from ray_layout.errors import LayoutError
from ray_layout.model.baselines import megatron_default
from ray_layout.model.layout import Layout, parse_stages, validate_buildable

# Megatron's split flags, by the PipelineSplit field each sets.
SPLIT_FLAGS = {
    "layout": "--pipeline-model-parallel-layout",
    "first_stage_layers": "--decoder-first-pipeline-num-layers",
    "last_stage_layers": "--decoder-last-pipeline-num-layers",
    "account_for_embedding": "--account-for-embedding-in-pipeline-split",
    "account_for_loss": "--account-for-loss-in-pipeline-split",
    "layers_per_virtual_stage": "--num-layers-per-virtual-pipeline-stage",
    "virtual_stages": "--num-virtual-stages-per-pipeline-rank",
}


@dataclass(frozen=True)
class PipelineSplit:
    """The split flags of a config (None or False: not set)."""

    layout: str | None = None
    first_stage_layers: int | None = None
    last_stage_layers: int | None = None
    account_for_embedding: bool = False
    account_for_loss: bool = False
    layers_per_virtual_stage: int | None = None
    virtual_stages: int | None = None

    @property
    def given(self) -> bool:
        """Whether the config states how its layers are split (a VPP alone does not)."""
        return any(
            (
                self.layout,
                self.first_stage_layers is not None,
                self.last_stage_layers is not None,
                self.account_for_embedding,
                self.account_for_loss,
            )
        )

    @property
    def shapes_default(self) -> dict[str, object]:
        """The keyword arguments that shape Megatron's default split."""
        return {
            "account_for_embedding": self.account_for_embedding,
            "account_for_loss": self.account_for_loss,
            "first_stage_layers": self.first_stage_layers,
            "last_stage_layers": self.last_stage_layers,
        }


def default_layout(
    num_layers: int, mtp_num_layers: int, pp: int, vpp: int, split: PipelineSplit
) -> Layout:
    """Megatron's split without a layout string, shaped by the config's split flags, as
    ``get_num_layers_to_build`` builds it; a :class:`LayoutError` where Megatron would refuse."""
    return megatron_default(num_layers, mtp_num_layers, pp, vpp, **split.shapes_default)


def current_layout(
    num_layers: int,
    mtp_num_layers: int,
    pp: int,
    vpp: int,
    split: PipelineSplit,
    *,
    tied_embeddings: bool,
) -> Layout | None:
    """The layout the config runs today, or None where it states no split.

    Raises :class:`LayoutError` naming Megatron's rule where Megatron would refuse the split, or
    where megatron-core 0.16.1 could not build it.
    """
    if not split.given:
        return None
    if split.layout is None:
        return default_layout(num_layers, mtp_num_layers, pp, vpp, split)
    layout = Layout.parse(split.layout, pp)
    validate_buildable(layout, num_layers, mtp_num_layers, tied_embeddings=tied_embeddings)
    return layout


def check_split(split: PipelineSplit) -> None:
    """Megatron's rules on which split flags go together (``validate_args`` and
    ``TransformerConfig``), each a :class:`LayoutError` naming the flags."""
    virtual = [
        SPLIT_FLAGS[key]
        for key in ("layout", "layers_per_virtual_stage", "virtual_stages")
        if getattr(split, key) is not None
    ]
    if len(virtual) > 1:
        raise LayoutError(f"Megatron accepts at most one of {', '.join(virtual)}")
    shaping = [
        SPLIT_FLAGS[key]
        for key, value in split.shapes_default.items()
        if value not in (None, False)
    ]
    if split.layout is not None and shaping:
        raise LayoutError(
            f"Megatron rejects --pipeline-model-parallel-layout together with {', '.join(shaping)}"
        )
    uneven = split.first_stage_layers is not None or split.last_stage_layers is not None
    if uneven and split.layers_per_virtual_stage is not None:
        raise LayoutError(
            "Megatron needs --num-virtual-stages-per-pipeline-rank, not "
            "--num-layers-per-virtual-pipeline-stage, with --decoder-first/last-pipeline-num-layers"
        )


def virtual_pipeline_size(split: PipelineSplit, num_layers: int, pp: int) -> int | None:
    """The VPP Megatron derives from the split flags (None where they set none): a layout's
    stages over PP, the virtual stages given, or the layers per pipeline stage (the embedding
    and loss counted where the split accounts for them) over the layers per virtual stage."""
    check_split(split)
    if split.layout is not None:
        stages = len(parse_stages(split.layout))
        if stages % pp:
            raise LayoutError(
                f"--pipeline-model-parallel-layout has {stages} stages, not divisible by PP={pp}"
            )
        return stages // pp
    if split.virtual_stages is not None:
        return split.virtual_stages
    if split.layers_per_virtual_stage is None:
        return None
    layers = num_layers + split.account_for_embedding + split.account_for_loss
    if layers % pp or (layers // pp) % split.layers_per_virtual_stage:
        raise LayoutError(
            f"--num-layers-per-virtual-pipeline-stage {split.layers_per_virtual_stage} does not "
            f"evenly split {layers} layers over {pp} pipeline stages"
        )
    return layers // pp // split.layers_per_virtual_stage
