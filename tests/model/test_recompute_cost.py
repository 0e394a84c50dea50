"""What recomputation costs: each module's FLOP share of a layer, the shares each setting re-runs
per unit (whole layers under full recompute, each chunk's first layers under block, MTP as
megatron-core treats it), and a stage's recomputed milliseconds."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ray_layout.model.hf_config import load_hf_config
from ray_layout.model.memory_settings import PLAIN, RECOMPUTE_MODULES, memory_settings
from ray_layout.model.recompute_cost import (
    ELEMENTWISE_FLOPS,
    MODULE_PARTS,
    module_flops,
    recompute_shares,
    stage_recompute_ms,
)
from ray_layout.model.sizing import decoder_flops_per_token
from ray_layout.model.spec import load_recipe_file

V3 = load_hf_config("tests/data/hf/DeepSeek-V3/config.json", seq_length=4096).model
HANDBOOK = load_recipe_file("configs/handbook_7b_a1b.yaml").model
DENSE = replace(V3, moe_layer_pattern=(False,) * V3.num_layers, mla=None, mtp_num_layers=0)
SELECTIVE = ["--recompute-granularity", "selective", "--recompute-modules"]


def full(method: str, layers: int) -> list[str]:
    return ["--recompute-granularity", "full", "--recompute-method", method,
            "--recompute-num-layers", str(layers)]  # fmt: skip


@pytest.mark.parametrize("model", [V3, HANDBOOK, DENSE], ids=["V3", "handbook", "dense"])
@pytest.mark.parametrize("moe", [False, True])
def test_a_layers_parts_add_up_to_sizings_flops_and_its_elementwise_work(model, moe):
    parts = module_flops(model, moe)
    elementwise = {"norms", "dense_act", "routed_act", "shared_act", "router"}
    assert sum(v for k, v in parts.items() if k not in elementwise) == pytest.approx(
        decoder_flops_per_token(model, moe)
    )
    assert parts["norms"] == 2 * ELEMENTWISE_FLOPS * model.hidden_size
    assert all(value >= 0 for value in parts.values())
    assert (parts["mla_up_proj"] > 0) == (model.mla is not None)
    assert set(MODULE_PARTS) == RECOMPUTE_MODULES  # every module Megatron accepts is priced


def test_no_recompute_re_runs_nothing():
    shares = recompute_shares(V3, PLAIN)
    forward = {"E": 1.0, "t_dense": 10.0, "t_moe": 20.0}
    assert not shares.any and stage_recompute_ms(list(forward), forward, shares) == 0.0


def test_full_uniform_re_runs_every_layer_and_mtp_whole_and_block_only_decoder_layers():
    uniform = recompute_shares(V3, memory_settings(full("uniform", 1)))
    assert dict(uniform.every) == {"t_dense": 1.0, "t_moe": 1.0, "m": 1.0}
    block = recompute_shares(V3, memory_settings(full("block", 2)))
    # multi_token_prediction.py: "recompute_method == 'block' is not supported for MTP yet"
    assert dict(block.block) == {"t_dense": 1.0, "t_moe": 1.0} and block.block_layers == 2
    assert not block.every


def test_block_recompute_re_runs_a_stages_first_layers_in_model_order():
    forward = {"E": 1.0, "t_dense": 10.0, "t_moe": 20.0, "m": 30.0, "L": 40.0}
    shares = recompute_shares(V3, memory_settings(full("block", 2)))
    assert stage_recompute_ms(["E", "t_dense", "t_moe", "t_moe"], forward, shares) == 30.0
    assert stage_recompute_ms(["t_moe", "m", "L"], forward, shares) == 20.0
    assert stage_recompute_ms(["m", "L"], forward, shares) == 0.0


@given(st.sets(st.sampled_from(sorted(RECOMPUTE_MODULES)), min_size=1), st.data())
def test_selective_shares_grow_with_the_modules_and_stay_below_a_whole_layer(modules, data):
    fewer = data.draw(st.sets(st.sampled_from(sorted(modules))))
    more = recompute_shares(V3, memory_settings([*SELECTIVE, *sorted(modules)]))
    less = recompute_shares(V3, memory_settings([*SELECTIVE, *sorted(fewer)] if fewer else []))
    for unit in ("t_dense", "t_moe", "m"):
        assert 0 <= less.every.get(unit, 0.0) <= more.every[unit] < 1.0


def test_core_attention_and_the_experts_activation_cost_what_their_flops_say():
    shares = recompute_shares(V3, memory_settings([*SELECTIVE, "core_attn", "moe_act"]))
    parts = module_flops(V3, True)
    assert shares.every["t_moe"] == pytest.approx(
        (parts["core_attn"] + parts["routed_act"]) / sum(parts.values())
    )
    assert 0 < shares.every["m"] < shares.every["t_moe"]  # MTP's projection is not re-run
    dense_only = recompute_shares(V3, memory_settings([*SELECTIVE, "mlp"]))
    assert dense_only.every["t_moe"] == 0 and dense_only.every["t_dense"] > 0.5
