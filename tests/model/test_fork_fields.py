"""The forks' model fields checked together (``fork_fields.py``), through ``build_recipe`` as the
project's schema takes them: per-MoE-layer experts, the MoE block and PR-MoE, no-op layers, the
shared expert's gate; each bad one a line naming it."""

from __future__ import annotations

import pytest

from ray_layout.errors import ConfigError
from ray_layout.model.spec import build_recipe

BASE = {
    "num_layers": 4,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "seq_length": 128,
    "vocab_size": 1000,
    "num_experts": 8,
    "moe_router_topk": 1,
    "moe_layer_freq": 2,
}


def build(**fields):
    return build_recipe(BASE | fields, source="c.yaml").model


def test_per_layer_experts_are_kept_where_they_differ():
    model = build(moe_layer_experts=[4, 8], moe_block="deepspeed", moe_residual=True)
    assert model.experts_per_layer == (4, 0, 8, 0)
    assert build(moe_layer_experts=[8, 8]).moe_layer_experts == ()  # all alike: num_experts


def test_no_op_layers_are_sorted():
    assert build(noop_layers=[3, 1]).noop_layers == (1, 3)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"moe_layer_experts": [4, 8, 8]}, "has 3 entries for 2 MoE layers"),
        ({"moe_layer_experts": [4, 4]}, "num_experts 8 is not the largest"),
        ({"moe_layer_experts": [0, 8]}, "entries must be integers in [1,"),
        ({"moe_router_topk": 5, "moe_layer_experts": [4, 8]}, "more than a layer's 4 experts"),
        ({"moe_block": "tutel"}, "moe_block must be megatron or deepspeed"),
        ({"moe_residual": True}, "needs moe_block deepspeed"),
        ({"moe_shared_expert_gate": True}, "without a shared expert"),
        ({"noop_layers": [4]}, "noop_layers entries must be integers in [0, 3]"),
        ({"noop_layers": [1, 1]}, "names a layer twice"),
        ({"noop_layers": "1,2"}, "noop_layers must be a list of integers"),
    ],
)
def test_a_bad_fork_field_is_one_line(fields, message):
    with pytest.raises(ConfigError, match=r"^c\.yaml: ") as info:
        build(**fields)
    assert message in str(info.value)


def test_a_dense_model_takes_no_moe_fork_fields():
    with pytest.raises(ConfigError, match="moe_residual set but num_experts is 0"):
        build_recipe(BASE | {"num_experts": 0, "moe_layer_freq": None, "moe_router_topk": 0,
                             "moe_residual": True}, source="c.yaml")  # fmt: skip
