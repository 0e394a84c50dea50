"""What a layout's stage holds in megatron-core's terms, which layouts deadlock megatron-core
0.16.1's build, the TransformerConfig a run gets from its command line (the job's recompute
settings as Megatron-LM's own arguments give them), and the recompute the CPU ranks refuse."""

from __future__ import annotations

import pytest

from launchers.emulated.config import run_config
from launchers.megatron_core.gpt_build import (
    CoreSettings,
    check_buildable,
    check_runs_on_cpu,
    embedding_group,
    expected_stage,
    transformer_config,
)
from ray_layout.errors import ConfigError
from ray_layout.model.job_flags import job_flags
from ray_layout.model.layout import Layout
from tests.helpers.megatron_arguments_oracle import (
    megatron_core_config,
    parse_megatron_args,
    validate_megatron_args,
)
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


# megatron-core asks whether core_attn recompute is needed under Transformer Engine's fused one
CORE_ATTN_WARNING = "ignore:If you are using transformer_engine:UserWarning"
RECOMPUTE_FIELDS = (
    "recompute_granularity",
    "recompute_method",
    "recompute_num_layers",
    "recompute_modules",
)


@pytest.mark.megatron
@pytest.mark.filterwarnings(*MEGATRON_CPU_WARNINGS, CORE_ATTN_WARNING)
@pytest.mark.parametrize(
    "flags",
    [
        "",
        "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1",
        "--recompute-granularity full --recompute-method block --recompute-num-layers 2",
        "--recompute-granularity selective",
        "--recompute-granularity selective --recompute-modules layernorm core_attn mlp moe",
        "--recompute-activations",
        "--moe-layer-recompute",
    ],
    ids=["none", "full-uniform", "full-block", "selective", "selective-four", "activations", "moe"],
)
def test_the_config_recomputes_as_megatron_lms_own_arguments_have_it(flags):
    """megatron-core's TransformerConfig built from Megatron-LM's parsed and validated arguments
    (``core_transformer_config_from_args``) is the oracle for the recompute fields."""
    layout = Layout.parse("Et|t*3|mL", 3)
    argv = [*core_arguments(layout, iterations=1), *flags.split()]
    config = transformer_config(run_config(argv, world_size=3), CoreSettings())
    oracle = megatron_core_config(validate_megatron_args(parse_megatron_args(argv), 3))
    ours = {field: getattr(config, field) for field in RECOMPUTE_FIELDS}
    theirs = {field: getattr(oracle, field) for field in RECOMPUTE_FIELDS}
    ours["recompute_modules"] = sorted(ours["recompute_modules"])
    theirs["recompute_modules"] = sorted(theirs["recompute_modules"])
    assert ours == theirs
    assert (config.recompute_granularity is None) == (flags == "")


def test_moe_act_recompute_is_refused_on_cpu_ranks():
    """A job with grouped GEMM may recompute moe_act; the CPU ranks run the experts without
    grouped GEMM, where megatron-core refuses it."""
    selective = ["--moe-grouped-gemm", "--recompute-granularity", "selective"]
    with pytest.raises(ConfigError, match="--recompute-modules moe_act"):
        check_runs_on_cpu(job_flags([*selective, "--recompute-modules", "moe_act"]))
    check_runs_on_cpu(job_flags(selective))
