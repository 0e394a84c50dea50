"""What ``plan``, ``simulate`` and ``profile-layouts`` share (``commands/searching.py``): the
unit costs (a COSTS.json of this shape, or FLOPs at ``--tflops``), the micro-batch count and the
bounds that refuse run-away work before it starts."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ray_layout.commands.main import main
from ray_layout.commands.searching import (
    check_sampled_work,
    check_search_size,
    largest_stage,
    microbatch_count,
    unchecked_memory_note,
    unusable_costs,
)
from ray_layout.errors import ConfigError, LayoutError
from ray_layout.model.costs import load_costs
from ray_layout.model.loading import load_recipe
from ray_layout.model.megatron_recipe import Overrides
from ray_layout.model.spec import Recipe
from tests.helpers.commands_cli import COSTS, DEEPSEEK, HANDBOOK, handbook_plan, run_json


def test_costs_of_another_shape_are_refused_unless_allowed(capsys):
    argv = [
        "plan",
        HANDBOOK,
        "--pp",
        "4",
        "--ep",
        "4",
        "--dp",
        "4",
        "--costs",
        COSTS,
        "--hbm-gb",
        "131",
        "--top",
        "1",
        "--samples",
        "8",
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "measured on another shape: ep 2 (costs) vs 4 (recipe)" in err
    assert main([*argv, "--allow-cost-mismatch"]) == 0
    assert "warning: " in capsys.readouterr().err


def test_plan_with_flops_costs_warns(capsys):
    assert main(handbook_plan("--top", "1", "--samples", "8", "--json", costs="flops")) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["candidates"]
    assert "measured costs differ" in captured.err


def test_tflops_sets_the_speed_flop_costs_assume(capsys):
    argv = ["simulate", HANDBOOK, "Et*5|t*6|t*5|mL", "--costs", "flops", "--samples", "8"]
    default = run_json(capsys, *argv)
    assert main([*argv, "--tflops", "200", "--json"]) == 0
    captured = capsys.readouterr()
    assert "at 200 TFLOP/s per GPU (--tflops)" in captured.err
    compute = sum(json.loads(captured.out)["busy_ms"]), sum(default["busy_ms"])
    # FLOPs take twice as long; the embedding's bytes and the EP all-to-alls do not
    assert 1.6 * compute[1] < compute[0] < 2 * compute[1]
    for bad in ("0", "-5", "1e-300", "5e4"):  # past what any GPU achieves
        assert main([*argv, "--tflops", bad]) == 2
        assert capsys.readouterr().err.startswith("error: --tflops must be")
    assert main([*argv, "--tflops", "nan"]) == 2  # no number at all: a usage mistake
    assert "argument --tflops: must be a decimal number" in capsys.readouterr().err
    assert main(["profile-layouts", HANDBOOK, "--pp", "4", "--tflops", "150", "--json"]) == 0


def recipe_with(**sizes: int) -> Recipe:
    """The handbook config at other sizes, as the flags would give it."""
    return load_recipe(HANDBOOK, Overrides(sizes=sizes))


def test_the_micro_batches_are_the_flags_else_the_global_batchs_and_fit_the_schedule():
    assert microbatch_count(recipe_with(), None) == 128 // (2 * 2)  # global / (micro x DP)
    assert microbatch_count(recipe_with(), 12) == 12
    unknown = load_recipe(DEEPSEEK)  # an HF config states no batch
    with pytest.raises(ConfigError, match="number of micro-batches is unknown: give"):
        microbatch_count(unknown, None)
    with pytest.raises(ConfigError, match="between 1 and 16,384"):
        microbatch_count(recipe_with(), 0)
    with pytest.raises(ConfigError, match="forward passes per step, more than the 16,384"):
        microbatch_count(recipe_with(pp=16, dp=1, ep=1), 2048)
    blocking = replace(recipe_with(pp=2, vpp=2), megatron_args=("--no-overlap-p2p-communication",))
    with pytest.raises(LayoutError, match="needs PP > 2 without p2p overlap"):
        microbatch_count(blocking, 8)
    assert microbatch_count(recipe_with(pp=2, vpp=2), 8) == 8  # Megatron's default overlap


@pytest.mark.parametrize("group_size", [None, 4, 8])
def test_an_interleaved_step_takes_whole_groups_of_micro_batches(group_size):
    """Megatron's interleaved schedule takes micro-batches in groups (of PP unless given)."""
    assert microbatch_count(recipe_with(vpp=2), 16, group_size) == 16
    with pytest.raises(ConfigError, match="interleaving needs micro-batches"):
        microbatch_count(recipe_with(vpp=2), 3, group_size)


