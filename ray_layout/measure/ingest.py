"""Runs into the cost store and back: parsed Megatron logs as rows, stored rows as observations.

The imperative shell around ``logs`` (text -> records), ``declared`` (a log against what its run
was declared to be), ``store`` (rows on disk) and ``observations`` (rows -> what the fit reads).
A run's id is a hash of its log's text, so the same log ingested twice is stored once, whatever
it was declared as.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from ray_layout.errors import ConfigError, LayoutError, MeasurementError, clipped
from ray_layout.measure.declared import CheckedRun, check_log
from ray_layout.measure.fit import FitResult
from ray_layout.measure.log_records import (
    MemoryRecord,
    TimerRecord,
    impossible_memory,
    impossible_timer,
    out_of_range,
)
from ray_layout.measure.logs import parse_log, read_log
from ray_layout.measure.observations import (
    RunObservation,
    observation_from_log,
    observation_from_records,
)
from ray_layout.measure.store import CostStore
from ray_layout.model.costs import costs_to_dict
from ray_layout.model.fields import ModelSpec
from ray_layout.model.layout import Layout, format_stages
from ray_layout.model.spec import PARALLEL_SIZES, ParallelConfig


@dataclass(frozen=True)
class LoggedRun:
    """A profiling run's log and what it ran: the layout and the run's parallel sizes.

    ``explicit`` names the sizes (tp, pp, dp, ...) the user gave for the run: a log that states
    another is refused; for the others the log's are taken (``declared.check_log``)."""

    layout: Layout
    path: Path
    parallel: ParallelConfig
    num_microbatches: int | None = None  # else from the log's global batch size
    explicit: frozenset[str] = frozenset()


def parse_run_argument(text: str, pp: int) -> tuple[Layout, Path]:
    """``LAYOUT=PATH`` as ``--run`` takes it (a layout has no '=', a path may)."""
    layout_text, equals, path = text.partition("=")
    if not equals or not path:
        raise ConfigError(f"--run {text!r}: expected LAYOUT=PATH, e.g. 'Et*5|t*6|t*5|mL=run1.log'")
    try:
        return Layout.parse(layout_text, pp), Path(path)
    except LayoutError as exc:
        raise LayoutError(f"--run {clipped(text)}: {exc}") from None


def read_logged_run(run: LoggedRun, model: ModelSpec | None = None) -> tuple[str, CheckedRun]:
    """The log's text and the run as its log confirms it (refused where it contradicts, where
    its arguments print another shape than ``model``'s, or a combined 1F1B run)."""
    text = read_log(run.path)
    parsed = parse_log(text, str(run.path))
    if parsed.arguments.get("overlap_moe_expert_parallel_comm", "").lower() == "true":
        raise MeasurementError(
            f"{run.path}: the run used --overlap-moe-expert-parallel-comm (combined 1F1B), whose "
            "forward-compute timer holds each merged forward+backward step whole, which no unit "
            "cost can split; ingest a run without it"
        )
    try:
        checked = check_log(
            parsed,
            run.layout,
            run.parallel,
            run.num_microbatches,
            str(run.path),
            run.explicit,
            model,
        )
    except MeasurementError as exc:
        if not parsed.skipped_lines:
            raise
        # what was dropped may be what is missing (a prefix or format this reader does not know)
        raise MeasurementError(
            f"{exc}; {parsed.skipped_lines} line(s) that look like Megatron's were dropped, "
            f"first {parsed.skipped_examples[0]}"
        ) from None
    refuse_idle_stage(checked, str(run.path))
    return text, checked


COMPUTE_TIMERS = ("forward-compute", "backward-compute")


