"""What a layout's stage holds in megatron-core's terms, which layouts deadlock megatron-core
0.16.1's build, and the TransformerConfig a run gets from its command line."""

from __future__ import annotations

import pytest

from launchers.emulated.config import run_config
from launchers.megatron_core.gpt_build import (
    CoreSettings,
    check_buildable,
    embedding_group,
    expected_stage,
    transformer_config,
)
from ray_layout.errors import ConfigError
from ray_layout.model.layout import Layout
from tests.helpers.megatron_core_ranks import core_arguments
from tests.helpers.megatron_oracle import MEGATRON_CPU_WARNINGS


def test_a_stage_names_its_symbols_and_global_layer_numbers():
    layout = Layout.parse("Et|tt|t|mL", 2)
    assert expected_stage(layout, 0, 0).symbols == "Et"
    assert expected_stage(layout, 1, 0).layer_numbers == (2, 3)
    assert expected_stage(layout, 0, 1).layer_numbers == (4,)
    assert expected_stage(layout, 1, 1).symbols == "mL"


def test_mtp_off_the_last_rank_with_vpp_and_tied_embeddings_is_refused():
    with pytest.raises(ConfigError, match="all-reduce the shared embedding unequally"):
        check_buildable(Layout.parse("Ett|tt|m|L", 2), tied_embeddings=True)
    check_buildable(Layout.parse("Ett|tt|m|L", 2), tied_embeddings=False)
    check_buildable(Layout.parse("Et|tt|t|mL", 2), tied_embeddings=True)
    check_buildable(Layout.parse("Ett|ttm|L", 3), tied_embeddings=True)


def test_the_embedding_group_is_pretrain_gpts():
    """The first rank, the last where tied, and every MTP rank (``get_embedding_ranks``)."""
    standalone = Layout.parse("Et|t|t|t|m|L", 3)  # MTP on PP rank 1, chunk 1
    assert embedding_group([0, 4, 8], standalone, tied_embeddings=True) == [0, 4, 8]
    assert embedding_group([0, 4, 8], standalone, tied_embeddings=False) == [0, 4]
    assert embedding_group([1, 3], Layout.parse("Ett|t*2mL", 2), tied_embeddings=False) == [1, 3]
    assert embedding_group([1, 3], Layout.parse("Ett|t*2L", 2), tied_embeddings=False) == [1]
    assert embedding_group([5], Layout.parse("Et*4mL", 1), tied_embeddings=True) == [5]


@pytest.mark.megatron
@pytest.mark.filterwarnings(*MEGATRON_CPU_WARNINGS)
def test_the_config_carries_the_layout_and_the_moe_shape():
    layout = Layout.parse("Et|tt|t|mL", 2)
    run = run_config(core_arguments(layout, iterations=1), world_size=2)
    config = transformer_config(run, CoreSettings(dispatcher="alltoall"))
    assert config.virtual_pipeline_model_parallel_size == 2
    assert config.num_moe_experts == 4 and config.moe_layer_freq == [0, 1, 1, 1]
    assert config.mtp_num_layers == 1
    assert config.pipeline_model_parallel_layout is not None
