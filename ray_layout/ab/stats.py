"""Early stopping for a live A/B test between a few pipeline layouts ("arms").

The planner ranks layouts with a simulator; the last word belongs to the cluster.  A handful of
arms (the planner's best candidates, Megatron's default split, the count-based rule) train side
by side, and every few iterations we ask: is some arm already clearly worse than the best, so
that its GPUs can be freed?  This module is the statistics of that question, kept pure (numpy and
scipy over frozen dataclasses) so that a recorded test replays bit for bit on a CPU.

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
- **Ties broken by memory headroom**: at the budget, arms within the margin of the fastest are
  tied, and the one with the most HBM headroom wins: it leaves room for a longer sequence, a
  larger micro-batch or less recomputation, and is less likely to OOM on a bad batch.  An arm
  shown tied with the best at a look (two one-sided tests at the look's level) that has less
  headroom than the best stops there: the tie-break could not go its way.

Every decision carries its statistic, p-value and a readable reason, and :func:`decision_rows`
turns decisions into rows of the cost store's ``decisions`` table; :func:`replay` re-judges
recorded traces offline.  The live shell (Ray actors, heartbeats, logs) lives elsewhere.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
from scipy import special

from ray_layout.errors import ConfigError

CONTINUE, STOP, WIN, LOSE = "continue", "stop", "win", "lose"
TERMINAL = frozenset({STOP, WIN, LOSE})  # actions after which an arm gets no more decisions

# Failure classes of ray_layout.runtime.cluster (and "nan" from the live shell), as reasons.
FAILURE_REASONS = {
    "oom": "out of memory",
    "nan": "NaN loss or step time",
    "hang": "hang: no iteration within the heartbeat",
    "timeout": "timeout: the run passed its time limit",
    "crash": "crash: a rank exited with an error",
    "comm": "communication failure: NCCL/gloo timeout or lost connection",
    "node-lost": "node lost: a rank's actor died",
    "killed": "killed by a signal (host OOM killer or preemption)",
    "invalid-config": "invalid configuration",
    "infeasible-placement": "the cluster could not place the run",
}


def _is_int(value: object) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


@dataclass(frozen=True)
class ABConfig:
    """How an A/B test looks at its arms and when it stops one."""

    warmup_iterations: int = 3  # dropped from the start of every arm's trace
    batch_size: int = 5  # iterations per batch mean
    looks: tuple[int, ...] = (3, 6, 12, 24)  # batches at each look; the last is the budget
    alpha: float = 0.05  # family-wise rate of stopping an arm that is not worse
    margin: float = 0.02  # stop only when more than (1 + margin) x the best's mean
    blowup: float = 3.0  # stop at once when the median step is over blowup x the best's median

    def __post_init__(self) -> None:
        if not _is_int(self.warmup_iterations) or self.warmup_iterations < 0:
            raise ConfigError(f"warmup_iterations must be an integer >= 0, got "
                              f"{self.warmup_iterations!r}")  # fmt: skip
        if not _is_int(self.batch_size) or self.batch_size < 1:
            raise ConfigError(f"batch_size must be a positive integer, got {self.batch_size!r}")
        try:
            looks = tuple(self.looks)
        except TypeError:
            raise ConfigError(f"looks must be a sequence of integers, got {self.looks!r}") from None
        if not looks or not all(_is_int(k) for k in looks):
            raise ConfigError(f"looks must be a non-empty sequence of integers, got {self.looks!r}")
        if looks[0] < 2:
            raise ConfigError(f"every look needs at least 2 batches for a variance, got {looks!r}")
        if any(b <= a for a, b in itertools.pairwise(looks)):
            raise ConfigError(f"looks must be strictly increasing, got {looks!r}")
        object.__setattr__(self, "looks", tuple(int(k) for k in looks))
        if not (isinstance(self.alpha, int | float) and 0.0 < self.alpha < 1.0):
            raise ConfigError(f"alpha must lie strictly between 0 and 1, got {self.alpha!r}")
        if not (isinstance(self.margin, int | float) and 0.0 <= self.margin < math.inf):
            raise ConfigError(f"margin must be a finite number >= 0, got {self.margin!r}")
        if not (isinstance(self.blowup, int | float) and 1.0 < self.blowup < math.inf):
            raise ConfigError(f"blowup must be a finite number > 1, got {self.blowup!r}")

    @property
    def max_iterations(self) -> int:
        """What one arm trains at most, warm-up included: the budget of a run."""
        return self.warmup_iterations + self.batch_size * self.looks[-1]

    def look_iterations(self, look: int) -> int:
        """Steady iterations every arm has at look ``look`` (0-based)."""
        if not _is_int(look) or not 0 <= look < len(self.looks):
            raise ConfigError(f"look must be in 0..{len(self.looks) - 1}, got {look!r}")
        return self.batch_size * self.looks[look]

    @property
    def alpha_per_look(self) -> float:
        """Bonferroni: each look spends an equal share of alpha."""
        return self.alpha / len(self.looks)


@dataclass(frozen=True)
class ArmTrace:
    """What one arm has run so far (or ran, when replayed)."""

    arm: str  # unique label, e.g. "candidate-1", "default", "count-based"
    layout: str  # the layout string
    steps_ms: tuple[float, ...]  # per-iteration step time, warm-up included (may hold nan/inf)
    failure: str | None = None  # "oom", "nan", "hang", "timeout", "crash", ...; None: fine so far
    headroom_gib: float | None = None  # HBM limit minus the largest max-allocated over its ranks


@dataclass(frozen=True)
class ArmStats:
    """Summary of one arm's steady steps (whole batches only when there is one)."""

    n: int  # steady iterations used
    batches: int
    mean_ms: float
    median_ms: float
    ci_low_ms: float  # two-sided (1 - alpha) t interval on batch means; nan when batches < 2
    ci_high_ms: float


