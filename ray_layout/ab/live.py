"""The live A/B test: the top layouts and the baselines run on the cluster, judged as they go.

The statistics are :mod:`ray_layout.ab.stats` and :mod:`ray_layout.ab.decisions` (pure); this is
the shell around them.  Every arm is one run of ``config.max_iterations`` iterations
(``profiling.run_layouts`` puts them side by side where the cluster has room, else in rounds,
best predictions first).  A watch per arm reads the iteration lines of its last rank as they come
and, under one lock, asks :func:`~ray_layout.ab.decisions.decide_look` at each look the arm
reaches, against every arm that has reached it too; a stopped arm's run ends at its next poll.
An arm the search predicts to lose by far more than the margin has its first look earlier
(:mod:`ray_layout.ab.looks`); a pair shown tied within the margin is settled there by the
tie-break, whichever of the two it stops.  NaN losses, a step ``blowup`` times the best arm's
median, OOM and hangs stop an arm at once.
The last arm standing (every other one stopped or failed) ends once it has passed a look: more
steps cannot change the verdict.  Memory headroom for ties is the predicted one while an arm
runs, the measured one after; critical stages are the predicted ones.  When every run has ended,
:func:`~ray_layout.ab.final.final_decisions` names the winner.

Every decision goes to the store's ``decisions`` table under a test id that digests the arms and
the settings, so a resumed tune finds the arms that already ran (their runs and traces are in
the store) and only runs the rest.
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from ray_layout.ab.cost import ArmCost
from ray_layout.ab.decisions import Decision, decide_look, decision_rows
from ray_layout.ab.final import final_decisions
from ray_layout.ab.looks import (
    Prediction,
    covering_iterations,
    first_looks,
    look_iterations,
)
from ray_layout.ab.stats import ABConfig, ArmTrace, blowup_reason, failure_reason, steady_steps
from ray_layout.ab.vocabulary import ABAction, ArmRole, StopReason
from ray_layout.measure.logs import parse_iteration_line
from ray_layout.measure.store import CostStore
from ray_layout.model.layout import Layout
from ray_layout.model.memory_settings import MemorySettings, memory_settings
from ray_layout.runtime.failures import FINISHED, STOPPED, FailureClass
from ray_layout.runtime.layout_runs import LayoutRun, ProfiledRun
from ray_layout.runtime.run_spec import Watch

GIB_PER_MB = 1 / 1024


@dataclass(frozen=True)
class Arm:
    """One layout of the test, the recomputation it runs with (a candidate's from the search,
    a baseline's the job's own) and what the search predicted for it."""

    name: str  # "candidate-1", ..., "current", "default", "count-based"
    layout: Layout
    roles: tuple[ArmRole, ...]  # a candidate the baseline rule also gives holds both
    predicted_ms: float
    predicted_memory_gib: tuple[float, ...]
    critical_stages: int | None = None  # predicted ranks near the bottleneck (the tie-break's)
    predicted_cv: float = 0.0  # predicted spread of one step over its mean (the fitted jitter)
    recompute: tuple[str, ...] = ()  # its Megatron recompute flags (empty: no recomputation)

    @property
    def recompute_settings(self) -> MemorySettings:
        """The recomputation the arm runs, as the memory model and the runs take it."""
        return memory_settings(self.recompute)


@dataclass(frozen=True)
class ArmResult:
    """What the test measured of one arm."""

    arm: Arm
    trace: ArmTrace
    run: ProfiledRun | None  # None: never ran (the test ended before its turn)
    memory_gib: tuple[float, ...] | None  # max allocated per PP rank
    cost: ArmCost


@dataclass(frozen=True)
class ABOutcome:
    """What the test measured and decided; empty when no A/B was asked for."""

    test_id: str
    results: tuple[ArmResult, ...]
    decisions: tuple[Decision, ...]

    @property
    def last_decisions(self) -> dict[str, Decision]:
        """Each arm's last decision: decisions come in the order they were made."""
        return {d.arm: d for d in self.decisions}

    @property
    def winner(self) -> ArmResult | None:
        won = {d.arm for d in self.decisions if d.action is ABAction.WIN}
        return next((r for r in self.results if r.arm.name in won), None)


