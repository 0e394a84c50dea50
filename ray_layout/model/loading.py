"""One entry point for every kind of CONFIG: this project's YAML/JSON, a Hugging Face config.json,
a Megatron launch script, or a Megatron command line given as text."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

from ray_layout.errors import ConfigError
from ray_layout.model.hf_config import load_hf_config
from ray_layout.model.megatron_args import (
    check_arguments,
    load_megatron_command_line,
    load_megatron_script,
)
from ray_layout.model.spec import Recipe, load_recipe_file, megatron_args_of, read_mapping


def load_recipe(source: str) -> Recipe:
    """Dispatch on what ``source`` is: a file by its suffix (and, for .json, by its keys), else the
    text of a Megatron command line.  The user's own Megatron flags (a script's, or
    ``megatron_args:``) are checked against Megatron's flag table here, before any GPU is taken."""
    recipe = _load(source)
    check_arguments(recipe.megatron_args, f"{source}: megatron_args")
    return recipe


def _load(source: str) -> Recipe:
    if os.path.isfile(source):  # unlike Path.is_file, never raises on a long command line
        path = Path(source)
        suffix = path.suffix.lower()
        if suffix in (".yaml", ".yml"):
            return load_recipe_file(path)
        if suffix == ".json":
            if not _is_hf_config(path):
                return load_recipe_file(path)
            flags = megatron_args_of(read_mapping(path, source).get("megatron_args"), source)
            return replace(load_hf_config(path), megatron_args=flags)
        return load_megatron_script(path)
    if "--num-layers" in source:
        return load_megatron_command_line(source)
    raise ConfigError(
        f"cannot read CONFIG {source!r}: not a file, nor a Megatron command line (no --num-layers)"
    )


def _is_hf_config(path: Path) -> bool:
    """Hugging Face configs carry ``model_type`` or ``architectures``; this project's never do."""
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError):  # ValueError: bad JSON, or a 5,000-digit int
        return False  # load_recipe_file reports it
    return isinstance(raw, dict) and ("model_type" in raw or "architectures" in raw)
