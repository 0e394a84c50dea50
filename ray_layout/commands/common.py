"""What every command shares: the one-line error parser, the parallel flags, the recipe."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace

from ray_layout.errors import EXIT_BAD_INPUT, ConfigError
from ray_layout.model.loading import load_recipe
from ray_layout.model.spec import Recipe, with_parallel


class OneLineErrorParser(argparse.ArgumentParser):
    """Usage mistakes end in one line naming the problem (and exit 2), like every other error."""

    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"error: {self.prog}: {message} (see --help)", file=sys.stderr)
        raise SystemExit(EXIT_BAD_INPUT)


def add_parallel_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("parallel sizes (override the config's)")
    for flag in ("tp", "pp", "vpp", "cp", "ep", "etp", "dp"):
        group.add_argument(f"--{flag}", type=int, help=f"{flag.upper()} size")
    group.add_argument("--micro-batch-size", type=int)
    group.add_argument("--global-batch-size", type=int)
    parser.add_argument("--seq-length", type=int, help="training sequence length override")


def recipe_from_args(args: argparse.Namespace) -> Recipe:
    recipe = load_recipe(args.config)
    overrides = {
        "tp": args.tp,
        "pp": args.pp,
        "vpp": args.vpp,
        "cp": args.cp,
        "ep": args.ep,
        "etp": args.etp,
        "dp": args.dp,
        "micro_batch_size": args.micro_batch_size,
        "global_batch_size": args.global_batch_size,
    }
    if args.seq_length is not None:
        if args.seq_length < 1:
            raise ConfigError(f"--seq-length must be >= 1, got {args.seq_length}")
        recipe = replace(recipe, model=replace(recipe.model, seq_length=args.seq_length))
    return with_parallel(recipe, **overrides)
