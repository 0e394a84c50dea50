"""Runs into the cost store and back: parsed Megatron logs as rows, stored rows as observations.

The imperative shell around ``megatron_logs`` (text -> records), ``store`` (rows on disk) and
``fit`` (observations -> costs).  A run's id is a hash of what it measured (the log text, the
layout and the parallel sizes), so ingesting the same log twice stores it once.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ray_layout.errors import ConfigError
from ray_layout.measure.fit import FitResult, RunObservation, observation_from_records
from ray_layout.measure.logs import MemoryRecord, ParsedLog, TimerRecord, parse_log
from ray_layout.measure.store import CostStore
from ray_layout.model.layout import Layout
from ray_layout.model.spec import ModelSpec, ParallelConfig


@dataclass(frozen=True)
class LoggedRun:
    """A profiling run's log and what it ran: the layout and the run's parallel sizes."""

    layout: Layout
    path: Path
    parallel: ParallelConfig
    num_microbatches: int | None = None  # else from the log's global batch size


def parse_run_argument(text: str, pp: int) -> tuple[Layout, Path]:
    """``LAYOUT=PATH`` as ``--run`` takes it (a layout has no '=', a path may)."""
    layout_text, equals, path = text.partition("=")
    if not equals or not path:
        raise ConfigError(f"--run {text!r}: expected LAYOUT=PATH, e.g. 'Et*5|t*6|t*5|mL=run1.log'")
    return Layout.parse(layout_text, pp), Path(path)


def microbatches_of(parsed: ParsedLog, parallel: ParallelConfig, given: int | None) -> int:
    """Micro-batches per step: given, or the log's global batch size / (micro-batch x DP)."""
    if given:
        return given
    sizes = {it.global_batch_size for it in parsed.iterations if it.global_batch_size}
    if len(sizes) != 1:
        raise ConfigError(
            "the number of micro-batches is unknown: the log shows global batch sizes "
            f"{sorted(sizes) or 'none'}; give --micro-batches"
        )
    return sizes.pop() // (parallel.micro_batch_size * parallel.dp)


def run_rows(
    model: ModelSpec, run: LoggedRun, text: str, parsed: ParsedLog, study: str
) -> tuple[dict[str, Any], dict[str, list[dict[str, Any]]]]:
    """The ``runs`` row and the data rows of one logged run."""
    parallel = run.parallel
    microbatches = microbatches_of(parsed, parallel, run.num_microbatches)
    content = hashlib.sha256(
        json.dumps([text, str(run.layout), asdict(parallel), microbatches]).encode()
    ).hexdigest()
    run_id = f"run-{content[:16]}"
    per_stage = parallel.world_size // run.layout.pp
    timers = [
        {"run_id": run_id, "interval": r.interval, "iteration": r.iteration, "rank": r.rank,
         "pp_rank": None if r.rank is None else r.rank // per_stage, "timer": r.timer,
         "ms": r.ms, "stat": r.stat}
        for r in parsed.timers
    ]  # fmt: skip
    iterations = [
        {"run_id": run_id, "iteration": it.iteration, "elapsed_ms": it.elapsed_ms,
         "throughput_tflops": it.throughput_tflops, "lm_loss": it.losses.get("lm loss"),
         "mtp_loss": next((v for k, v in it.losses.items() if k.startswith("mtp")), None),
         "grad_norm": it.grad_norm, "loss_scale": it.loss_scale,
         "skipped": it.skipped_iterations, "nan": it.nan_iterations}
        for it in parsed.iterations
    ]  # fmt: skip
    memory = [
        {"run_id": run_id, "rank": m.rank, "pp_rank": m.rank // per_stage,
         "iteration": m.iteration, "allocated_mb": m.allocated_mb,
         "max_allocated_mb": m.max_allocated_mb, "reserved_mb": m.reserved_mb,
         "max_reserved_mb": m.max_reserved_mb}
        for m in parsed.memory
    ]  # fmt: skip
    now = time.time()
    row = {
        "run_id": run_id, "study": study, "model": model.name,
        "model_hash": hashlib.sha256(repr(model).encode()).hexdigest()[:16],
        "layout": str(run.layout), "pp": run.layout.pp, "vpp": run.layout.vpp,
        "tp": parallel.tp, "cp": parallel.cp, "ep": parallel.ep, "etp": parallel.etp,
        "dp": parallel.dp, "micro_batch_size": parallel.micro_batch_size,
        "global_batch_size": microbatches * parallel.micro_batch_size * parallel.dp,
        "num_microbatches": microbatches, "backend": "external", "status": "finished",
        "source": str(run.path), "content_hash": content, "started_at": now,
        "finished_at": now,
    }  # fmt: skip
    return row, {"timers": timers, "iterations": iterations, "memory": memory}


