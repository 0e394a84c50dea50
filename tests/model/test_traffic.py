"""The bytes a FLOP guess moves: the EP all-to-alls of a MoE layer."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ray_layout.model.costs import costs_from_flops
from ray_layout.model.spec import load_recipe_file
from ray_layout.model.traffic import a2a_ms

HANDBOOK = load_recipe_file("configs/handbook_7b_a1b.yaml")


def test_the_all_to_all_prior_moves_each_gpus_routed_tokens_over_its_links():
    """bf16 rows of b x s / (TP x CP) tokens to top-k experts, (EP - 1)/EP of them away: on the
    node's links while the EP group fits a node, mostly over the network past it."""
    model = HANDBOOK.model
    row = 2 * model.hidden_size * model.moe_router_topk * model.seq_length
    for ep, tp, expected_gb_per_s in ((8, 1, 150.0), (4, 2, 150.0)):
        parallel = replace(HANDBOOK.parallel, ep=ep, tp=tp, micro_batch_size=1)
        sent = row / tp * (ep - 1) / ep
        assert a2a_ms(model, parallel, 150.0, 25.0) == pytest.approx(
            sent / (expected_gb_per_s * 1e9) * 1e3
        )
    wide = replace(HANDBOOK.parallel, ep=64, tp=1, micro_batch_size=1)
    on_node = 7 / 63  # 7 of 63 peers share the node
    expected = row * 63 / 64 * (on_node / 150e9 + (1 - on_node) / 25e9) * 1e3
    assert a2a_ms(model, wide, 150.0, 25.0) == pytest.approx(expected)
    assert a2a_ms(model, replace(wide, ep=1), 150.0, 25.0) == 0.0
    costs = costs_from_flops(model, wide)
    plain = costs_from_flops(model, replace(wide, ep=1))
    assert costs.forward_ms["t"] - plain.forward_ms["t"] == pytest.approx(2 * costs.a2a_ms)
    assert costs.forward_ms["L"] == plain.forward_ms["L"]