def test_id(arms: Sequence[Arm], config: ABConfig, extra: str = "") -> str:
    """Digest of the arms (with their recompute flags) and the settings: the same test asked
    again finds its decisions."""
    text = json.dumps(
        [[a.name, str(a.layout), *a.recompute] for a in arms] + [asdict(config), extra]
    )
    return "ab-" + hashlib.sha256(text.encode()).hexdigest()[:12]


@dataclass
class _ArmState:
    steps_ms: list[float] = field(default_factory=list)
    attempt: str | None = None
    failure: str | None = None
    launched_at: float | None = None
    first_step_at: float | None = None
    last_step_at: float = 0.0
    looks_done: int = 0
    ended: bool = False  # its run ends or has ended: the steps it has are all it will have


class LiveTest:
    """The arms' traces while they run; watches call in from the cluster's run threads."""

    def __init__(
        self,
        arms: Sequence[Arm],
        config: ABConfig,
        hbm_gib: float | None,
        on_step: Callable[[str, int], None] = lambda arm, steps: None,
    ) -> None:
        self.arms = {arm.name: arm for arm in arms}
        self.config = config
        self.hbm_gib = hbm_gib
        self._on_step = on_step
        self._lock = threading.Lock()
        self._state = {name: _ArmState() for name in self.arms}
        self._headroom: dict[str, float] = {}
        self._stopped: dict[str, str] = {}  # arm -> why
        self._decisions: dict[tuple[str, int], Decision] = {}
        self._predictions = {a.name: Prediction(a.predicted_ms, a.predicted_cv) for a in arms}
        self.first_looks = first_looks(self._predictions, config)

    def preload(
        self, arm: str, steps_ms: Sequence[float], failure: str | None, stopped: str | None
    ) -> None:
        """An arm measured before (a resumed tune), judged with the rest; ``stopped`` is its
        run's stored error where the earlier test ended it: a :class:`StopReason` (by its code,
        whatever the wording) is no loss, any other reason stops it again."""
        with self._lock:
            state = self._state[arm]
            state.steps_ms, state.failure, state.attempt = list(steps_ms), failure, "stored"
            state.ended = True
            steady = len(steady_steps(self._trace(arm), self.config))
            state.looks_done = sum(
                steady >= self._look_iterations(arm, k) for k in range(len(self.config.looks))
            )
            if stopped and StopReason.of(stopped) is None:
                self._record(self._stop(self._trace(arm), stopped))

    def watch(self, arm: str) -> Watch:
        def see(attempt: str, lines: list[str]) -> str | None:
            now = time.monotonic()
            records = [r for r in map(parse_iteration_line, lines) if r is not None]
            with self._lock:
                state = self._state[arm]
                if state.attempt != attempt:  # a retry starts its trace afresh
                    self._state[arm] = state = _ArmState(attempt=attempt, launched_at=now)
                for record in records:
                    state.first_step_at = state.first_step_at or now
                    state.last_step_at = now
                    state.steps_ms.append(record.elapsed_ms)
                    losses = list(record.losses.values())
                    if (record.nan_iterations or 0) > 0 or not all(map(math.isfinite, losses)):
                        state.failure = FailureClass.NAN
                reason = self._judge(arm) if records else self._stopped.get(arm)
                steps = len(state.steps_ms)
                state.ended = (
                    state.ended or reason is not None or steps >= self.config.max_iterations
                )
            if records:
                self._on_step(arm, steps)
            return reason

        return see

    def end(self, arm: str, run: ProfiledRun, memory_gib: tuple[float, ...] | None) -> None:
        """An arm's run is over: a failure stops it, and its memory gives its headroom."""
        with self._lock:
            state = self._state[arm]
            if run.result.status not in (FINISHED, STOPPED) and state.failure is None:
                state.failure = run.result.failure_class or run.result.status
            measured = [gib for gib in memory_gib or () if math.isfinite(gib)]
            if measured and len(measured) == len(memory_gib):  # a stage unseen: keep predicted
                self._headroom[arm] = (self.hbm_gib or 0.0) - max(measured)
            trace = self._trace(arm)
            if arm not in self._stopped and (reason := failure_reason(trace, self.config)):
                self._record(self._stop(trace, reason))

    def finish(self) -> list[Decision]:
        """The final look over every arm that was not stopped; all decisions in order."""
        with self._lock:
            for decision in final_decisions(self._traces(), self.config, set(self._stopped)):
                self._record(decision)
            return list(self._decisions.values())

    def decisions(self) -> list[Decision]:
        with self._lock:
            return list(self._decisions.values())

    def trace(self, arm: str) -> ArmTrace:
        with self._lock:
            return self._trace(arm)

    def cost(self, arm: str, world_size: int) -> ArmCost:
        """The arm's GPU time in wall-clock seconds.  Its step times are rescaled to the wall
        clock seen between its first and last iteration, since an emulated run prints emulated
        milliseconds; an arm read back from the store counts its steps only."""
        with self._lock:
            state = self._state[arm]
            steps = np.asarray(state.steps_ms, dtype=float)
            overhead, scale = 0.0, 1.0
            if state.launched_at is not None and state.first_step_at is not None:
                later = steps[1:][np.isfinite(steps[1:])]
                if later.sum() > 0 and state.last_step_at > state.first_step_at:
                    scale = (state.last_step_at - state.first_step_at) * 1000.0 / later.sum()
                first_s = steps[0] * scale / 1000.0 if np.isfinite(steps[0]) else 0.0
                # the first line comes after the first step: start-up is what precedes it
                overhead = max(0.0, state.first_step_at - state.launched_at - first_s)
            budget = self.config.max_iterations
            return ArmCost(world_size, overhead, tuple((steps * scale).tolist()), budget)

    def _judge(self, arm: str) -> str | None:
        """Called under the lock after new steps of ``arm``: immediate stops, then its looks."""
        if arm in self._stopped:
            return self._stopped[arm]
        traces = self._traces()
        trace = next(t for t in traces if t.arm == arm)
        if reason := failure_reason(trace, self.config):
            self._record(self._stop(trace, reason))
            return reason
        values = steady_steps(trace, self.config)
        best = self._best_median(traces)
        enough = best is not None and len(values) >= self.config.batch_size
        if enough and (reason := blowup_reason(values, best[1], self.config)):
            self._record(self._stop(trace, reason, reference=best[0]))
            return reason
        state = self._state[arm]
        while state.looks_done < len(self.config.looks) and len(values) >= self._look_iterations(
            arm, state.looks_done
        ):
            look = state.looks_done
            stopped = set(self._stopped)
            for decision in decide_look(traces, look, self.config, stopped, self.first_looks):
                self._record(decision)
            state.looks_done += 1
        if arm in self._stopped:
            return self._stopped[arm]
        if state.looks_done:
            return self._ending(arm, values)
        return None

    def _ending(self, arm: str, values: np.ndarray) -> str | None:
        """Why ``arm`` may end now, though not stopped: more of its steps cannot change the
        verdict (a :class:`StopReason`'s text).  SETTLED: every other arm is stopped or failed.
        COVERED (arms run one round after another): every other arm is settled, ended with no
        more steady steps than this one, or yet to run and expected to be decided within this
        one's steps (``values``: its steady steps)."""
        steady = len(values)
        pending, alone = {}, True
        for other in self.arms:
            state = self._state[other]
            if other == arm or self._settled(other):
                continue
            alone = False
            if not state.steps_ms:
                pending[other] = self._predictions[other].mean_ms
            elif not state.ended or steady < len(steady_steps(self._trace(other), self.config)):
                return None
        if alone:
            return StopReason.SETTLED.text
        if steady >= self.config.look_iterations(len(self.config.looks) - 1):
            return None  # at its budget: the run ends by itself
        cv = float(np.std(values, ddof=1) / np.mean(values)) if steady > 1 else math.inf
        covering = covering_iterations(
            self._predictions[arm].mean_ms, cv, pending, self.config, self.first_looks
        )
        return StopReason.COVERED.text if steady >= covering else None

    def _look_iterations(self, arm: str, look: int) -> int:
        return look_iterations(self.config, look, self.first_looks.get(arm))

    def _settled(self, arm: str) -> bool:
        """Out of the running: stopped or failed.  (An arm that ran to its budget still
        competes: the final comparison needs the others' full budgets too.)"""
        return arm in self._stopped or self._state[arm].failure is not None

    def _best_median(self, traces: Sequence[ArmTrace]) -> tuple[str, float] | None:
        medians = [
            (t.arm, float(np.median(steps)))
            for t in traces
            if t.failure is None
            and t.arm not in self._stopped
            and len(steps := steady_steps(t, self.config)) >= self.config.batch_size
        ]
        return min(medians, key=lambda item: item[1]) if medians else None

    def _stop(self, trace: ArmTrace, reason: str, reference: str | None = None) -> Decision:
        values = steady_steps(trace, self.config)
        finite = values[np.isfinite(values)]
        return Decision(
            arm=trace.arm,
            layout=trace.layout,
            look=self._state[trace.arm].looks_done,
            action=ABAction.STOP,
            reason=reason,
            statistic=math.nan,
            p_value=math.nan,
            reference=reference,
            n_steady=len(values),
            mean_ms=float(finite.mean()) if len(finite) else math.nan,
        )

    def _record(self, decision: Decision) -> None:
        key = (decision.arm, decision.look)
        if decision.arm in self._stopped and decision.action is not ABAction.STOP:
            return
        if key in self._decisions and self._decisions[key].action is ABAction.STOP:
            return
        self._decisions.pop(key, None)  # re-inserted: the dict stays in the order of making
        self._decisions[key] = decision
        if decision.action is ABAction.STOP:
            self._stopped[decision.arm] = decision.reason

    def _trace(self, arm: str) -> ArmTrace:
        """Headroom is the measured one once the run has ended, the predicted one before."""
        state = self._state[arm]
        predicted = (self.hbm_gib or 0.0) - max(self.arms[arm].predicted_memory_gib)
        return ArmTrace(
            arm=arm,
            layout=str(self.arms[arm].layout),
            steps_ms=tuple(state.steps_ms),
            failure=state.failure,
            headroom_gib=self._headroom.get(arm, predicted),
            critical_stages=self.arms[arm].critical_stages,
        )

    def _traces(self) -> list[ArmTrace]:
        return [self._trace(arm) for arm in self.arms]