@dataclass(frozen=True)
class Decision:
    """One verdict on one arm at one look, with the evidence to replay and audit it."""

    arm: str
    layout: str
    look: int  # 0-based look index; len(config.looks) for the final decision
    action: str  # "continue", "stop", "win", "lose"
    reason: str  # one readable line
    statistic: float  # Welch t of (arm - (1 + margin) x reference); nan when no test was made
    p_value: float  # nan when no test
    reference: str | None  # the arm it was compared with; None for the best / failures
    n_steady: int
    mean_ms: float  # the arm's mean over the steady iterations the decision used (nan if none)


# --- statistics on one arm ---------------------------------------------------------------------


def steady_steps(trace: ArmTrace, config: ABConfig) -> np.ndarray:
    """The trace without its warm-up iterations, as floats."""
    return np.asarray(trace.steps_ms[config.warmup_iterations :], dtype=float)


def batch_means(values: np.ndarray, batch_size: int) -> np.ndarray:
    """Means of consecutive non-overlapping batches; an incomplete last batch is dropped."""
    if not _is_int(batch_size) or batch_size < 1:
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
    t_low, p_low = _greater_than_scaled(arm_values, best_values, 1.0 - config.margin,
                                        config.batch_size)  # fmt: skip
    t_high, p_above = _greater_than_scaled(arm_values, best_values, 1.0 + config.margin,
                                           config.batch_size)  # fmt: skip
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
    return (f"blow-up: median step {median:.1f} ms is {median / best_median_ms:.1f}x the best "
            f"arm's {best_median_ms:.1f} ms (limit {config.blowup:g}x)")  # fmt: skip


def failure_reason(trace: ArmTrace, config: ABConfig | None = None) -> str | None:
    """Why an arm stops at once: its recorded failure, or a nan/inf steady step ("nan").
    ``config`` gives the warm-up to skip (the default ABConfig's when None)."""
    if trace.failure is not None:
        code = trace.failure.strip()
        return FAILURE_REASONS.get(code.lower(), code or "failed")
    steps = steady_steps(trace, config or ABConfig())
    bad = np.flatnonzero(~np.isfinite(steps))
    if bad.size:
        return (f"{FAILURE_REASONS['nan']}: steady iteration {bad[0] + 1} took "
                f"{steps[bad[0]]} ms")  # fmt: skip
    return None


# --- decisions over arms -----------------------------------------------------------------------


def _name(trace: ArmTrace) -> str:
    return trace.layout if trace.arm == trace.layout else f"{trace.layout} [{trace.arm}]"


def _check_arms(traces: Sequence[ArmTrace]) -> None:
    arms = [trace.arm for trace in traces]
    duplicates = sorted({arm for arm in arms if arms.count(arm) > 1})
    if duplicates:
        raise ConfigError(f"arm labels must be unique, repeated: {', '.join(duplicates)}")


def _finite_mean(values: np.ndarray) -> float:
    finite = values[np.isfinite(values)]
    return float(finite.mean()) if finite.size else math.nan


