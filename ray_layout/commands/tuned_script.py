"""``--write-script OUT`` of ``plan`` and ``tune``: the user's launch script handed back with only
its split changed to the pick (``ray_layout.model.script_rewrite``), checked by reading it back:
the written script's current layout is the pick.  Nothing is written when anything fails."""

from __future__ import annotations

import os
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from ray_layout.commands.common import ModelSettings
from ray_layout.errors import ConfigError, InputError
from ray_layout.model.files import read_log_opening, read_text
from ray_layout.model.layout import Layout
from ray_layout.model.loading import load_recipe
from ray_layout.model.megatron_recipe import sourced_file
from ray_layout.model.run_log import holds_arguments_block
from ray_layout.model.script_rewrite import rewrite_split
from ray_layout.model.split import current_layout
from ray_layout.options.checks import new_file
from ray_layout.options.flag_fields import option
from ray_layout.shell.refusal import ShellError

_FILE_CONFIGS = (".yaml", ".yml", ".json")


def write_script_flag() -> Any:
    return option(
        None,
        help="write a copy of CONFIG (a launch script) with the pick as its split",
        metavar="OUT",
        checks=[new_file()],
    )


def comment_line(
    origin: str, layout: Layout, speedup: float | None, over: str, basis: str = "predicted"
) -> str:
    """The one line the written script gains: where its layout came from and what it buys
    (``basis``: measured in the A/B, or predicted)."""
    gain = f", {basis} {speedup:.2f}x over {over}" if speedup else ""
    return f"ray_layout {origin}: --pipeline-model-parallel-layout {layout}{gain}"


def write_tuned_script(settings: ModelSettings, out: str, layout: Layout, comment: str) -> None:
    """Write ``settings.config`` to ``out`` with ``layout`` as its split; a
    :class:`ConfigError` where CONFIG is no script or the result does not read back as it."""
    source = settings.config
    path = Path(source)
    if not path.is_file() or path.suffix.lower() in _FILE_CONFIGS:
        raise ConfigError(
            f"--write-script needs a launch script or model file as CONFIG, not {source[:80]!r}"
        )
    if holds_arguments_block(read_log_opening(path, source)):
        raise ConfigError(
            f"--write-script needs a launch script or model file as CONFIG, not the run log "
            f"{source[:80]!r}: paste the flag into the script that launched the run"
        )
    text = read_text(path, source)
    try:
        overrides = settings.overrides()
        written = rewrite_split(
            text, source, layout, comment, overrides.environment, overrides.arguments, sourced_file
        )
    except ShellError as exc:
        raise ConfigError(str(exc)) from None
    _check_reads_back(settings, written, layout, out)
    _write(Path(out), written, (path.stat().st_mode & 0o777) | 0o200)


def _check_reads_back(settings: ModelSettings, written: str, layout: Layout, out: str) -> None:
    overrides = settings.overrides(pp=layout.pp)
    sizes = {k: v for k, v in overrides.sizes.items() if k != "vpp"}  # the layout carries its VPP
    with tempfile.TemporaryDirectory() as folder:
        probe = Path(folder) / Path(settings.config).name
        probe.write_text(written)
        try:
            recipe = load_recipe(str(probe), replace(overrides, sizes=sizes))
            m, p = recipe.model, recipe.parallel
            got = current_layout(
                m.num_layers,
                m.mtp_num_layers,
                p.pp,
                p.vpp,
                recipe.split,
                tied_embeddings=m.tied_embeddings,
            )
        except InputError as exc:
            raise ConfigError(
                f"--write-script {out}: the written script does not read back ({exc})"
            ) from None
    if got is None or got.stages != layout.stages:
        raise ConfigError(
            f"--write-script {out}: the written script reads back as {got}, not "
            f"{layout}; nothing written"
        )


def _write(path: Path, text: str, mode: int) -> None:
    """A reader sees the old file or the new one, never half of one; the original's mode."""
    try:
        handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        try:
            with os.fdopen(handle, "w") as stream:
                stream.write(text)
            os.chmod(temporary, mode)
            os.replace(temporary, path)
        except BaseException:
            os.unlink(temporary)
            raise
    except OSError as exc:
        raise ConfigError(f"--write-script {path}: cannot write ({exc.strerror})") from None
