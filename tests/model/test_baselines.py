"""Megatron's default split against megatron-core's own layer counting, and the count rule."""

from __future__ import annotations

import pytest

from ray_layout.ab.vocabulary import ArmRole
from ray_layout.errors import LayoutError
from ray_layout.model.baselines import BaselineName, count_based, megatron_default
from ray_layout.model.layout import validate

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.mark.parametrize(
    ("args", "kwargs", "expected"),
    [
        ((16, 1, 4), {}, "Et*4|t*4|t*4|t*4mL"),
        ((16, 1, 4), {"first_stage_layers": 3, "last_stage_layers": 3}, "Et*3|t*5|t*5|t*3mL"),
        ((16, 1, 4, 2), {}, "Ett|(tt|)*6t*2mL"),
        ((14, 1, 4), {"account_for_embedding": True, "account_for_loss": True},
         "Et*3|t*4|t*4|t*3mL"),
        ((32, 0, 8), {}, "Et*4|(t*4|)*6t*4L"),
    ],
)  # fmt: skip
def test_megatron_doc_examples(args, kwargs, expected):
    layout = megatron_default(*args, **kwargs)
    assert str(layout) == expected
    validate(layout, args[0], args[1])


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ((16, 1, 4), {"account_for_embedding": True}, "17 is not divisible by PP=4"),
        ((16, 1, 4), {"account_for_embedding": True, "account_for_loss": True}, "18"),
        ((61, 1, 16, 2), {}, "61 is not divisible by PP=16"),
        ((16, 1, 4), {"first_stage_layers": 10, "last_stage_layers": 10}, "exceed"),
        ((16, 1, 4, 2), {"first_stage_layers": 3}, "not divisible by VPP=2"),
        ((16, 1, 4), {"first_stage_layers": 4, "account_for_loss": True}, "rejects"),
    ],
)
def test_no_default_gives_a_clear_error(args, kwargs, message):
    with pytest.raises(LayoutError, match=message):
        megatron_default(*args, **kwargs)


CASES = [
    (16, 4, 1, {}),
    (16, 4, 2, {}),
    (16, 2, 4, {}),
    (24, 4, 3, {}),
    (14, 4, 1, {"account_for_embedding": True, "account_for_loss": True}),
    (15, 4, 1, {"account_for_embedding": True}),
    (15, 4, 1, {"account_for_loss": True}),
    (22, 4, 2, {"account_for_embedding": True, "account_for_loss": True}),
    (16, 4, 1, {"first_stage_layers": 3, "last_stage_layers": 3}),
    (16, 4, 1, {"first_stage_layers": 4}),
    (18, 4, 2, {"first_stage_layers": 2, "last_stage_layers": 4}),
    (22, 3, 2, {"last_stage_layers": 6}),
]


@pytest.mark.parametrize(("layers", "pp", "vpp", "kwargs"), CASES)
def test_default_matches_megatron_core_layer_counts(layers, pp, vpp, kwargs):
    """Per (rank, chunk) decoder counts and offsets equal megatron-core's own functions."""
    import torch
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.transformer_block import get_num_layers_to_build
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    config = TransformerConfig(
        num_layers=layers,
        hidden_size=64,
        num_attention_heads=4,
        pipeline_model_parallel_size=pp,
        virtual_pipeline_model_parallel_size=vpp if vpp > 1 else None,
        pipeline_dtype=torch.bfloat16,
        account_for_embedding_in_pipeline_split=kwargs.get("account_for_embedding", False),
        account_for_loss_in_pipeline_split=kwargs.get("account_for_loss", False),
        num_layers_in_first_pipeline_stage=kwargs.get("first_stage_layers"),
        num_layers_in_last_pipeline_stage=kwargs.get("last_stage_layers"),
    )
    layout = megatron_default(layers, 0, pp, vpp, **kwargs)
    offset = 0
    for chunk in range(vpp):
        for rank in range(pp):
            stage = layout.stage(rank, chunk)
            chunk_arg = chunk if vpp > 1 else None
            assert stage.count("t") == get_num_layers_to_build(config, chunk_arg, rank)
            assert offset == get_transformer_layer_offset(config, chunk_arg, rank)
            offset += stage.count("t")
    validate(layout, layers, 0)


def test_count_based_rule_handbook():
    assert str(count_based(16, 1, 4)) == "Et*4|t*5|t*5|t*2mL"
    assert str(count_based(16, 0, 4)) == "Et*4|t*5|t*4|t*3L"  # 18 units: 5, 5, 4, 4
    layout = count_based(61, 1, 16)
    assert [len(stage) for stage in layout.stages] == [4] * 16
    validate(layout, 61, 1)


@pytest.mark.parametrize(
    ("layers", "mtp", "pp", "vpp", "expected"),
    [
        (16, 1, 4, 2, "Ett|t*3|t*3|(tt|)*4mL"),  # 19 units over 8 stages: 3, 3, 3, then 2s
        (61, 1, 16, 2, "Et|(tt|)*30mL"),  # 64 units over 32 stages
        (16, 1, 4, 1, "Et*4|t*5|t*5|t*2mL"),  # VPP 1 as before
    ],
)
def test_count_based_cuts_every_virtual_stage(layers, mtp, pp, vpp, expected):
    layout = count_based(layers, mtp, pp, vpp)
    assert str(layout) == expected and (layout.pp, layout.vpp) == (pp, vpp)
    validate(layout, layers, mtp)


def test_count_based_refuses_a_cut_megatron_refuses():
    with pytest.raises(LayoutError, match="all 3 MTP layers must be in one virtual stage"):
        count_based(5, 3, 3)  # 10 units: Ettt|ttm|mmL splits the MTP block
    with pytest.raises(LayoutError, match="cannot fill PP=4 x VPP=2 = 8 stages"):
        count_based(2, 0, 4, 2)


def test_count_based_puts_remainder_first():
    layout = count_based(5, 2, 3)  # 9 units: 3, 3, 3
    assert layout.stages == ("Ett", "ttt", "mmL")
    layout = count_based(6, 1, 4)  # 9 units: 3, 2, 2, 2
    assert layout.stages == ("Ett", "tt", "tt", "mL")
    with pytest.raises(LayoutError, match="cannot fill"):
        count_based(0, 0, 3)


def test_each_baseline_has_one_short_name_and_one_arm_role():
    assert [name.short for name in BaselineName] == ["current", "default", "count-based"]
    for name in BaselineName:
        role = ArmRole.of(name)
        assert role.baseline is name and role.value == name.value  # the store's one name
    assert ArmRole.CANDIDATE.baseline is None
