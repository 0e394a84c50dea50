"""What the command tests share: the configs they run, and a command's ``--json`` in-process."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from ray_layout.commands import common
from ray_layout.commands.main import main
from ray_layout.model.split import PipelineSplit

HANDBOOK = "configs/handbook_7b_a1b.yaml"
DEEPSEEK = "tests/data/hf/DeepSeek-V3/config.json"
COSTS = "configs/costs/handbook_h200_example.json"
SCRIPT = "tests/data/train_moe_16l.sh"
CURRENT = "Et*3|t*5|t*5|t*3mL"  # a layout a user might run today (no other baseline's)


def handbook_plan(*options: str, costs: str = COSTS) -> list[str]:
    """``plan`` of the handbook recipe on PP 4 with ``costs`` (the example's), then ``options``."""
    return ["plan", HANDBOOK, "--pp", "4", "--costs", costs, *options]


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    """``python -m ray_layout ARGV --json``, which must succeed, as parsed JSON."""
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def with_split(monkeypatch: pytest.MonkeyPatch, **split: Any) -> None:
    """Every command loads the config as a launch script stating this split would."""
    load = common.load_recipe

    def load_with_split(*args: Any, **kwargs: Any) -> Any:
        return replace(load(*args, **kwargs), split=PipelineSplit(**split))

    monkeypatch.setattr(common, "load_recipe", load_with_split)
