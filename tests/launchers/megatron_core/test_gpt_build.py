"""What a layout's stage holds in megatron-core's terms, which layouts deadlock megatron-core
0.16.1's build, and the TransformerConfig a run gets from its command line."""

from __future__ import annotations

import pytest

from launchers.emulated.config import run_config
from launchers.megatron_core.gpt_build import (
    CoreSettings,
    check_buildable,
    embedding_all_reduces,
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


def test_embedding_all_reduces_per_rank():
    assert embedding_all_reduces(Layout.parse("Ett|t*2mL", 2), tied=True) == {0: 1, 1: 1}
    assert embedding_all_reduces(Layout.parse("Ett|ttm|L", 3), tied=True) == {0: 1, 1: 1, 2: 1}
    assert embedding_all_reduces(Layout.parse("Ett|tt|m|L", 2), tied=True) == {0: 2, 1: 1}


def test_mtp_beside_the_embedding_in_another_virtual_stage_is_refused():
    with pytest.raises(ConfigError, match="deadlock"):
        check_buildable(Layout.parse("Ett|tt|m|L", 2), tied=True)
    check_buildable(Layout.parse("Et|tt|t|mL", 2), tied=True)


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