def _failure_decision(trace: ArmTrace, look: int, reason: str, config: ABConfig) -> Decision:
    steps = steady_steps(trace, config)
    return Decision(trace.arm, trace.layout, look, STOP, reason, math.nan, math.nan, None,
                    int(steps.size), _finite_mean(steps))  # fmt: skip


def _margin(config: ABConfig) -> str:
    return f"{config.margin * 100:g}%"


def _gib(trace: ArmTrace) -> str:
    value = trace.headroom_gib
    return "unknown" if value is None or math.isnan(value) else f"{value:.1f} GiB"


def _percent(ratio: float) -> str:
    return f"{abs(ratio - 1.0) * 100:.1f}% {'slower' if ratio >= 1.0 else 'faster'}"


def _failures_stop(
    traces: Sequence[ArmTrace], look: int, config: ABConfig, stopped: Collection[str]
) -> tuple[dict[str, Decision], list[tuple[ArmTrace, np.ndarray]]]:
    """Of the arms not yet stopped: a stop for each that failed, and the others' steady steps."""
    _check_arms(traces)
    decided: dict[str, Decision] = {}
    running: list[tuple[ArmTrace, np.ndarray]] = []
    for trace in traces:
        if trace.arm in stopped:
            continue
        reason = failure_reason(trace, config)
        if reason is None:
            running.append((trace, steady_steps(trace, config)))
        else:
            decided[trace.arm] = _failure_decision(trace, look, reason, config)
    return decided, running


def decide_look(
    traces: Sequence[ArmTrace], look: int, config: ABConfig, stopped: Collection[str] = ()
) -> list[Decision]:
    """Decisions at interim look ``look``, in the order of ``traces``.

    Judged: every arm not in ``stopped`` with at least ``look_iterations(look)`` steady steps,
    truncated to exactly that many (so neither how far an arm ran past the look nor wall-clock
    timing changes the outcome), and every not-stopped arm with a failure, which stops.  The
    arm with the lowest mean continues; each other stops on a blow-up or when it is worse than
    the best by more than the margin at level ``alpha_per_look``, or when it is tied with the best
    within the margin at that level (two one-sided tests) with less memory headroom, since the
    final tie-break could only give the best the win; it continues otherwise.
    """
    needed = config.look_iterations(look)
    decided, running = _failures_stop(traces, look, config, stopped)
    healthy = [(trace, values[:needed]) for trace, values in running if values.size >= needed]

    if len(healthy) < 2:
        for trace, values in healthy:
            decided[trace.arm] = Decision(
                trace.arm, trace.layout, look, CONTINUE,
                f"nothing to compare with at look {look}: the only arm with {needed} steps",
                math.nan, math.nan, None, needed, float(values.mean()),
            )  # fmt: skip
    else:
        best, best_values = min(healthy, key=lambda item: float(item[1].mean()))
        best_mean, best_median = float(best_values.mean()), float(np.median(best_values))
        for trace, values in healthy:
            mean = float(values.mean())
            if trace is best:
                decided[trace.arm] = Decision(
                    trace.arm, trace.layout, look, CONTINUE,
                    f"best at look {look}: mean {mean:.1f} ms over {needed} steady iterations",
                    math.nan, math.nan, None, needed, mean,
                )  # fmt: skip
                continue
            statistic, p_value = worse_by_margin(values, best_values, config)
            blowup = blowup_reason(values, best_median, config)
            versus = f"{_percent(mean / best_mean)} than {_name(best)}"
            if blowup is not None:
                action, reason = STOP, blowup
            elif p_value < config.alpha_per_look:
                action = STOP
                reason = f"{versus} (p={p_value:.2g} < {config.alpha_per_look:.3g})"
            elif (tie := _cannot_win_tie(trace, values, best, best_values, config)) is not None:
                action, reason = STOP, tie[0]
                statistic, p_value = tie[1], tie[2]
            else:
                action = CONTINUE
                reason = (f"{versus}, not beyond the {_margin(config)} margin yet "
                          f"(p={p_value:.2g} >= {config.alpha_per_look:.3g})")  # fmt: skip
            decided[trace.arm] = Decision(trace.arm, trace.layout, look, action, reason,
                                          statistic, p_value, best.arm, needed, mean)  # fmt: skip
    return [decided[trace.arm] for trace in traces if trace.arm in decided]


def _known(headroom: float | None) -> bool:
    return headroom is not None and math.isfinite(headroom)


