"""The job's flags, parsed once with the recipe: what each schedule and memory flag means to the
models, Megatron's defaults where a flag is absent, and a refused value at load."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ray_layout.errors import ConfigError
from ray_layout.model.job_flags import EpOverlap, JobFlags, job_flags
from ray_layout.model.spec import load_recipe_file


def test_no_flags_mean_megatrons_defaults():
    assert job_flags([]) == JobFlags()
    assert job_flags([]).p2p_overlap  # overlap_p2p_comm is on unless turned off


def test_the_jobs_flags_select_the_p2p_mode_and_name_what_is_not_simulated():
    assert not job_flags(["--no-overlap-p2p-communication"]).p2p_overlap
    assert job_flags(["--no-overlap-p2p-communication"]).unsimulated == ()
    combined = job_flags(["--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute"])
    assert combined.ep_overlap == EpOverlap(on=True, delay_wgrad=True)
    assert combined.unsimulated == ()
    (note,) = job_flags(["--overlap-p2p-communication-warmup-flush"]).unsimulated
    assert "warm-up" in note


def test_memory_flags_are_read_with_the_rest():
    full = ["--recompute-granularity", "full", "--recompute-method", "block"]
    memory = job_flags([*full, "--recompute-num-layers", "2"]).memory
    assert (memory.recompute_granularity, memory.recompute_method) == ("full", "block")
    assert memory.recompute_num_layers == 2


def test_a_recipe_carries_its_flags_and_keeps_them_true_through_replace():
    recipe = load_recipe_file("configs/tiny_moe_mtp.yaml")
    assert recipe.flags == job_flags(recipe.megatron_args)
    selective = replace(recipe, megatron_args=("--recompute-activations",))
    assert selective.flags.memory.recompute_granularity == "selective"
    assert replace(selective, megatron_args=()).flags.memory.recompute_granularity is None


def test_a_value_megatron_refuses_is_one_line_when_the_recipe_is_built():
    recipe = load_recipe_file("configs/tiny_moe_mtp.yaml")
    with pytest.raises(ConfigError, match="needs --recompute-method"):
        replace(recipe, megatron_args=("--recompute-granularity", "full"))
