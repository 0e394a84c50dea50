"""megatron-core's own verdict on a layout string: the oracle of the layout language."""

from __future__ import annotations


def megatron_verdict(layout: str | list[list[str]], pp: int, layers: int, mtp: int):
    """(accepted, mtp_standalone) as megatron-core decides; any exception is a rejection."""
    from megatron.core.transformer.pipeline_parallel_layer_layout import (
        PipelineParallelLayerLayout,
    )

    try:
        parsed = PipelineParallelLayerLayout(layout, pp)
        return True, parsed.validate_layer_layout(layers, mtp or None)
    except Exception:
        return False, None