def arm_runs(test: LiveTest, test_key: str) -> list[LayoutRun]:
    """The runs of the test's arms, each watched by the test and running its recomputation, in
    the arms' order."""
    return [
        LayoutRun(
            arm.layout,
            kind="ab",
            source=f"{test_key}:{name}",
            watch=test.watch(name),
            recompute=arm.recompute_settings,
        )
        for name, arm in test.arms.items()
    ]


def memory_per_stage(store: CostStore, study: str, run_id: str, pp: int) -> tuple[float, ...]:
    """Max allocated GiB per PP rank of a stored run (the largest over its ranks)."""
    memory = store.read_run_data("memory", study=study, run_id=run_id)
    if memory.empty:
        return ()
    peaks = memory.groupby("pp_rank").max_allocated_mb.max()
    return tuple(float(peaks.get(rank, math.nan)) * GIB_PER_MB for rank in range(pp))


def stored_steps(store: CostStore, study: str, run_id: str) -> list[float]:
    """A stored run's per-iteration step times, in iteration order."""
    rows = store.read_run_data("iterations", study=study, run_id=run_id)
    return rows.sort_values("iteration").elapsed_ms.astype(float).tolist() if len(rows) else []


def write_decisions(
    store: CostStore,
    study: str,
    test_key: str,
    decisions: Sequence[Decision],
    run_ids: dict[str, str],
) -> None:
    """Every decision of the test, replacing none: a re-run writes only what is new."""
    known = store.read("decisions", study=study)
    seen = set(known.decision_id) if len(known) else set()
    rows = decision_rows(decisions, study, run_ids, test_key, time.time())
    for row in rows:  # a look's "continue" may later turn into a "stop": both are kept
        row["decision_id"] += f".{row['action']}"
    fresh = [row for row in rows if row["decision_id"] not in seen]
    if fresh:
        store.write("decisions", fresh, study)
