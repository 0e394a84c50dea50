"""A config's split flags as Megatron reads them: which go together, the VPP they give, and the
layout of Megatron's default split they shape, judged by the port of Megatron's ``validate_args``
and start-up checks (tests/helpers/megatron_arguments_oracle.py)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ray_layout.errors import LayoutError
from ray_layout.model.layout import Layout
from ray_layout.model.split import (
    SPLIT_FLAGS,
    PipelineSplit,
    check_split,
    current_layout,
    default_layout,
    virtual_pipeline_size,
)
from tests.helpers.megatron_arguments_oracle import parse_megatron_args, validate_megatron_args
from tests.helpers.megatron_oracle import MEGATRON_CPU_WARNINGS

# A dense GPT that Megatron accepts on PP ranks, but for its split.
MODEL = " ".join(
    [
        "--hidden-size 64 --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32",
        "--micro-batch-size 1 --global-batch-size 16 --train-iters 1 --eval-iters 0",
        "--eval-interval 1000 --mock-data --tokenizer-type NullTokenizer --vocab-size 100",
        "--lr 1e-4",
    ]
).split()
pytestmark = [pytest.mark.filterwarnings(w) for w in MEGATRON_CPU_WARNINGS]


def split_words(split: PipelineSplit) -> list[str]:
    words: list[str] = []
    for key, flag in SPLIT_FLAGS.items():
        value = getattr(split, key)
        if value is True:
            words.append(flag)
        elif value is not None and value is not False:
            words += [flag, str(value)]
    return words


splits = st.builds(
    PipelineSplit,
    first_stage_layers=st.sampled_from([None, 1, 2, 3]),
    last_stage_layers=st.sampled_from([None, 1, 2]),
    account_for_embedding=st.booleans(),
    account_for_loss=st.booleans(),
    layers_per_virtual_stage=st.sampled_from([None, 1, 2]),
    virtual_stages=st.sampled_from([None, 2, 3]),
)


@pytest.mark.megatron
@settings(max_examples=40, deadline=None)
@given(st.sampled_from([6, 8, 12]), st.sampled_from([2, 4]), splits)
def test_the_default_split_is_refused_and_sized_as_megatron_does(layers, pp, split):
    """PP 2 and 4: a VPP on PP 1 is refused with the parallel sizes (spec.build_parallel)."""
    argv = [*MODEL, "--num-layers", str(layers), "--pipeline-model-parallel-size", str(pp)]
    try:
        args = validate_megatron_args(parse_megatron_args(argv + split_words(split)), pp)
    except AssertionError:
        expected = None
    else:
        expected = args.virtual_pipeline_model_parallel_size or 1  # Megatron: None for 1
    try:
        vpp = virtual_pipeline_size(split, layers, pp) or 1
        layout = default_layout(layers, 0, pp, vpp, split)
    except LayoutError as exc:
        assert expected is None, exc
        assert "\n" not in str(exc)
    else:
        assert vpp == expected
        assert layout.pp == pp and layout.vpp == vpp


def test_only_a_split_that_shapes_the_layers_is_given():
    assert not PipelineSplit().given
    assert not PipelineSplit(virtual_stages=2, layers_per_virtual_stage=1).given
    assert PipelineSplit(account_for_loss=True).given
    assert PipelineSplit(first_stage_layers=0).given  # 0 is a value, not unset
    assert PipelineSplit(layout="Et|tL").given


def test_the_current_layout_is_the_string_or_megatrons_default_or_none():
    assert current_layout(8, 0, 2, 1, PipelineSplit(), tied_embeddings=True) is None
    given = current_layout(8, 0, 2, 1, PipelineSplit(layout="Et*3|t*5L"), tied_embeddings=True)
    assert given == Layout.parse("Et*3|t*5L", 2)
    shaped = current_layout(8, 0, 2, 1, PipelineSplit(first_stage_layers=3), tied_embeddings=True)
    assert [stage.count("t") for stage in shaped.stages] == [3, 5]
    with pytest.raises(LayoutError):
        current_layout(
            8, 0, 2, 1, PipelineSplit(layout="Et*3|t*4L"), tied_embeddings=True
        )  # 7 of 8 layers


@pytest.mark.parametrize(
    ("split", "message"),
    [
        (
            PipelineSplit(layout="Et|tL", virtual_stages=1),
            "Megatron accepts at most one of --pipeline-model-parallel-layout, "
            "--num-virtual-stages-per-pipeline-rank",
        ),
        (
            PipelineSplit(layout="Et|tL", account_for_loss=True),
            "Megatron rejects --pipeline-model-parallel-layout together with "
            "--account-for-loss-in-pipeline-split",
        ),
        (
            PipelineSplit(first_stage_layers=1, layers_per_virtual_stage=1),
            "Megatron needs --num-virtual-stages-per-pipeline-rank, not --num-layers-per-virtual-"
            "pipeline-stage, with --decoder-first/last-pipeline-num-layers",
        ),
    ],
)
def test_flags_that_do_not_go_together_name_each_other(split, message):
    with pytest.raises(LayoutError) as info:
        check_split(split)
    assert str(info.value) == message


def test_the_vpp_from_each_kind_of_flag():
    assert virtual_pipeline_size(PipelineSplit(), 8, 2) is None
    assert virtual_pipeline_size(PipelineSplit(layout="Et|t|t|tL"), 8, 2) == 2
    assert virtual_pipeline_size(PipelineSplit(virtual_stages=3), 8, 2) == 3
    assert virtual_pipeline_size(PipelineSplit(layers_per_virtual_stage=2), 8, 2) == 2
    embedding_and_loss = PipelineSplit(
        layers_per_virtual_stage=2, account_for_embedding=True, account_for_loss=True
    )
    assert virtual_pipeline_size(embedding_and_loss, 6, 2) == 2  # (6 + 2) / 2 / 2
    with pytest.raises(LayoutError, match=r"^--pipeline-model-parallel-layout has 3 stages, not"):
        virtual_pipeline_size(PipelineSplit(layout="Et|t|tL"), 8, 2)
    with pytest.raises(LayoutError, match="does not evenly split 8 layers over 2 pipeline stages"):
        virtual_pipeline_size(PipelineSplit(layers_per_virtual_stage=3), 8, 2)
