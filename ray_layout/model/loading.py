"""One entry point for every kind of CONFIG: this project's YAML/JSON, a Hugging Face config.json,
a Megatron launch script or model file, or a Megatron command line given as text."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

from ray_layout.errors import ConfigError
from ray_layout.model.hf_config import load_hf_config
from ray_layout.model.megatron_args import check_arguments, unknown_flags_note
from ray_layout.model.megatron_recipe import (
    Overrides,
    load_megatron_command_line,
    load_megatron_script,
)
from ray_layout.model.spec import Recipe, load_recipe_file, with_parallel


def load_recipe(source: str, overrides: Overrides | None = None) -> Recipe:
    """Dispatch on what ``source`` is: a file by its suffix (and, for .json, by its keys), else the
    text of a Megatron command line; ``overrides`` replace the config's sizes (in a launch
    script, before anything is checked).  The user's own Megatron flags (a script's, or
    ``megatron_args:``) are checked against Megatron's flag table here, before any GPU is taken;
    a flag the table does not know is kept, with a note."""
    overrides = overrides or Overrides()
    recipe = _load(source, overrides)
    unknown = check_arguments(recipe.megatron_args, f"{source}: megatron_args", keep_unknown=True)
    if unknown and not any("unknown to Megatron" in note for note in recipe.notes):
        recipe = replace(recipe, notes=(*recipe.notes, unknown_flags_note(unknown, source)))
    return recipe


def _load(source: str, overrides: Overrides) -> Recipe:
    if os.path.isfile(source):  # unlike Path.is_file, never raises on a long command line
        path = Path(source)
        suffix = path.suffix.lower()
        if suffix in (".yaml", ".yml"):
            return _sized(load_recipe_file(path), overrides)
        if suffix == ".json":
            if not _is_hf_config(path):
                return _sized(load_recipe_file(path), overrides)
            return _sized(load_hf_config(path), overrides)
        return load_megatron_script(path, overrides)
    if "--num-layers" in source:
        return load_megatron_command_line(source, overrides=overrides)
    raise ConfigError(
        f"cannot read CONFIG {source!r}: not a file, nor a Megatron command line (no --num-layers)"
    )


def _sized(recipe: Recipe, overrides: Overrides) -> Recipe:
    """A YAML/JSON/HF recipe with the user's sizes (a launch script takes them while it is read)."""
    sizes = dict(overrides.sizes)
    model_sizes = {k: sizes.pop(k) for k in ("seq_length", "vocab_size") if k in sizes}
    if model_sizes:
        recipe = replace(recipe, model=replace(recipe.model, **model_sizes))
    return with_parallel(recipe, **sizes) if sizes else recipe


def _is_hf_config(path: Path) -> bool:
    """Hugging Face configs carry ``model_type`` or ``architectures``; this project's never do."""
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError):  # ValueError: bad JSON, or a 5,000-digit int
        return False  # load_recipe_file reports it
    return isinstance(raw, dict) and ("model_type" in raw or "architectures" in raw)
