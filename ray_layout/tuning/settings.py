"""Everything a tune needs besides the recipe: how it measures, searches and A/B-tests (its
options, each field a flag of the tune command), where it runs and keeps what it measures, and the
study id a tune's measurements are kept under."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from ray_layout.ab.stats import ABConfig
from ray_layout.measure.log_records import FIT_NEEDS, MIN_PROFILE_ITERATIONS
from ray_layout.measure.observations import STEP_WARMUP
from ray_layout.model.spec import Recipe
from ray_layout.options.checks import (
    MAX_ITERATIONS,
    MAX_SAMPLES,
    at_least,
    between,
    finite,
    positive,
)
from ray_layout.options.flag_fields import check_options, option
from ray_layout.runtime.layout_runs import Backend
from ray_layout.runtime.policy import RunPolicy

RECOMPUTE_MODES = ("job", "auto")  # the choices of --recompute, as its type spells them


def _recompute_mode(value: str) -> str | None:
    """Options built in code are checked as the flag's choices are."""
    return None if value in RECOMPUTE_MODES else f"must be job or auto, got {value!r}"


@dataclass(frozen=True, kw_only=True)
class TuneOptions:
    """How the tune measures, searches and A/B-tests. Each field is a flag of the tune command
    (``TuneFlags`` holds this class as a section), checked when built, so code that builds the
    options directly, as the benchmarks do, tunes as the command does."""

    hbm_gib: float | None = option(  # None: the cluster's GPUs', read by the tune
        None,
        names=["--hbm-gb"],
        help="GPU memory limit in GiB for the search",
        checks=[positive, finite],
    )
    ab_top: int = option(
        3,
        help="how many top layouts to A/B-test with the baselines (0: none)",
        checks=[at_least(0)],
    )
    profile_iters: int = option(
        10,
        checks=[
            at_least(MIN_PROFILE_ITERATIONS, FIT_NEEDS),
            at_least(STEP_WARMUP + 2, f"the step fit drops the first {STEP_WARMUP}"),
            between(1, MAX_ITERATIONS),
        ],
    )
    runs_at_once: int | None = option(
        None,
        help="at most this many runs side by side (default: as many as fit, one on the "
        "megatron-core backend; 1 keeps emulated runs on a small machine from sharing its cores)",
        checks=[at_least(1)],
    )
    ab: ABConfig = field(default_factory=ABConfig)
    policy: RunPolicy = field(default_factory=RunPolicy)  # each profiling and A/B run's
    samples: int = option(256, help="Monte Carlo samples", checks=[between(1, MAX_SAMPLES)])
    seed: int = option(0, checks=[at_least(0)])
    allow_standalone_mtp: bool = option(False)
    recompute: Literal["job", "auto"] = option(
        "job",
        help="the recomputation searched: job (your flags' own; layout x recompute where it fits "
        "no layout) or auto (layout x recompute: the fastest pair that fits)",
        checks=[_recompute_mode],
    )

    def __post_init__(self) -> None:
        check_options(self)


@dataclass(frozen=True)
class TuneSettings:
    """Everything the tune needs besides the recipe: its options, and where it runs and keeps
    what it measures (the tune command derives these from its flags, the model and the
    cluster)."""

    backend: Backend
    store: Path
    study: str
    log_dir: Path | None  # where the ranks' raw logs are also written; None: only the store
    report_dir: Path
    gpus_per_node: int
    options: TuneOptions = field(default_factory=TuneOptions)


def study_id(recipe: Recipe, backend: Backend) -> str:
    """A readable id that changes with anything that changes the measurements: the user's
    precision, recompute, fp8, attention backend, router dtype and overlap flags and the launch
    script's exports included, so a changed flag or NCCL setting is a new study rather than a
    stale resume."""
    text = repr((recipe.model, recipe.parallel, backend.name, backend.hardware))
    if recipe.flags.cost_words:
        text += repr(recipe.flags.cost_words)
    if recipe.environment:
        text += repr(recipe.environment)
    digest = hashlib.sha256(text.encode()).hexdigest()[:8]
    return f"{recipe.model.name}-pp{recipe.parallel.pp}-{digest}"
