"""The training loop's pieces that need no world: synthetic batches, the loss, the mean losses
of a step and the memory line (which the product's parser reads)."""

from __future__ import annotations

import torch

from launchers.emulated.config import run_config
from launchers.megatron_core.core_training import (
    _loss,
    _mean_losses,
    _memory_text,
    synthetic_batches,
)
from ray_layout.measure.logs import parse_log
from ray_layout.model.layout import Layout
from tests.helpers.megatron_core_ranks import core_arguments


def _run():
    return run_config(core_arguments(Layout.parse("Ett|t*2mL", 2), iterations=1), 2)


def test_the_same_seed_gives_every_stage_the_same_batches():
    run = _run()
    first, second = synthetic_batches(run, 7), synthetic_batches(run, 7)
    a, b = next(first), next(second)
    assert torch.equal(a["tokens"], b["tokens"])
    assert a["tokens"].shape == (run.parallel.micro_batch_size, run.model.seq_length)
    assert torch.equal(a["labels"][:, :-1], a["tokens"][:, 1:])
    assert a["attention_mask"].dtype == torch.bool and a["attention_mask"][0, 0, 0, 1]


def test_the_loss_reports_its_sum_and_tokens_and_the_step_mean_is_per_token():
    loss, tokens, report = _loss(torch.ones(1, 4), torch.full((1, 4), 2.0))
    assert float(loss) == 8.0 and int(tokens) == 4
    assert _mean_losses([report, report]) == {"lm loss": 2.0}


def test_the_memory_line_is_megatrons():
    parsed = parse_log(_memory_text(3, 1) + "\n")
    line = parsed.memory[0]
    assert line.rank == 3 and line.max_allocated_mb >= line.allocated_mb > 0