def _cannot_win_tie(
    trace: ArmTrace, values: np.ndarray, best: ArmTrace, best_values: np.ndarray,
    config: ABConfig,
) -> tuple[str, float, float] | None:  # fmt: skip
    """(reason, t, p) when the arm is tied with the best within the margin, with confidence, and
    has less memory headroom: the final tie-break would give the best the win, so running on
    cannot change the outcome."""
    if not (_known(trace.headroom_gib) and _known(best.headroom_gib)):
        return None
    if trace.headroom_gib >= best.headroom_gib:
        return None
    statistic, p_value = tied_within_margin(values, best_values, config)
    if not p_value < config.alpha_per_look:
        return None
    ratio = float(values.mean()) / float(best_values.mean())
    reason = (f"tied with {_name(best)} within {_margin(config)} ({_percent(ratio)}, "
              f"p={p_value:.2g} < {config.alpha_per_look:.3g}) with less memory headroom "
              f"({_gib(trace)} vs {_gib(best)}): it cannot win the tie-break")  # fmt: skip
    return reason, statistic, p_value


def final_decisions(
    traces: Sequence[ArmTrace], config: ABConfig, stopped: Collection[str] = ()
) -> list[Decision]:
    """The verdict at the budget (look index ``len(config.looks)``), in the order of ``traces``.

    Qualified: not-stopped healthy arms with at least 2 whole batches, each using all its steady
    steps up to the budget.  Arms within ``(1 + margin)`` of the fastest mean are tied, and the
    tied arm with the most memory headroom wins (unknown headroom counts lowest; equal headroom
    goes to the lower mean); every other qualified arm loses.  A not-stopped arm with a failure
    gets "stop".  Empty when no arm qualifies and none failed.
    """
    look = len(config.looks)
    budget = config.look_iterations(look - 1)
    decided, running = _failures_stop(traces, look, config, stopped)
    qualified: list[tuple[ArmTrace, ArmStats, np.ndarray]] = []
    for trace, values in running:
        summary = arm_stats(values[:budget], config)
        if summary.batches >= 2:
            qualified.append((trace, summary, values[: summary.n]))
    if not qualified:
        return [decided[trace.arm] for trace in traces if trace.arm in decided]

    fastest = min(qualified, key=lambda item: item[1].mean_ms)
    limit = (1.0 + config.margin) * fastest[1].mean_ms
    tied = [item for item in qualified if item[1].mean_ms <= limit]

    def headroom(item: tuple[ArmTrace, ArmStats, np.ndarray]) -> float:
        value = item[0].headroom_gib
        return -math.inf if value is None or math.isnan(value) else float(value)

    # max() keeps the first of equals, so sorting by mean first makes the tie-break total.
    win = max(sorted(tied, key=lambda item: item[1].mean_ms), key=headroom)
    win_trace, win_stats, win_values = win
    others = [item for item in tied if item is not win]
    if not others:
        runner_up = min((item for item in qualified if item is not win),
                        key=lambda item: item[1].mean_ms, default=None)  # fmt: skip
        reason = f"won on time: mean {win_stats.mean_ms:.1f} ms"
        if runner_up is not None:
            ratio = runner_up[1].mean_ms / win_stats.mean_ms
            reason += f", next {_name(runner_up[0])} is {_percent(ratio)}"
    elif all(headroom(item) < headroom(win) for item in others):
        versus = _percent(win_stats.mean_ms / fastest[1].mean_ms)
        reason = (f"won on memory headroom among {len(tied)} tied within {_margin(config)}: "
                  f"{win_trace.headroom_gib:.1f} GiB free, mean {win_stats.mean_ms:.1f} ms "
                  f"({versus} than the fastest)")  # fmt: skip
    else:
        reason = (f"won on time among {len(tied)} tied within {_margin(config)} with equal or "
                  f"unknown memory headroom: mean {win_stats.mean_ms:.1f} ms")  # fmt: skip
    decided[win_trace.arm] = Decision(win_trace.arm, win_trace.layout, look, WIN, reason,
                                      math.nan, math.nan, None, win_stats.n,
                                      win_stats.mean_ms)  # fmt: skip

    for item in qualified:
        trace, summary, values = item
        if item is win:
            continue
        if any(item is other for other in others):
            reference, ref_values = win_trace, win_values
            ratio = summary.mean_ms / win_stats.mean_ms
            tied_with = f"tied with {_name(win_trace)} within {_margin(config)}"
            if headroom(item) == headroom(win):
                reason = f"{tied_with} and equal or unknown memory headroom, but {_percent(ratio)}"
            else:
                reason = (f"{tied_with} ({_percent(ratio)}) but less memory headroom "
                          f"({_gib(trace)} vs {_gib(win_trace)})")  # fmt: skip
        else:
            reference, ref_values = fastest[0], fastest[2]
            ratio = summary.mean_ms / fastest[1].mean_ms
            reason = (f"{_percent(ratio)} than {_name(reference)} at the budget, beyond the "
                      f"{_margin(config)} margin")  # fmt: skip
        statistic, p_value = worse_by_margin(values, ref_values, config)
        decided[trace.arm] = Decision(trace.arm, trace.layout, look, LOSE, reason, statistic,
                                      p_value, reference.arm, summary.n,
                                      summary.mean_ms)  # fmt: skip
    return [decided[trace.arm] for trace in traces if trace.arm in decided]


