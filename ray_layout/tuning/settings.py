"""Everything a tune needs besides the recipe, as one frozen dataclass the command line fills in,
and the study id a tune's measurements are kept under."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

from launchers.megatron_flags import cost_flags
from ray_layout.ab.stats import ABConfig
from ray_layout.model.spec import Recipe
from ray_layout.runtime.layout_runs import Backend
from ray_layout.runtime.policy import RunPolicy


@dataclass(frozen=True)
class TuneSettings:
    """Everything the tune needs besides the recipe.  The tune command's flags take their
    defaults from these (``tests/runtime/test_policy.py`` holds them to it), so code that builds
    the settings directly, as the benchmarks do, tunes as the command does."""

    backend: Backend
    store: Path
    study: str
    log_dir: Path | None  # where the ranks' raw logs are also written; None: only the store
    report_dir: Path
    gpus_per_node: int
    ab: ABConfig
    ab_top: int = 3
    profile_iters: int = 10
    hbm_gib: float | None = None
    policy: RunPolicy = field(default_factory=RunPolicy)  # each profiling and A/B run's
    samples: int = 256
    seed: int = 0
    allow_standalone_mtp: bool = False
    runs_at_once: int | None = None  # None: as many as the cluster has room for


def study_id(recipe: Recipe, backend: Backend) -> str:
    """A readable id that changes with anything that changes the measurements: the user's
    precision, recompute, fp8, attention backend, router dtype and overlap flags and the launch
    script's exports included, so a changed flag or NCCL setting is a new study rather than a
    stale resume."""
    text = repr((recipe.model, recipe.parallel, backend.name, backend.hardware))
    flags = cost_flags(recipe.megatron_args)
    if flags:
        text += repr(flags)
    if recipe.environment:
        text += repr(recipe.environment)
    digest = hashlib.sha256(text.encode()).hexdigest()[:8]
    return f"{recipe.model.name}-pp{recipe.parallel.pp}-{digest}"
