"""``python -m ray_layout``: every command but the tune, each from its own module."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ray_layout.commands.common import Command, OneLineErrorParser, command_line
from ray_layout.commands.flags import add_flags
from ray_layout.commands.layouts import LAYOUTS
from ray_layout.commands.measure import FIT, INGEST, PROFILE_LAYOUTS
from ray_layout.commands.megatron_command import MEGATRON_COMMAND
from ray_layout.commands.plan import PLAN
from ray_layout.commands.profile import PROFILE
from ray_layout.commands.simulate import SIMULATE
from ray_layout.commands.size import SIZE
from ray_layout.commands.store_rm import STORE
from ray_layout.commands.validate import VALIDATE

COMMANDS: tuple[Command, ...] = (
    SIZE,
    LAYOUTS,
    VALIDATE,
    PLAN,
    PROFILE_LAYOUTS,
    INGEST,
    FIT,
    STORE,
    PROFILE,
    SIMULATE,
    MEGATRON_COMMAND,
)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrorParser(
        prog="python -m ray_layout",
        description="Plan Megatron-LM pipeline layouts for MoE + MTP models.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:  # in this order in --help
        add_flags(subparsers.add_parser(command.name, help=command.help), command.settings)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The command line's exit status (``--help`` and usage errors included: no ``SystemExit``)."""
    words = sys.argv[1:] if argv is None else argv
    by_name = {command.name: command for command in COMMANDS}
    return command_line(build_parser(), words, lambda args: by_name[args.command])