def _as_of(trace: ArmTrace, steady: int, config: ABConfig) -> ArmTrace:
    """The trace as it stood when it completed ``steady`` steady iterations.  A run that got
    that far had not failed yet: its failure (if any) came later and is hidden."""
    keep = config.warmup_iterations + steady
    if len(trace.steps_ms) < keep:
        return trace
    return replace(trace, steps_ms=tuple(trace.steps_ms[:keep]), failure=None)


def replay(traces: Sequence[ArmTrace], config: ABConfig) -> list[Decision]:
    """Re-judge recorded traces as if all arms had run side by side at the same iteration
    pace: every look in order, each seeing the traces as they stood at that look (an arm stopped
    at look k is not seen later), then the final decisions."""
    _check_arms(traces)
    decisions: list[Decision] = []
    stopped: set[str] = set()
    for look in range(len(config.looks)):
        steady = config.look_iterations(look)
        at_look = [_as_of(trace, steady, config) for trace in traces]
        for decision in decide_look(at_look, look, config, stopped):
            decisions.append(decision)
            if decision.action == STOP:
                stopped.add(decision.arm)
    decisions.extend(final_decisions(traces, config, stopped))
    return decisions


def winner(decisions: Sequence[Decision]) -> Decision | None:
    """The winning decision, if the test reached one."""
    return next((d for d in reversed(decisions) if d.action == WIN), None)


# --- cost and records --------------------------------------------------------------------------


@dataclass(frozen=True)
class ArmCost:
    """What one arm cost in GPU time, and what it was allowed to cost."""

    world_size: int
    overhead_s: float  # start-up before the first iteration
    steps_ms: tuple[float, ...]  # what it ran
    budget_iterations: int

    def __post_init__(self) -> None:
        if not _is_int(self.world_size) or self.world_size < 1:
            raise ConfigError(f"world_size must be a positive integer, got {self.world_size!r}")
        if not _is_int(self.budget_iterations) or self.budget_iterations < 0:
            raise ConfigError(f"budget_iterations must be an integer >= 0, got "
                              f"{self.budget_iterations!r}")  # fmt: skip


def gpu_seconds(arms: Sequence[ArmCost]) -> tuple[float, float]:
    """(spent, full): GPU-seconds the arms used, and what running every arm to its budget would
    have cost (its mean finite step times the budget).  Non-finite steps (a hang's inf) are left
    out of both; an arm without a finite step counts what it spent for full too."""
    spent = full = 0.0
    for arm in arms:
        steps = np.asarray(arm.steps_ms, dtype=float)
        finite = steps[np.isfinite(steps)]
        used = arm.world_size * (arm.overhead_s + float(finite.sum()) / 1000.0)
        spent += used
        if finite.size:
            per_step_s = float(finite.mean()) / 1000.0
            full += arm.world_size * (arm.overhead_s + per_step_s * arm.budget_iterations)
        else:
            full += used
    return spent, full


def decision_rows(
    decisions: Sequence[Decision],
    study: str,
    run_ids: Mapping[str, str],
    test_id: str,
    now: float,
) -> list[dict]:
    """Rows of the cost store's ``decisions`` table; ``decision_id`` is deterministic, so writing
    the same test twice is recognisable."""
    rows = []
    for d in decisions:
        rows.append({
            "study": study,
            "decision_id": f"{test_id}.{d.arm}.look{d.look}",
            "run_id": run_ids.get(d.arm),
            "layout": d.layout,
            "look": int(d.look),
            "statistic": float(d.statistic),
            "p_value": float(d.p_value),
            "action": d.action,
            "reason": d.reason,
            "created_at": float(now),
        })  # fmt: skip
    ids = [row["decision_id"] for row in rows]
    if len(set(ids)) != len(ids):
        raise ValueError(f"two decisions for the same arm and look in test {test_id}")
    return rows