@dataclass(frozen=True)
class Ingested:
    run_id: str
    stored: bool  # False: the store already held this run
    timer_rows: int
    skipped_lines: int


def ingest(store: CostStore, model: ModelSpec, runs: Sequence[LoggedRun], study: str):
    """Parse and store every run; the same log twice is stored once."""
    results = []
    for run in runs:
        try:
            text = run.path.read_text(errors="replace")
        except OSError as exc:
            raise ConfigError(f"{run.path}: cannot read ({exc.strerror})") from None
        parsed = parse_log(text, str(run.path))
        row, tables = run_rows(model, run, text, parsed, study)
        stored = store.write_run(row, tables, study)
        results.append(Ingested(row["run_id"], stored, len(tables["timers"]), parsed.skipped_lines))
    return results


def observations_from_store(
    store: CostStore, study: str | None, model: ModelSpec, parallel: ParallelConfig
) -> list[RunObservation]:
    """Every finished run of a study with this model, ready to fit."""
    runs = store.read("runs", study=study, model=model.name, status="finished")
    if runs.empty:
        where = f"study {study!r}" if study else "any study"
        raise ConfigError(f"{store.root}: no finished runs of {model.name} in {where}; ingest some")
    timers = store.read_run_data("timers", study=study)
    memory = store.read_run_data("memory", study=study)
    iterations = store.read_run_data("iterations", study=study)
    runs = runs[runs.run_id.isin(set(timers.run_id))]  # cluster attempt rows carry no timers
    if runs.empty:
        raise ConfigError(f"{store.root}: the finished runs of {model.name} have no timers")
    observations = []
    for run in runs.itertuples():
        sizes = ParallelConfig(
            **{k: int(getattr(run, k)) for k in ("tp", "pp", "vpp", "cp", "ep", "etp", "dp")},
            micro_batch_size=int(run.micro_batch_size),
            use_distributed_optimizer=parallel.use_distributed_optimizer,
        )
        mine = timers[timers.run_id == run.run_id]
        records = [
            TimerRecord(int(r.interval), None if r.iteration != r.iteration else int(r.iteration),
                        int(r.rank), r.timer, float(r.ms), r.stat)
            for r in mine.itertuples() if r.rank == r.rank
        ]  # fmt: skip
        peaks = [
            MemoryRecord(int(m.rank), int(m.iteration), float(m.allocated_mb),
                         float(m.max_allocated_mb), float(m.reserved_mb), float(m.max_reserved_mb))
            for m in memory[memory.run_id == run.run_id].itertuples()
        ]  # fmt: skip
        layout = Layout.parse(run.layout, int(run.pp))
        microbatches = int(run.num_microbatches)
        steps = iterations[iterations.run_id == run.run_id].sort_values("iteration").elapsed_ms
        observation = observation_from_records(
            run.run_id, records, peaks, layout, sizes, microbatches, steps_ms=steps.tolist()
        )
        observations.append(observation)
    return observations


def record_fit(store: CostStore, study: str, result: FitResult, runs: Sequence[str]) -> None:
    from ray_layout.model.costs import costs_to_dict

    now = time.time()
    store.write(
        "fits",
        [{"fit_id": f"fit-{int(now * 1000)}", "study": study, "created_at": now,
          "model": result.costs.model, "costs_json": json.dumps(costs_to_dict(result.costs)),
          "residual_max": result.max_residual, "runs": json.dumps(list(runs))}],
        study,
    )  # fmt: skip
