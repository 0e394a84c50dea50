"""``python -m ray_layout.tune``: the tune command, from flags to the driver's settings.

Every setting is checked here, before any cluster is started or joined; the driver
(``ray_layout.driver.tune``) then runs size, profile, fit, search, A/B, refit and report.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import sys
import threading
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from rich.console import Console

from ray_layout.ab.stats import ABConfig
from ray_layout.commands.common import OneLineErrorParser, add_parallel_flags, recipe_from_args
from ray_layout.driver.tune import DEFAULT_HARDWARE, TuneSettings, run_tune, study_id
from ray_layout.errors import (
    EXIT_BAD_INPUT,
    EXIT_INTERRUPTED,
    ConfigError,
    LayoutError,
    RunFailure,
)
from ray_layout.measure.fit import STEP_WARMUP
from ray_layout.model.layout import check_interleaving
from ray_layout.model.spec import Recipe
from ray_layout.runtime.cluster import connected
from ray_layout.runtime.profiling import Backend


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrorParser(
        prog="python -m ray_layout.tune",
        description="Measure, search and A/B-test pipeline layouts on a Ray cluster; report the "
        "--pipeline-model-parallel-layout to use.",
    )
    parser.add_argument(
        "config",
        help="model config: project YAML/JSON, HF config.json, or a Megatron launch script",
    )
    add_parallel_flags(parser)
    parser.add_argument("--backend", choices=("emulated", "megatron"), default="emulated")
    parser.add_argument("--megatron-path", help="a Megatron-LM checkout on every node (megatron)")
    parser.add_argument(
        "--hardware", default=DEFAULT_HARDWARE, help="the emulated backend's hardware profile"
    )
    parser.add_argument("--hbm-gb", type=float, help="GPU memory limit in GiB for the search")
    parser.add_argument(
        "--ab-top",
        type=int,
        default=3,
        help="how many top layouts to A/B-test with both baselines (0: none)",
    )
    parser.add_argument("--store", default="ray_layout_store", help="the cost store folder")
    parser.add_argument(
        "--study", help="study id (default: from the model, sizes and backend); the same id resumes"
    )
    parser.add_argument("--report-dir", help="default: ray_layout_report/<study>")
    parser.add_argument(
        "--log-dir",
        default="ray_layout_logs",
        help="rank logs (on a shared file system for multi-node clusters)",
    )
    parser.add_argument(
        "--ray-address",
        help="a running cluster (default: $RAY_ADDRESS, else an "
        "embedded local cluster of simulated GPU nodes)",
    )
    parser.add_argument("--nodes", type=int, default=3, help="embedded cluster: nodes")
    parser.add_argument(
        "--gpus-per-node",
        type=int,
        help="GPUs a run takes per node (default: the cluster's, 4 embedded)",
    )
    parser.add_argument("--profile-iters", type=int, default=10)
    parser.add_argument(
        "--runs-at-once",
        type=int,
        help="at most this many runs side by side (default: as many as fit; 1 keeps emulated "
        "runs on a small machine from sharing its cores)",
    )
    ab = parser.add_argument_group("A/B test")
    defaults = ABConfig()
    ab.add_argument("--ab-warmup", type=int, default=defaults.warmup_iterations)
    ab.add_argument(
        "--ab-batch", type=int, default=defaults.batch_size, help="iterations per batch mean"
    )
    ab.add_argument(
        "--ab-looks",
        default=",".join(map(str, defaults.looks)),
        help="batches at each look, e.g. 3,6,12,24 (the last is the budget)",
    )
    ab.add_argument("--ab-alpha", type=float, default=defaults.alpha)
    ab.add_argument("--ab-margin", type=float, default=defaults.margin)
    parser.add_argument("--timeout-s", type=float, default=3600.0, help="per run")
    parser.add_argument(
        "--heartbeat-s", type=float, default=900.0, help="longest wait for an iteration line"
    )
    parser.add_argument("--samples", type=int, default=256, help="Monte Carlo samples")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--allow-standalone-mtp", action="store_true")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON at the end")
    return parser


def _settings(args: argparse.Namespace, recipe: Recipe, gpus_per_node: int) -> TuneSettings:
    backend = Backend(
        args.backend,
        megatron_path=Path(args.megatron_path) if args.megatron_path else None,
        hardware_profile=Path(args.hardware) if args.backend == "emulated" else None,
    )
    if backend.hardware_profile is not None and not backend.hardware_profile.is_file():
        raise ConfigError(f"--hardware {args.hardware}: no such file")
    try:
        looks = tuple(int(x) for x in args.ab_looks.split(","))
    except ValueError:
        raise ConfigError(
            f"--ab-looks must be integers such as 3,6,12,24, got {args.ab_looks!r}"
        ) from None
    config = ABConfig(
        warmup_iterations=args.ab_warmup,
        batch_size=args.ab_batch,
        looks=looks,
        alpha=args.ab_alpha,
        margin=args.ab_margin,
    )
    if args.ab_top < 0:
        raise ConfigError(f"--ab-top must be >= 0, got {args.ab_top}")
    if args.profile_iters < STEP_WARMUP + 2:
        raise ConfigError(f"--profile-iters must be >= {STEP_WARMUP + 2}: the fit drops the "
                          f"first {STEP_WARMUP}, got {args.profile_iters}")  # fmt: skip
    for flag in ("nodes", "gpus_per_node", "runs_at_once"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise ConfigError(f"--{flag.replace('_', '-')} must be >= 1, got {value}")
    if args.hbm_gb is not None and args.hbm_gb <= 0:
        raise ConfigError(f"--hbm-gb must be positive, got {args.hbm_gb}")
    study = args.study or study_id(recipe, backend)
    return TuneSettings(
        backend=backend,
        store=Path(args.store),
        study=study,
        log_dir=Path(args.log_dir),
        report_dir=Path(args.report_dir or Path("ray_layout_report") / study),
        gpus_per_node=gpus_per_node,
        ab=config,
        ab_top=args.ab_top,
        profile_iters=args.profile_iters,
        hbm_gib=args.hbm_gb,
        timeout_s=args.timeout_s,
        heartbeat_s=args.heartbeat_s,
        samples=args.samples,
        seed=args.seed,
        allow_standalone_mtp=args.allow_standalone_mtp,
        runs_at_once=args.runs_at_once,
    )


def _check_recipe(recipe: Recipe) -> None:
    parallel = recipe.parallel
    if parallel.num_microbatches_or_none is None:
        raise ConfigError("the number of micro-batches is unknown: give --global-batch-size")
    check_interleaving(parallel.pp, parallel.vpp)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    console = Console(width=max(shutil.get_terminal_size().columns, 120))
    cancel = threading.Event()

    def interrupted(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    # SIGTERM is what `ray job stop` sends; SIGINT too, even where it came in ignored (a
    # background job of a shell ignores it), so that Ctrl-C and kill -INT always stop the runs
    signal.signal(signal.SIGTERM, interrupted)
    signal.signal(signal.SIGINT, interrupted)
    try:
        recipe = recipe_from_args(args)
        _check_recipe(recipe)
        settings = _settings(args, recipe, args.gpus_per_node or 0)  # checked before any cluster
        with connected(args.ray_address, args.nodes, args.gpus_per_node) as (per_node, where):
            console.print(f"[bold]cluster[/bold]: {where}", highlight=False)
            settings = replace(settings, gpus_per_node=per_node)
            summary = run_tune(recipe, settings, args.config, console, cancel)
    except (ConfigError, LayoutError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except RunFailure as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        cancel.set()
        print(
            "interrupted: every run was stopped and its GPUs released; what was measured is in "
            "the store; run the same command again to resume",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED
    if args.json:
        print(
            json.dumps(
                {
                    "pick": summary.pick,
                    "flags": list(summary.flags),
                    "study": summary.study,
                    "report_dir": str(settings.report_dir),
                }
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
