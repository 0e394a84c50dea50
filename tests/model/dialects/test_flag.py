"""A fork's flag as a table row (``dialects/flag.py``): its argparse entry, and the names that
speak of the model's shape."""

from __future__ import annotations

import pytest

from ray_layout.model.dialects.flag import looks_like_shape, passed, refused, sized


def test_an_entry_walks_as_argparse_would():
    assert sized("--num-experts", "ints", "m").entry() | {"flags": None} == {
        "flags": None,
        "dest": "num_experts",
        "nargs": "+",
        "type": "int",
        "choices": None,
        "default": None,
    }
    assert passed("--seq-aux", "switch", "m").entry()["nargs"] == 0
    assert refused("--x-y", "str", "m", dest="z").key == "z"
    assert sized("--mlp-type", "str", "m", choices=("a", "b")).entry()["choices"] == ["a", "b"]


@pytest.mark.parametrize(
    ("flag", "shaped"),
    [
        ("--extra-hidden-width", True),
        ("--num-experts-per-group", True),
        ("--lora-r", True),
        ("--moe-comm-aux-loss-coeff", False),  # routing, not the shape
        ("--cpu-offloading-num-layers", True),
        ("--recompute-norm-num-layers", False),  # recomputation: never the model's size
        ("--log-num-zeros-in-grad", False),
        ("--npu-magic-switch", False),
        ("--use-fused-rmsnorm", False),
    ],
)
def test_names_that_speak_of_the_shape(flag, shaped):
    assert looks_like_shape(flag) is shaped