@pytest.mark.parametrize(
    ("microbatches", "group_size", "rule"),
    [
        (6, None, "6 micro-batches in groups of 4 leave 2, fewer than PP=4"),
        (7, 4, "leave 3, fewer than PP=4: Megatron requires the remainder to be 0 or >= PP"),
        (6, 8, "group of the interleaved schedule (8, --microbatch-group-size-per-virtual"),
    ],
)
def test_a_step_megatrons_interleaved_schedule_refuses_names_the_rule(
    microbatches, group_size, rule
):
    with pytest.raises(ConfigError) as refused:
        microbatch_count(recipe_with(vpp=2), microbatches, group_size)
    assert rule in str(refused.value) and "\n" not in str(refused.value)


def test_searches_and_samples_that_would_take_gigabytes_are_refused_before_they_start():
    check_search_size(recipe_with(pp=16, vpp=1))  # 16 x 16: nothing near the bound
    deep = load_recipe(DEEPSEEK, Overrides(sizes={"pp": 16, "vpp": 32}))
    with pytest.raises(ConfigError, match=r"61 decoder layers x PP 16 x VPP 32 = 31,232 layer"):
        check_search_size(deep)
    check_sampled_work(recipe_with(), 32, 256)
    with pytest.raises(ConfigError, match=r"--samples 100,000 x 32 micro-batches x PP 4"):
        check_sampled_work(recipe_with(), 32, 100_000)


def test_costs_that_would_break_the_arithmetic_are_named():
    costs = load_costs(COSTS)
    assert unusable_costs(costs) is None
    huge = replace(costs, forward_ms={**costs.forward_ms, "t": 1e9})
    assert unusable_costs(huge) == "forward_ms.t must be <= 1e+07, got 1e+09"
    idle = replace(
        costs,
        forward_ms={**costs.forward_ms, "t": 0.0},
        backward_ms={**costs.backward_ms, "t": 0.0},
    )
    assert unusable_costs(idle) == "decoder unit(s) t take 0 ms forward and backward"
    free_output = replace(
        costs,
        forward_ms={**costs.forward_ms, "L": 0.0},
        backward_ms={**costs.backward_ms, "L": 0.0},
    )
    assert unusable_costs(free_output) is None  # only a layer that takes no time divides by 0


def test_unusable_costs_are_refused_with_the_files_name(capsys, tmp_path):
    costs = json.loads(Path(COSTS).read_text())
    costs["backward_ms"]["t"] = 1e300
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps(costs))
    assert main(["simulate", HANDBOOK, "Et*5|t*6|t*5|mL", "--costs", str(broken)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {broken}: backward_ms.t must be ") and "1e+07" in err
    assert err.count("\n") == 1


@pytest.mark.parametrize(
    ("peak", "where"),
    [
        (79.5, "fits 80 GiB (A100/H100), 141 GiB (H200), 192 GiB (B200)"),
        (141.0, "fits 141 GiB (H200), 192 GiB (B200)"),
        (150.0, "fits 192 GiB (B200)"),
        (193.0, "fits none of 80, 141 or 192 GiB"),
    ],
)
def test_without_hbm_the_note_says_which_common_gpus_the_largest_stage_fits(peak, where):
    memory = [10.0, peak, peak - 1, 3.0]
    assert largest_stage(memory) == (1, peak)
    note = unchecked_memory_note(memory)
    assert note.startswith("memory not checked (no --hbm-gb): the largest stage needs ")
    assert note.endswith(f"GiB (PP rank 1), which {where}")


@given(st.lists(st.floats(0, 1e4, allow_nan=False), min_size=1, max_size=64))
def test_the_largest_stage_is_the_first_with_the_most_memory(memory):
    rank, peak = largest_stage(memory)
    assert peak == max(memory) and rank == memory.index(peak)


def test_a_megatron_deepspeed_job_is_not_searched_and_says_who_splits_it(capsys):
    """DeepSpeed's pipeline engine takes no layout flag: plan says so in one line, with the
    layers its partition_method 'type:transformer' gives each stage."""
    text = (
        "deepspeed pretrain_gpt.py --num-layers 24 --hidden-size 64 --num-attention-heads 4 "
        "--seq-length 64 --max-position-embeddings 64 --num-experts 8 --deepspeed "
        "--global-batch-size 64"
    )
    code = main(["plan", text, "--vocab-size", "1000", "--pp", "4", "--costs", "flops"])
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 2
    assert line == (
        "error: Megatron-DeepSpeed takes no --pipeline-model-parallel-layout: DeepSpeed's "
        "pipeline engine splits the layers by its partition_method 'type:transformer' "
        "(GPTModelPipe); layers per stage: 6, 6, 6, 6"
    )
