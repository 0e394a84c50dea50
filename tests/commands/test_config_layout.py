"""The layout ``size`` and ``simulate`` fall back on: the config's split, else Megatron's default
(shaped by the split flags), else (where asked) the count-based rule, with where it came from."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ray_layout.commands.config_layout import CURRENT_SOURCE, NOTE, config_layout
from ray_layout.commands.main import main
from ray_layout.errors import LayoutError
from ray_layout.model.baselines import BaselineName, count_based
from ray_layout.model.loading import load_recipe
from ray_layout.model.megatron_recipe import Overrides
from ray_layout.model.split import PipelineSplit
from tests.helpers.commands_cli import COSTS, CURRENT, DEEPSEEK, HANDBOOK, run_json, with_split


def test_size_and_simulate_show_the_configs_current_layout(capsys, monkeypatch):
    simulate = ["simulate", HANDBOOK, "--costs", COSTS, "--samples", "8"]
    report = run_json(capsys, *simulate)
    assert report["layout"] == "Et*4|t*4|t*4|t*4mL"
    assert report["layout_source"] == "Megatron default"
    with_split(monkeypatch, last_stage_layers=13)  # Megatron's default, shaped by the flag
    report = run_json(capsys, "size", HANDBOOK, "--pp", "4")
    assert report["layout"] == "Et|t|t|t*13mL"
    assert report["layout_source"] == "current (the config's split)"
    with_split(monkeypatch, layout=CURRENT)
    report = run_json(capsys, *simulate)
    assert report["layout"] == CURRENT and report["layout_source"].startswith("current")
    assert main(simulate) == 0
    assert f"{CURRENT} (current (the config's split)): mean" in capsys.readouterr().out
    # a --pp the config's layout cannot run: Megatron's default, and why
    report = run_json(capsys, "size", HANDBOOK, "--pp", "8")
    assert report["layout"] == "Ett|(tt|)*6t*2mL"
    assert report["layout_source"].startswith("Megatron default; the config's split does not")


DEEPSEEK_PP16 = Overrides(sizes={"pp": 16, "ep": 8, "dp": 8})


def test_a_config_without_a_split_runs_megatrons_default():
    layout, source = config_layout(load_recipe(HANDBOOK))
    assert (str(layout), source) == ("Et*4|t*4|t*4|t*4mL", BaselineName.DEFAULT.value)


def test_the_configs_own_layout_string_comes_first():
    recipe = replace(load_recipe(HANDBOOK), split=PipelineSplit(layout=CURRENT))
    layout, source = config_layout(recipe, count_fallback=True)
    assert (str(layout), source) == (CURRENT, CURRENT_SOURCE)


def test_where_megatron_has_no_default_only_a_caller_that_asks_gets_the_count_based_rule():
    recipe = load_recipe(DEEPSEEK, DEEPSEEK_PP16)
    with pytest.raises(LayoutError, match="not divisible by PP=16"):
        config_layout(recipe)
    layout, source = config_layout(recipe, count_fallback=True)
    assert layout == count_based(61, recipe.model.mtp_num_layers, 16, 1)
    name, _, why = source.partition(NOTE)  # size prints the name, and the why as a caption
    assert name == BaselineName.COUNT_BASED.value and "not divisible by PP=16" in why


def test_a_split_this_pp_cannot_run_is_passed_over_with_its_reason():
    """Split flags Megatron refuses at this PP: neither they nor the default they shape apply."""
    split = PipelineSplit(first_stage_layers=3, last_stage_layers=3)
    recipe = replace(load_recipe(DEEPSEEK, DEEPSEEK_PP16), split=split)
    layout, source = config_layout(recipe, count_fallback=True)
    assert layout == count_based(61, recipe.model.mtp_num_layers, 16, 1)
    name, _, why = source.partition(NOTE)
    assert name == BaselineName.COUNT_BASED.value
    assert why.startswith("the config's split does not apply: 55 remaining decoder layers")
    assert why.count("55 remaining decoder layers cannot be split evenly") == 1  # said once
