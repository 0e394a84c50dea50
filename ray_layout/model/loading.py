"""One entry point for every kind of CONFIG: this project's YAML/JSON, a Hugging Face config.json,
a Megatron run log, a Megatron launch script or model file, or a Megatron command line given as
text."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from ray_layout.errors import ConfigError, quoted
from ray_layout.model.dialects import table_of
from ray_layout.model.files import read_log_opening, read_mapping
from ray_layout.model.hf_config import load_hf_config
from ray_layout.model.megatron_args import check_arguments, unknown_flags_note
from ray_layout.model.megatron_recipe import (
    Overrides,
    load_megatron_command_line,
    load_megatron_script,
)
from ray_layout.model.run_log import holds_arguments_block, load_run_log
from ray_layout.model.spec import Recipe, load_recipe_file, with_parallel


def load_recipe(source: str, overrides: Overrides | None = None) -> Recipe:
    """Dispatch on what ``source`` is: a file by its suffix (and, for .json, by its keys; any
    other file holding Megatron's arguments block is a run log), else the text of a Megatron
    command line; ``overrides`` replace the config's sizes (in a launch script, before anything
    is checked).  The user's own Megatron flags (a script's, or
    ``megatron_args:``) are checked against Megatron's flag table here, before any GPU is taken;
    a flag the table does not know is kept, with a note."""
    overrides = overrides or Overrides()
    recipe = _load(source, overrides)
    table = table_of(recipe.dialect)  # a fork's flags parse by its own table
    source_args = f"{source}: megatron_args"
    unknown = check_arguments(recipe.megatron_args, source_args, table, keep_unknown=True)
    if unknown and not any("unknown to Megatron" in note for note in recipe.notes):
        recipe = replace(recipe, notes=(*recipe.notes, unknown_flags_note(unknown, source)))
    return recipe


def _load(source: str, overrides: Overrides) -> Recipe:
    # os.path.exists never raises on a long command line; anything there (a FIFO, a folder, a
    # device too) is a file the reader refuses or reads.
    if os.path.exists(source):
        path = Path(source)
        suffix = path.suffix.lower()
        if suffix in (".yaml", ".yml"):
            return _sized(load_recipe_file(path), overrides)
        if suffix == ".json":
            if not _is_hf_config(read_mapping(path, source)):
                return _sized(load_recipe_file(path), overrides)
            return _sized(load_hf_config(path), overrides)
        opening = read_log_opening(path, source)
        if holds_arguments_block(opening):
            return load_run_log(opening, source, path.stem, overrides)
        return load_megatron_script(path, overrides)
    if "--num-layers" in source:
        return load_megatron_command_line(source, overrides=overrides)
    raise ConfigError(
        f"cannot read CONFIG {quoted(source)}: not a file, nor a Megatron command line (no "
        "--num-layers)"
    )


def _sized(recipe: Recipe, overrides: Overrides) -> Recipe:
    """A YAML/JSON/HF recipe with the user's sizes (a launch script takes them while it is read)."""
    sizes = dict(overrides.sizes)
    model_sizes = {k: sizes.pop(k) for k in ("seq_length", "vocab_size") if k in sizes}
    if model_sizes:
        recipe = replace(recipe, model=replace(recipe.model, **model_sizes))
    return with_parallel(recipe, **sizes) if sizes else recipe


def _is_hf_config(raw: dict[str, object]) -> bool:
    """Hugging Face configs carry ``model_type`` or ``architectures``; this project's never do."""
    return "model_type" in raw or "architectures" in raw
