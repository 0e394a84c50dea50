"""An emulated rank's command line: Megatron's default split and DP from the world size, and
every input Megatron would refuse refused in one line."""

from __future__ import annotations

import re

import pytest

from launchers.emulated.config import run_config
from ray_layout.errors import InputError
from tests.helpers.launchers_emulated import HANDBOOK

INTERLEAVED = ["--pipeline-model-parallel-layout", "Et*2|t*2|t*2|t*2|t*2|t*2|t*2|t*2mL"]
GROUP = "--microbatch-group-size-per-virtual-pipeline-stage"


def test_command_line_gives_megatron_default_and_world_dp():
    config = run_config([*HANDBOOK, "--global-batch-size", "32"], world_size=8)
    assert str(config.layout) == "Et*4|t*4|t*4|t*4mL"
    assert (config.parallel.dp, config.num_microbatches) == (2, 8)
    given = run_config([*HANDBOOK, "--pipeline-model-parallel-layout", "Et*5|t*6|t*5|mL"], 4)
    assert str(given.layout) == "Et*5|t*6|t*5|mL" and not given.layout.mtp_standalone


def test_virtual_stages_without_a_layout_give_megatrons_interleaved_default():
    config = run_config([*HANDBOOK, "--num-virtual-stages-per-pipeline-rank", "2"], 4)
    assert str(config.layout) == "Ett|(tt|)*6t*2mL"
    assert (config.parallel.vpp, config.group_size, config.num_microbatches) == (2, 4, 8)
    assert run_config([*INTERLEAVED, *HANDBOOK, GROUP, "8"], 4).group_size == 8


def test_the_settings_megatron_defaults_are_kept():
    config = run_config(HANDBOOK, 4)
    assert (config.train_iters, config.log_interval, config.global_batch_size) == (4, 1, 16)
    assert (config.timing_log_level, config.timing_log_option) == (2, "all")
    assert config.barrier_with_l1_time and config.log_throughput
    assert config.learning_rate == 1e-4  # no --lr: the emulator's own, Megatron has none
    quiet = run_config([*HANDBOOK, "--no-barrier-with-level-1-timing", "--lr", "3e-4"], 4)
    assert not quiet.barrier_with_l1_time and quiet.learning_rate == 3e-4


@pytest.mark.parametrize(
    ("extra", "world_size", "message"),
    [
        (["--train-iters", "0"], 4, "--train-iters N (N >= 1) is needed"),
        (["--log-interval", "0"], 4, "--log-interval must be >= 1"),
        ([], 6, "WORLD_SIZE 6 is not divisible by TP·CP·PP = 4"),
        (["--no-such-flag"], 4, "unknown Megatron flag --no-such-flag"),
        (["stray"], 4, "argument 'stray' is not a flag"),
        (
            [*INTERLEAVED, GROUP, "3"],
            4,
            "PP (4) <= micro-batch group size (3) <= micro-batches (8)",
        ),
        ([*INTERLEAVED, GROUP, "6"], 4, "the last micro-batch group (2) is smaller than PP (4)"),
        (
            [*INTERLEAVED, "--num-virtual-stages-per-pipeline-rank", "2"],
            4,
            "at most one of --pipeline-model-parallel-layout, --num-virtual-stages-per",
        ),
        (
            ["--pipeline-model-parallel-layout", "Et*4|t*4|t*4|t*5mL"],
            4,
            "layout has 17 decoder layers t, the model has 16",
        ),
    ],
)
def test_what_megatron_refuses_is_one_line(extra, world_size, message):
    with pytest.raises(InputError, match=re.escape(message)) as info:
        run_config([*HANDBOOK, *extra], world_size)
    assert "\n" not in str(info.value) and str(info.value).startswith("pretrain_gpt.py arguments")


def test_interleaving_overlaps_p2p_unless_the_command_line_turns_it_off():
    """Megatron's default: ``overlap_p2p_comm`` on, and off without interleaving."""
    interleaved = [*HANDBOOK, "--num-virtual-stages-per-pipeline-rank", "2"]
    assert run_config(interleaved, 4).p2p_overlap
    assert not run_config([*interleaved, "--no-overlap-p2p-communication"], 4).p2p_overlap
    assert not run_config(HANDBOOK, 4).p2p_overlap
