"""The layout ``size`` and ``simulate`` show when none is given: the one the config runs today."""

from __future__ import annotations

from ray_layout.errors import LayoutError
from ray_layout.model.baselines import BaselineName, count_based
from ray_layout.model.layout import Layout
from ray_layout.model.spec import Recipe
from ray_layout.model.split import default_layout
from search.planner import current_of

CURRENT_SOURCE = "current (the config's split)"
NOTE = "; "  # a source, then why an earlier choice was passed over: "Megatron default; ..."


def config_layout(recipe: Recipe, count_fallback: bool = False) -> tuple[Layout, str]:
    """The layout the config's split gives, else Megatron's default shaped by its split flags,
    else (``count_fallback``) the count-based rule, all at the run's PP; with where it came from
    and, after ``NOTE``, why an earlier one was passed over (a split another PP cannot run).
    A :class:`LayoutError` where none is left."""
    model, parallel = recipe.model, recipe.parallel
    shape = (model.num_layers, model.mtp_num_layers, parallel.pp)
    notes = []
    try:
        current = current_of(model, parallel, recipe.split)
    except LayoutError as exc:
        current, notes = None, [f"the config's split does not apply: {exc}"]
    if current is not None:
        return current, CURRENT_SOURCE
    try:
        layout, source = default_layout(*shape, parallel.vpp, recipe.split), BaselineName.DEFAULT
    except LayoutError as exc:
        if not count_fallback:
            raise
        layout, source = count_based(*shape, parallel.vpp), BaselineName.COUNT_BASED
        if not any(str(exc) in note for note in notes):  # the split's own reason, said once
            notes.append(str(exc))
    return layout, NOTE.join([source.value, *notes])
