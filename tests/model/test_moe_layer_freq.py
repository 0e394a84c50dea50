"""``--moe-layer-freq`` read as Megatron reads it (``moe_layer_freq.py``; more cases, and
hostile expressions, in ``test_spec.py``): an int, a list, or a list expression."""

from __future__ import annotations

import pytest

from ray_layout.errors import ConfigError
from ray_layout.model.moe_layer_freq import parse_moe_layer_freq


@pytest.mark.parametrize(
    ("value", "pattern"),
    [
        (1, (True,) * 4),
        (2, (True, False, True, False)),
        ("([0]*1+[1]*3)", (False, True, True, True)),
        ([0, 1, 0, 1], (False, True, False, True)),
        ("3", (True, False, False, True)),
    ],
)
def test_int_list_and_expression(value, pattern):
    assert parse_moe_layer_freq(value, 4, source="t") == pattern


def test_a_pattern_of_the_wrong_length_is_one_line():
    with pytest.raises(ConfigError, match="t: moe_layer_freq has 3 entries but num_layers is 4"):
        parse_moe_layer_freq("[1]*3", 4, source="t")
