"""DeepSpeed's pipeline partition (``dialects/deepspeed_partition.py``): the uniform and balanced
splits worked by hand, and the decoder layers GPTModelPipe's 'type:transformer' gives each
stage."""

from __future__ import annotations

import pytest

from ray_layout.model.dialects.deepspeed_partition import (
    deepspeed_layout,
    partition_balanced,
    partition_uniform,
    transformer_layers_per_stage,
)


@pytest.mark.parametrize(
    ("items", "parts", "bounds"),
    [
        (10, 3, [0, 4, 7, 10]),  # the first 10 % 3 runs one longer
        (9, 3, [0, 3, 6, 9]),
        (2, 4, [0, 1, 2, 2, 2]),  # fewer items than parts: one a run, then empty
    ],
)
def test_uniform(items, parts, bounds):
    assert partition_uniform(items, parts) == bounds


def test_balanced_makes_the_runs_closest():
    assert partition_balanced([1, 1, 1, 1], 2) == [0, 2, 4]
    assert partition_balanced([5, 1, 1, 1, 1, 1], 2) == [0, 1, 6]  # 5 | 5
    assert partition_balanced([3, 1, 1, 1, 2, 2], 3) == [0, 1, 4, 6]  # 3 | 3 | 4
    assert partition_balanced([1, 2], 4) == partition_uniform(2, 4)


def test_ties_take_the_last_split_point():
    """DeepSpeed keeps a split of equal cost found later (its ``>=``): zero-weight items (the
    embedding, the norm) go with the earlier run."""
    assert partition_balanced([1, 0, 1], 2) == [0, 2, 3]  # 1 | 0 1 and 1 0 | 1 cost alike


@pytest.mark.parametrize(
    ("layers", "stages", "moe", "counts"),
    [
        (24, 4, True, [6, 6, 6, 6]),
        (30, 4, False, [8, 8, 7, 7]),
        (21, 4, True, [6, 5, 5, 5]),
        (2, 4, False, [1, 1, 0, 0]),
    ],
)
def test_transformer_layers_per_stage(layers, stages, moe, counts):
    assert transformer_layers_per_stage(layers, stages, moe) == counts
    assert sum(counts) == layers


def test_the_stages_as_a_layout():
    assert deepspeed_layout([6, 5, 1]) == "Et*6|t*5|tL"