def refuse_idle_stage(run: CheckedRun, source: str) -> None:
    """Refuse a run where a rank whose pipeline stage holds layers times a compute timer at
    0 ms in a training block: no layer computes in no time, so the rank never ran them (a
    wrong layout, a broken timer, or another run's log), and a fit would take it for free."""
    per_stage = run.parallel.world_size // run.layout.pp
    training = set(run.parsed.training_intervals)
    for record in run.parsed.timers:
        if record.ms or record.rank is None or record.timer not in COMPUTE_TIMERS:
            continue
        stage = run.layout.rank_chunks(record.rank // per_stage)
        if record.interval in training and "".join(stage):
            at = "" if record.line is None else f"line {record.line}: "
            raise MeasurementError(
                f"{source}: {at}rank {record.rank} times {record.timer} at {record.ms!r} ms, "
                f"but its pipeline stage {record.rank // per_stage} holds layers "
                f"({format_stages(stage)}) of layout {run.layout}, which take time; "
                "nothing of this log is stored"
            )


def read_logged_runs(
    runs: Sequence[LoggedRun], model: ModelSpec | None = None
) -> list[tuple[str, CheckedRun]]:
    """Every run read and checked (:func:`read_logged_run`) before any is used, and refused
    when one log comes twice (under two names or layouts: one run cannot be two)."""
    read = [read_logged_run(run, model) for run in runs]
    first: dict[str, LoggedRun] = {}
    for run, (text, _) in zip(runs, read, strict=True):
        before = first.setdefault(content_hash(text), run)
        if before is not run:
            raise ConfigError(
                f"--run {run.layout}={run.path}: the same log as --run "
                f"{before.layout}={before.path}; give each run's log once"
            )
    return read


def observations_of_logged_runs(
    runs: Sequence[LoggedRun], model: ModelSpec | None = None
) -> tuple[list[RunObservation], tuple[str, ...]]:
    """Logs straight to the fit, checked as ``ingest`` checks them; and the notes to show."""
    observations, notes = [], ()
    for run, (_, checked) in zip(runs, read_logged_runs(runs, model), strict=True):
        observations.append(
            observation_from_log(
                str(run.path),
                checked.parsed,
                checked.layout,
                checked.parallel,
                checked.num_microbatches,
            )
        )
        notes += checked.notes
    return observations, notes


def content_hash(text: str) -> str:
    """A log's identity: the same text is the same run, whatever it is declared as."""
    return hashlib.sha256(text.encode()).hexdigest()


def model_hash(model: ModelSpec) -> str:
    """The model's shape, so that runs of another model under the same name are told apart."""
    return hashlib.sha256(repr(model).encode()).hexdigest()[:16]


def run_rows(
    model: ModelSpec, run: CheckedRun, text: str, source: str, study: str
) -> tuple[dict[str, Any], dict[str, list[dict[str, Any]]]]:
    """The ``runs`` row and the data rows of one checked run.  The content hash is the log's
    alone, so the same log declared otherwise is still recognised as the same run."""
    refuse_idle_stage(run, source)
    parallel, parsed = run.parallel, run.parsed
    content = content_hash(text)
    run_id = f"run-{content[:16]}"
    per_stage = parallel.world_size // run.layout.pp

    def stage_of(rank: int | None) -> int | None:
        return None if rank is None else rank // per_stage

    timers = [{"run_id": run_id, **_values(r), "pp_rank": stage_of(r.rank)} for r in parsed.timers]
    iterations = [
        {
            "run_id": run_id,
            "iteration": it.iteration,
            "elapsed_ms": it.elapsed_ms,
            "throughput_tflops": it.throughput_tflops,
            "lm_loss": it.losses.get("lm loss"),
            "mtp_loss": next((v for k, v in it.losses.items() if k.startswith("mtp")), None),
            "grad_norm": it.grad_norm,
            "loss_scale": it.loss_scale,
            "skipped": it.skipped_iterations,
            "nan": it.nan_iterations,
        }
        for it in parsed.iterations
    ]
    memory = [{"run_id": run_id, **asdict(m), "pp_rank": stage_of(m.rank)} for m in parsed.memory]
    now, microbatches = time.time(), run.num_microbatches
    batch = microbatches * parallel.micro_batch_size * parallel.dp
    shape = replace(parallel, pp=run.layout.pp, vpp=run.layout.vpp, global_batch_size=batch)
    row = runs_row(
        run_id,
        study,
        shape,
        status="finished",
        started_at=now,
        finished_at=now,
        model=model.name,
        model_hash=model_hash(model),
        layout=str(run.layout),
        backend="external",
        source=source,
        content_hash=content,
    )
    return row, {"timers": timers, "iterations": iterations, "memory": memory}


def _values(record: TimerRecord) -> dict[str, Any]:
    """A timer record's values, without where its log printed it (no column of the store)."""
    return {f.name: getattr(record, f.name) for f in fields(record) if f.compare}


def runs_row(
    run_id: str,
    study: str,
    parallel: ParallelConfig,
    *,
    status: str,
    started_at: float,
    finished_at: float,
    **columns: Any,
) -> dict[str, Any]:
    """A row of the store's ``runs`` table, the one shape an ingested log and a cluster attempt
    both write: ``columns`` (labels, provenance) first, so none can override the run's own."""
    return {
        **columns,
        "run_id": run_id,
        "study": study,
        **parallel.as_row(),
        "status": status,
        "started_at": started_at,
        "finished_at": finished_at,
    }


# What a run's row declares about it: the same log stored under other values is refused.
DECLARED_COLUMNS = ("model", "layout", *PARALLEL_SIZES, "micro_batch_size", "num_microbatches")


@dataclass(frozen=True)
class Ingested:
    """What ingesting one log did, for the command to report."""

    run_id: str
    stored: bool  # False: the store already held this run
    timer_rows: int
    skipped_lines: int
    skipped_examples: tuple[str, ...] = ()  # the first few, "line N: '…' (why)"
    notes: tuple[str, ...] = ()  # sizes taken from the log, a cut timer block left out


def ingest(
    store: CostStore, model: ModelSpec, runs: Sequence[LoggedRun], study: str
) -> list[Ingested]:
    """Check every run, then store them all in one write (all or none); the same log again is
    stored once, and refused when it comes back declared as another layout, other sizes or
    another micro-batch count."""
    prepared = []
    for run, (text, checked) in zip(runs, read_logged_runs(runs, model), strict=True):
        row, tables = run_rows(model, checked, text, str(run.path), study)
        prepared.append((checked, row, tables, _same_log_stored(store, study, row, run.path)))
    stored = store.write_runs([(row, tables) for _, row, tables, _ in prepared], study)
    return [
        Ingested(
            row["run_id"],
            written,
            len(tables["timers"]),
            checked.parsed.skipped_lines,
            checked.parsed.skipped_examples,
            checked.notes + elsewhere,
        )
        for (checked, row, tables, elsewhere), written in zip(prepared, stored, strict=True)
    ]


def _same_log_stored(
    store: CostStore, study: str, row: dict[str, Any], path: Path
) -> tuple[str, ...]:
    """Refuse the log when this study holds it declared otherwise; note other studies that
    hold it (a log left in a shared folder by another study's run is no run of this one)."""
    stored = store.read("runs", None, content_hash=row["content_hash"])
    others = sorted(set(stored.study) - {study})
    for before in stored[stored.study == study].to_dict("records"):
        differs = [c for c in DECLARED_COLUMNS if before[c] != row[c]]
        if differs:
            was = ", ".join(f"{c} {before[c]}" for c in differs)
            now = ", ".join(f"{c} {row[c]}" for c in differs)
            raise ConfigError(
                f"{path}: this log is already stored in study {study!r} as {before['run_id']} "
                f"with {was}; not stored again with {now}"
            )
    return tuple(f"{path}: the same log is also stored in study {other!r}" for other in others)


def observations_from_store(
    store: CostStore, study: str | None, model: ModelSpec, parallel: ParallelConfig
) -> list[RunObservation]:
    """Every finished run of a study with this model, ready to fit; refused where a run of the
    same name has another shape, or holds a value no run can have."""
    runs = store.read("runs", study=study, model=model.name, status="finished")
    where = f"study {study!r}" if study else "any study"
    if runs.empty:
        raise MeasurementError(
            f"{store.root}: no finished runs of {model.name} in {where}; ingest some"
        )
    _refuse_foreign(store, runs, model, where)
    timers = store.read_run_data("timers", study=study)
    memory = store.read_run_data("memory", study=study)
    iterations = store.read_run_data("iterations", study=study)
    runs = runs[runs.run_id.isin(set(timers.run_id))]  # cluster attempt rows carry no timers
    if runs.empty:
        raise MeasurementError(f"{store.root}: the finished runs of {model.name} have no timers")
    observations = []
    for run in runs.itertuples():
        sizes = ParallelConfig(
            **{k: int(getattr(run, k)) for k in PARALLEL_SIZES},
            micro_batch_size=int(run.micro_batch_size),
            use_distributed_optimizer=parallel.use_distributed_optimizer,
        )
        mine = timers[timers.run_id == run.run_id]
        records = [
            TimerRecord(
                int(r.interval),
                None if r.iteration != r.iteration else int(r.iteration),
                int(r.rank),
                r.timer,
                float(r.ms),
                r.stat,
            )
            for r in mine.itertuples()
            if r.rank == r.rank
        ]
        peaks = [
            MemoryRecord(
                int(m.rank),
                int(m.iteration),
                float(m.allocated_mb),
                float(m.max_allocated_mb),
                float(m.reserved_mb),
                float(m.max_reserved_mb),
            )
            for m in memory[memory.run_id == run.run_id].itertuples()
        ]
        layout = Layout.parse(run.layout, int(run.pp))
        microbatches = int(run.num_microbatches)
        steps = iterations[iterations.run_id == run.run_id].sort_values("iteration").elapsed_ms
        _refuse_impossible(store, run, records, peaks, steps.tolist())
        observation = observation_from_records(
            run.run_id, records, peaks, layout, sizes, microbatches, steps_ms=steps.tolist()
        )
        observations.append(observation)
    return observations


def _refuse_foreign(store: CostStore, runs: Any, model: ModelSpec, where: str) -> None:
    """Runs stored under this model's name but of another shape (hidden 4096, not 2048) are
    another model's: refused, naming both shapes' hashes."""
    mine = model_hash(model)
    foreign = runs[runs.model_hash.notna() & (runs.model_hash != mine)]
    if not foreign.empty:
        theirs = ", ".join(sorted(set(foreign.model_hash)))
        raise ConfigError(
            f"{store.root}: {len(foreign)} of the {len(runs)} finished run(s) of {model.name} in "
            f"{where} are of another shape (model hash {theirs}; this config's is {mine}), e.g. "
            f"{foreign.run_id.iloc[0]}: fit them with the config they were ingested with, or "
            "remove them (python -m ray_layout store rm RUN_ID)"
        )


def _refuse_impossible(
    store: CostStore,
    run: Any,
    timers: Sequence[TimerRecord],
    memory: Sequence[MemoryRecord],
    steps_ms: Sequence[float],
) -> None:
    """A stored value no run can have (NaN, negative: stored before logs holding one were
    refused) is named with the run to remove, instead of failing the fit's algebra."""
    problem = next(
        (
            p
            for p in (
                *(impossible_timer(t.timer, t.rank, ((t.stat, t.ms),)) for t in timers),
                *map(impossible_memory, memory),
                *(out_of_range("a step", ms, "ms") for ms in steps_ms),
            )
            if p is not None
        ),
        None,
    )
    if problem is not None:
        raise MeasurementError(
            f"{store.root}: run {run.run_id} of study {run.study!r}: {problem}; remove it with "
            f"python -m ray_layout store rm {run.run_id} --store {store.root} --study {run.study}"
        )


def record_fit(store: CostStore, study: str, result: FitResult, runs: Sequence[str]) -> None:
    """Keep the fit beside the runs it came from, so a study's later plans can start from it."""
    now = time.time()
    store.write(
        "fits",
        [
            {
                "fit_id": f"fit-{int(now * 1000)}",
                "study": study,
                "created_at": now,
                "model": result.costs.model,
                "costs_json": json.dumps(costs_to_dict(result.costs)),
                "residual_max": result.max_residual,
                "runs": json.dumps(list(runs)),
            }
        ],
        study,
    )
