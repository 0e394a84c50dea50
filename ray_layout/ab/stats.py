"""Early stopping for a live A/B test between a few pipeline layouts ("arms").

The planner ranks layouts with a simulator; the last word belongs to the cluster.  A handful of
arms (the planner's best candidates, the config's current layout, Megatron's default split, the
count-based rule) train side by side, and every few iterations we ask: is some arm already
clearly worse than the best, so that its GPUs can be freed?  This module is the statistics of
that question, kept pure (numpy and scipy over frozen dataclasses) so that a recorded test
replays bit for bit on a CPU.

Why not Ray Tune's ASHA or median stopping: they compare one scalar per rung, with no notion of
its variance, and need many trials to be sound (ASHA never stops the first trial at a rung, the
median rule needs at least three).  With 2-5 arms and step times that differ by a few percent,
a noisy iteration decides.  So instead:

- **Warm-up dropped**: the first ``warmup_iterations`` of every arm (compilation, allocator, NCCL
  set-up) say nothing about the steady step.
- **Batch means**: consecutive step times are autocorrelated (a slow node stays slow for a while),
  so a t interval on single steps is far too narrow.  Averaging non-overlapping batches of
  ``batch_size`` steps gives nearly independent, nearly normal values; the tests run on those.
- **Looks on a doubling schedule**: decisions happen only after ``looks[k]`` batches (3, 6, 12
  and 24 by default, the successive-halving spacing), never at every step; the last look is the
  budget, long for precision among close arms, affordable since clear losers stop early.
- **Alpha split across looks (Bonferroni)**: each look tests at ``alpha / len(looks)``, so the
  chance of ever stopping an arm that is not worse stays below ``alpha`` however often we look.
- **Margin**: an arm stops only when a one-sided Welch test says its mean is more than
  ``(1 + margin)`` times the best arm's.  Layouts within a percent or two are not worth telling
  apart (the margin also absorbs most of the bias of comparing against the best of several).
- **Immediate stops**: OOM, NaN, a hang or a crash stop an arm at once, and so does a median step
  over ``blowup`` times the best arm's median: no test is needed for a 3x slowdown.
- **Ties settled by the tie-break, not by more steps**: arms within the margin are practically
  equivalent, and the search's own tie-break picks among them: fewer critical stages (ranks
  near the bottleneck's load: less exposed to a slow node), then the most HBM headroom (room for
  a longer sequence, a larger micro-batch or less recomputation, less likely to OOM on a bad
  batch), then the lower mean.  At the budget, arms within the margin of the fastest are tied;
  at a look, an arm shown tied with the best by two one-sided tests (TOST) at the look's level
  settles the pair at once: whichever of the two loses the tie-break stops, since more steps
  could not change the verdict.  Bonferroni over the looks keeps the chance of settling a pair
  that is not tied under ``alpha``.
- **Earlier first looks for predicted losers** (:mod:`ray_layout.ab.looks`): an arm the
  simulator predicts to lose by far more than the margin gets its first look after fewer
  batches.  Each arm keeps as many looks at ``alpha / len(looks)``, fixed before any step is
  seen, so a wrong prediction costs power, never the guarantee.

The looks and the verdicts built on these tests are :mod:`ray_layout.ab.decisions`; the live
shell (Ray actors, heartbeats, logs) is :mod:`ray_layout.ab.live`.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np
from scipy import special

from ray_layout.errors import ConfigError
from ray_layout.options.checks import MAX_ITERATIONS, between, comma_integers, each
from ray_layout.options.flag_fields import check_options, option
from ray_layout.runtime.failures import FailureClass

# A failed arm's stop reason by its run's failure class (NAN: the live shell's own).
FAILURE_REASONS: dict[FailureClass, str] = {
    FailureClass.OOM: "out of memory",
    FailureClass.NAN: "NaN loss or step time",
    FailureClass.HANG: "hang: no iteration within the heartbeat",
    FailureClass.TIMEOUT: "timeout: the run passed its time limit",
    FailureClass.CRASH: "crash: a rank exited with an error",
    FailureClass.COMM: "communication failure: NCCL/gloo timeout or lost connection",
    FailureClass.NODE_LOST: "node lost: a rank's actor died",
    FailureClass.KILLED: "killed by a signal (host OOM killer or preemption)",
    FailureClass.INVALID_CONFIG: "invalid configuration",
    FailureClass.INFEASIBLE_PLACEMENT: "the cluster could not place the run",
}


def is_whole_number(value: object) -> bool:
    """An int (numpy's too), not a bool."""
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


AB_TEST = "A/B test"  # the help's section of the A/B test's flags


@dataclass(frozen=True)
class ABConfig:
    """How an A/B test looks at its arms and when it stops one; the tune command's ``--ab-*``
    flags are its fields."""

    warmup_iterations: int = option(  # dropped from the start of every arm's trace
        3, names=["--ab-warmup"], group=AB_TEST, checks=[between(0, MAX_ITERATIONS)]
    )
    batch_size: int = option(
        5,
        names=["--ab-batch"],
        help="iterations per batch mean",
        group=AB_TEST,
        checks=[between(1, MAX_ITERATIONS)],
    )
    looks: tuple[int, ...] = option(
        (3, 6, 12, 24),
        names=["--ab-looks"],
        help="batches at each look, e.g. 3,6,12,24 (the last is the budget)",
        group=AB_TEST,
        parse=comma_integers("3,6,12,24"),
        checks=[each(between(1, MAX_ITERATIONS))],
    )
    alpha: float = option(  # family-wise rate of stopping an arm that is not worse
        0.05, names=["--ab-alpha"], group=AB_TEST
    )
    margin: float = option(  # stop only when more than (1 + margin) x the best's mean
        0.02, names=["--ab-margin"], group=AB_TEST
    )
    blowup: float = 3.0  # stop at once when the median step is over blowup x the best's median

    def __post_init__(self) -> None:
        if not is_whole_number(self.warmup_iterations):
            raise ConfigError(
                f"warmup_iterations must be an integer, got {self.warmup_iterations!r}"
            )
        if not is_whole_number(self.batch_size):
            raise ConfigError(f"batch_size must be an integer, got {self.batch_size!r}")
        try:
            looks = tuple(self.looks)
        except TypeError:
            raise ConfigError(f"looks must be a sequence of integers, got {self.looks!r}") from None
        if not looks or not all(is_whole_number(k) for k in looks):
            raise ConfigError(f"looks must be a non-empty sequence of integers, got {self.looks!r}")
        object.__setattr__(self, "looks", tuple(int(k) for k in looks))
        check_options(self)  # the flags' bounds, named as the command line spells them
        if looks[0] < 2:
            raise ConfigError(f"every look needs at least 2 batches for a variance, got {looks!r}")
        if any(b <= a for a, b in itertools.pairwise(looks)):
            raise ConfigError(f"looks must be strictly increasing, got {looks!r}")
        if not (isinstance(self.alpha, int | float) and 0.0 < self.alpha < 1.0):
            raise ConfigError(f"alpha must lie strictly between 0 and 1, got {self.alpha!r}")
        if not (isinstance(self.margin, int | float) and 0.0 <= self.margin < math.inf):
            raise ConfigError(f"margin must be a finite number >= 0, got {self.margin!r}")
        if not (isinstance(self.blowup, int | float) and 1.0 < self.blowup < math.inf):
            raise ConfigError(f"blowup must be a finite number > 1, got {self.blowup!r}")
        if self.max_iterations > MAX_ITERATIONS:
            raise ConfigError(
                f"--ab-warmup {self.warmup_iterations} + --ab-batch {self.batch_size} x "
                f"{self.looks[-1]} batches (--ab-looks) = {self.max_iterations:,} iterations per "
                f"arm, more than {MAX_ITERATIONS:,}"
            )

    @property
    def max_iterations(self) -> int:
        """What one arm trains at most, warm-up included: the budget of a run."""
        return self.warmup_iterations + self.batch_size * self.looks[-1]

    def look_iterations(self, look: int) -> int:
        """Steady iterations every arm has at look ``look`` (0-based)."""
        if not is_whole_number(look) or not 0 <= look < len(self.looks):
            raise ConfigError(f"look must be in 0..{len(self.looks) - 1}, got {look!r}")
        return self.batch_size * self.looks[look]

    @property
    def alpha_per_look(self) -> float:
        """Bonferroni: each look spends an equal share of alpha."""
        return self.alpha / len(self.looks)


@dataclass(frozen=True)
class ArmTrace:
    """What one arm has run so far (or ran, when replayed)."""

    arm: str  # unique label, e.g. "candidate-1", "current", "default", "count-based"
    layout: str  # the layout string
    steps_ms: tuple[float, ...]  # per-iteration step time, warm-up included (may hold nan/inf)
    failure: str | None = None  # a FailureClass, or a run's status; None: fine so far
    headroom_gib: float | None = None  # HBM limit minus the largest max-allocated over its ranks
    critical_stages: int | None = None  # predicted ranks near the bottleneck's load; None: unknown


@dataclass(frozen=True)
class ArmStats:
    """Summary of one arm's steady steps (whole batches only when there is one)."""

    n: int  # steady iterations used
    batches: int
    mean_ms: float
    median_ms: float
    ci_low_ms: float  # two-sided (1 - alpha) t interval on batch means; nan when batches < 2
    ci_high_ms: float


# --- statistics on one arm ---------------------------------------------------------------------


def steady_steps(trace: ArmTrace, config: ABConfig) -> np.ndarray:
    """The trace without its warm-up iterations, as floats."""
    return np.asarray(trace.steps_ms[config.warmup_iterations :], dtype=float)


def batch_means(values: np.ndarray, batch_size: int) -> np.ndarray:
    """Means of consecutive non-overlapping batches; an incomplete last batch is dropped."""
    if not is_whole_number(batch_size) or batch_size < 1:
        raise ConfigError(f"batch_size must be a positive integer, got {batch_size!r}")
    values = np.asarray(values, dtype=float)
    count = values.size // batch_size
    return values[: count * batch_size].reshape(count, batch_size).mean(axis=1)


def arm_stats(values: np.ndarray, config: ABConfig) -> ArmStats:
    """Mean, median and a batch-means t interval.  With at least one whole batch only whole
    batches are used, so the mean is the mean of the batch means the interval is built on."""
    values = np.asarray(values, dtype=float)
    means = batch_means(values, config.batch_size)
    used = values[: means.size * config.batch_size] if means.size else values
    mean = float(used.mean()) if used.size else math.nan
    median = float(np.median(used)) if used.size else math.nan
    low = high = math.nan
    if means.size >= 2:
        quantile = special.stdtrit(means.size - 1, 1.0 - config.alpha / 2.0)
        half = float(quantile * means.std(ddof=1) / math.sqrt(means.size))
        low, high = mean - half, mean + half
    return ArmStats(used.size, int(means.size), mean, median, low, high)


def _greater_than_scaled(
    arm_values: np.ndarray, best_values: np.ndarray, scale: float, batch_size: int
) -> tuple[float, float]:
    """One-sided Welch test on batch means of H0: mean_arm <= scale x mean_best against
    H1: mean_arm > scale x mean_best: (t, p), (nan, nan) without 2 whole finite batches each."""
    arm = batch_means(arm_values, batch_size)
    best = batch_means(best_values, batch_size)
    if arm.size < 2 or best.size < 2 or not (np.isfinite(arm).all() and np.isfinite(best).all()):
        return math.nan, math.nan
    # A constant side keeps its exact value: np.mean may be an ulp off and fake a difference.
    arm_varies, best_varies = bool(np.ptp(arm) > 0), bool(np.ptp(best) > 0)
    arm_mean = float(arm.mean()) if arm_varies else float(arm[0])
    best_mean = float(best.mean()) if best_varies else float(best[0])
    diff = arm_mean - scale * best_mean
    var_arm = float(arm.var(ddof=1)) / arm.size if arm_varies else 0.0
    var_best = scale**2 * float(best.var(ddof=1)) / best.size if best_varies else 0.0
    se2 = var_arm + var_best
    if se2 == 0.0:
        if diff > 0:
            return math.inf, 0.0
        return (-math.inf, 1.0) if diff < 0 else (0.0, 0.5)
    # Welch-Satterthwaite degrees of freedom (a constant side contributes none).
    denominator = var_arm**2 / (arm.size - 1) + var_best**2 / (best.size - 1)
    dof = se2**2 / denominator if denominator > 0 else float(arm.size + best.size - 2)
    statistic = diff / math.sqrt(se2)
    return float(statistic), float(special.stdtr(dof, -statistic))  # Student t survival


def worse_by_margin(
    arm_values: np.ndarray, best_values: np.ndarray, config: ABConfig
) -> tuple[float, float]:
    """One-sided Welch test on batch means of H0: mean_arm <= (1 + margin) mean_best against
    H1: mean_arm > (1 + margin) mean_best.  Returns (t, p); (nan, nan) without 2 whole batches
    on each side or with non-finite steps.  Deterministic data (no variance on either side)
    gives t = +inf, -inf or 0 and p = 0, 1 or 0.5: the sign of the difference decides."""
    return _greater_than_scaled(arm_values, best_values, 1.0 + config.margin, config.batch_size)


def tied_within_margin(
    arm_values: np.ndarray, best_values: np.ndarray, config: ABConfig
) -> tuple[float, float]:
    """Two one-sided tests (TOST) of equivalence: H1 is (1 - margin) mean_best < mean_arm <
    (1 + margin) mean_best.  Returns (the t nearer to its bound, p = the larger one-sided p);
    (nan, nan) as :func:`worse_by_margin`."""
    t_low, p_low = _greater_than_scaled(
        arm_values, best_values, 1.0 - config.margin, config.batch_size
    )
    t_high, p_above = _greater_than_scaled(
        arm_values, best_values, 1.0 + config.margin, config.batch_size
    )
    if math.isnan(p_low) or math.isnan(p_above):
        return math.nan, math.nan
    p_high = 1.0 - p_above  # H1: mean_arm < (1 + margin) mean_best
    return (t_low, p_low) if p_low >= p_high else (-t_high, p_high)


def blowup_reason(values: np.ndarray, best_median_ms: float, config: ABConfig) -> str | None:
    """Why an arm stops at once for being grossly slow, or None.  Needs a batch of steps: one
    slow iteration (a checkpoint, a straggler) is not a blow-up."""
    values = np.asarray(values, dtype=float)
    if values.size < config.batch_size or not (0.0 < best_median_ms < math.inf):
        return None
    median = float(np.median(values))
    if not median > config.blowup * best_median_ms:  # a nan median is a failure, not a blow-up
        return None
    return (
        f"blow-up: median step {median:.1f} ms is {median / best_median_ms:.1f}x the best "
        f"arm's {best_median_ms:.1f} ms (limit {config.blowup:g}x)"
    )


def failure_reason(trace: ArmTrace, config: ABConfig | None = None) -> str | None:
    """Why an arm stops at once: its recorded failure, or a nan/inf steady step ("nan").
    ``config`` gives the warm-up to skip (the default ABConfig's when None)."""
    if trace.failure is not None:
        code = trace.failure.strip()
        return FAILURE_REASONS.get(code.lower(), code or "failed")
    steps = steady_steps(trace, config or ABConfig())
    bad = np.flatnonzero(~np.isfinite(steps))
    if bad.size:
        return (
            f"{FAILURE_REASONS[FailureClass.NAN]}: steady iteration {bad[0] + 1} took "
            f"{steps[bad[0]]} ms"
        )
    return None
