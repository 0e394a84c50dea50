"""The job's memory flags: read from the recipe, refused in one line when Megatron would refuse
them, and each one lowering the per-stage GiB by what Megatron's code implies (the amounts are
computed here from the formulas, not from the model under test)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ray_layout.errors import ConfigError
from ray_layout.model.costs import costs_from_flops, load_costs
from ray_layout.model.hf_config import load_hf_config
from ray_layout.model.layout import Layout
from ray_layout.model.memory_settings import (
    PLAIN,
    RECOMPUTE_MODULES,
    MemorySettings,
    memory_settings,
    with_recompute,
)
from ray_layout.model.sizing import GIB, stage_sizes, unit_sizes
from ray_layout.model.spec import ParallelConfig, load_recipe_file
from search.cost_model import build_cost_model, in_flight_at_peak
from search.evaluate import memory as evaluate_memory
from search.memory import activation_bytes, recompute_bytes, stage_memory
from search.pipeline_ops import ScheduleShape
from search.planner import PlanOptions, Problem, SearchSpec
from search.space import LayoutSpace

V3 = load_hf_config("tests/data/hf/DeepSeek-V3/config.json", seq_length=1024).model
SMALL = replace(V3, num_layers=8, moe_layer_pattern=(False,) * 2 + (True,) * 6, mtp_num_layers=1)
PARALLEL = ParallelConfig(tp=1, pp=2, ep=8, dp=8, micro_batch_size=1)
LAYOUT = Layout(("Etttt", "ttttmL"), 2)
HELD = [{0: 2}, {0: 1}]  # 1F1B at PP 2: rank r holds PP - r micro-batches
COSTS = load_costs("configs/costs/handbook_h200_example.json")
H, HEADS, TOPK, MOE_FFN, TOKENS = 7168, 128, 8, 2048, 1024  # tokens per GPU: seq 1024, b 1
LAYERS = [(2, 2), (0, 4)]  # (dense, MoE) decoder layers of each rank


def memory(flags: list[str]) -> list:
    return stage_memory(SMALL, PARALLEL, LAYOUT, COSTS, HELD, memory_settings(flags))


def lowered(flags: list[str]) -> list[float]:
    """Bytes each rank saves under ``flags`` against the plain run."""
    base = stage_memory(SMALL, PARALLEL, LAYOUT, COSTS, HELD)
    return [a.total - b.total for a, b in zip(base, memory(flags), strict=True)]


# ---- reading the flags -----------------------------------------------------------------------


def test_defaults_are_a_plain_run():
    assert memory_settings([]) == PLAIN
    assert PLAIN.selective == frozenset()
    assert PLAIN.optimizer_bytes_per_param == 12 and PLAIN.grad_bytes_per_param == 4


def test_flags_are_read():
    read = memory_settings(
        ["--recompute-granularity", "selective", "--recompute-modules", "moe_act", "mla_up_proj",
         "--use-precision-aware-optimizer", "--exp-avg-dtype", "bf16", "--exp-avg-sq-dtype", "fp8",
         "--main-grads-dtype", "bf16", "--optimizer-cpu-offload", "--optimizer-offload-fraction",
         "0.25", "--fp8-param-gather"]
    )  # fmt: skip
    assert read.selective == {"moe_act", "mla_up_proj"}
    assert (read.exp_avg_bytes, read.exp_avg_sq_bytes, read.grad_bytes_per_param) == (2, 1, 2)
    assert read.optimizer_bytes_per_param == 2 + 1 + 2  # the main copy's 16-bit remainder
    assert read.optimizer_offload_fraction == 0.25 and read.fp8_param_gather
    assert memory_settings(["--recompute-activations"]).selective == {"core_attn"}
    assert memory_settings(["--optimizer-cpu-offload"]).optimizer_offload_fraction == 1.0
    assert memory_settings(["--moe-layer-recompute"]).selective == {"core_attn", "moe"}
    # the dtypes count only under the precision-aware optimizer, as in Megatron
    assert memory_settings(["--exp-avg-dtype", "bf16"]).optimizer_bytes_per_param == 12


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--recompute-granularity", "selective", "--recompute-modules", "attn"],
         "--recompute-modules does not know 'attn'"),
        (["--recompute-granularity", "full", "--recompute-num-layers", "1"],
         "needs --recompute-method"),
        (["--recompute-granularity", "full", "--recompute-method", "uniform"],
         "needs --recompute-num-layers"),
        (["--optimizer-cpu-offload", "--optimizer-offload-fraction", "1.5"], "in \\[0, 1\\]"),
        (["--recompute-granularity", "partial"], "must be one of full, selective"),
        (["--recompute-granularity", "full", "--recompute-method", "block",
          "--recompute-num-layers", "1", "--moe-layer-recompute"], "cannot go with full"),
    ],
)  # fmt: skip
def test_bad_values_are_one_line(flags, message):
    with pytest.raises(ConfigError, match=message) as caught:
        memory_settings(flags, "x.yaml: megatron_args")
    assert "\n" not in str(caught.value) and str(caught.value).startswith("x.yaml")


def test_flags_round_trip():
    for flags in (
        ["--recompute-granularity", "selective", "--recompute-modules", "layernorm", "moe_act"],
        ["--recompute-granularity", "full", "--recompute-method", "block",
         "--recompute-num-layers", "2"],
        ["--use-precision-aware-optimizer", "--exp-avg-dtype", "bf16", "--exp-avg-sq-dtype",
         "bf16"],
    ):  # fmt: skip
        read = memory_settings(flags)
        assert memory_settings(list(read.flags())) == read


# ---- what each flag saves, per stage -------------------------------------------------------


def test_moe_act_frees_the_routed_activation_output():
    """experts.py discards the activation's output (fc2's input): top-k x 2 x moe_ffn bytes a
    token; one layer's worth comes back while its backward recomputes it."""
    one = TOPK * 2 * MOE_FFN * TOKENS
    expected = [(moe * held[0] - 1) * one for (_, moe), held in zip(LAYERS, HELD, strict=True)]
    expected[1] += HELD[1][0] * one  # the MTP layer is MoE like the last decoder layer
    got = lowered(["--recompute-granularity", "selective", "--recompute-modules", "moe_act"])
    assert got == pytest.approx(expected)


def test_mla_up_proj_frees_q_k_and_v():
    one = (4 * HEADS * (128 + 64) + 2 * HEADS * 128) * TOKENS
    layers = [4 * 2, 4 * 1 + 1]  # decoder (+ MTP) layers x micro-batches held
    got = lowered(["--recompute-granularity", "selective", "--recompute-modules", "mla_up_proj"])
    assert got == pytest.approx([(n - 1) * one for n in layers])


def test_layernorm_frees_the_unfused_norm_outputs():
    """MLA's input norm and an MoE layer's pre-MLP norm are not fused into a linear."""
    per_layer = {False: 2 * H, True: 4 * H}
    held = [2 * (2 * per_layer[False] + 2 * per_layer[True]), 5 * per_layer[True]]
    got = lowered(["--recompute-granularity", "selective", "--recompute-modules", "layernorm"])
    assert got == pytest.approx([(b - per_layer[True]) * TOKENS for b in held])


def test_core_attn_frees_nothing_under_flash_attention():
    assert lowered(["--recompute-activations"]) == [0.0, 0.0]


def test_full_uniform_keeps_one_input_per_group():
    full = ["--recompute-granularity", "full", "--recompute-method", "uniform"]
    plain = {u: activation_bytes(SMALL, PARALLEL, u) for u in ("t_dense", "t_moe", "m")}
    one = memory([*full, "--recompute-num-layers", "1"])
    base = stage_memory(SMALL, PARALLEL, LAYOUT, COSTS, HELD)
    for rank, (dense, moe) in enumerate(LAYERS):
        held = HELD[rank][0]
        kept = (dense + moe) * 2 * H * TOKENS
        freed = dense * plain["t_dense"] + moe * plain["t_moe"] - kept
        if rank == 1:
            freed += plain["m"] - (2 * H + 10 * H) * TOKENS
        transient = plain["t_moe"]  # one layer recomputed at a time, the widest
        assert base[rank].total - one[rank].total == pytest.approx(held * freed - transient)
    two = memory([*full, "--recompute-num-layers", "2"])
    # half the group inputs held, and two layers recomputed at a time instead of one
    assert two[0].activations == pytest.approx(
        one[0].activations - 2 * 4 * H * TOKENS + plain["t_moe"]
    )


def test_full_block_checkpoints_the_first_layers_of_each_chunk():
    flags = ["--recompute-granularity", "full", "--recompute-method", "block",
             "--recompute-num-layers", "3"]  # fmt: skip
    plain = {u: activation_bytes(SMALL, PARALLEL, u) for u in ("t_dense", "t_moe")}
    got = lowered(flags)
    transient = plain["t_moe"]
    first = 2 * (2 * plain["t_dense"] + plain["t_moe"] - 3 * 2 * H * TOKENS)
    last = 3 * plain["t_moe"] - 3 * 2 * H * TOKENS
    assert got == pytest.approx([first - transient, last - transient])


def test_precision_aware_optimizer_lowers_the_optimizer_state():
    sizes = stage_sizes(SMALL, PARALLEL, LAYOUT.stages)
    flags = ["--use-precision-aware-optimizer", "--exp-avg-dtype", "bf16",
             "--exp-avg-sq-dtype", "bf16"]  # fmt: skip
    got = lowered(flags)
    for rank, size in enumerate(sizes):
        p = size.params
        sharded = (p.tp_sharded + p.replicated) / PARALLEL.dp + p.expert / 8 / PARALLEL.expert_dp
        assert got[rank] == pytest.approx((12 - 6) * sharded)
    grads = lowered([*flags, "--main-grads-dtype", "bf16"])
    for rank, size in enumerate(sizes):
        local = size.params.tp_sharded + size.params.replicated + size.params.expert / 8
        assert grads[rank] - got[rank] == pytest.approx(2 * local)


def test_optimizer_offload_keeps_a_fraction_on_the_cpu():
    base = stage_memory(SMALL, PARALLEL, LAYOUT, COSTS, HELD)
    got = lowered(["--optimizer-cpu-offload", "--optimizer-offload-fraction", "0.5"])
    assert got == pytest.approx([m.optimizer / 2 for m in base])


def test_fp8_param_gather_halves_the_linear_weights():
    sizes = unit_sizes(SMALL)
    linear = {u: sizes[u].params.tp_sharded + sizes[u].params.expert / 8 for u in sizes}
    got = lowered(["--fp8-param-gather"])
    assert got[0] == pytest.approx(2 * linear["t_dense"] + 2 * linear["t_moe"])
    assert got[1] == pytest.approx(4 * linear["t_moe"] + linear["m"])


def test_distributed_optimizer_off_keeps_the_whole_state():
    whole = replace(PARALLEL, use_distributed_optimizer=False)
    plain = stage_memory(SMALL, whole, LAYOUT, COSTS, HELD)
    sharded = stage_memory(SMALL, PARALLEL, LAYOUT, COSTS, HELD)
    assert PARALLEL.expert_dp == 1  # world 16 over EP 8 x PP 2: experts are not sharded
    for one, other, size in zip(
        plain, sharded, stage_sizes(SMALL, PARALLEL, LAYOUT.stages), strict=True
    ):
        dense, expert = size.params.tp_sharded + size.params.replicated, size.params.expert / 8
        assert one.optimizer == pytest.approx(12 * (dense + expert))
        assert other.optimizer == pytest.approx(12 * (dense / 8 + expert))


@settings(max_examples=40, deadline=None)
@given(st.sets(st.sampled_from(sorted(RECOMPUTE_MODULES))), st.integers(1, 4))
def test_more_recompute_never_holds_more(modules, held):
    """Adding a module never raises what is held beyond its own transient one-layer cost."""
    plain = MemorySettings(recompute_granularity="selective", recompute_modules=frozenset())
    chosen = replace(plain, recompute_modules=frozenset(modules))
    base = stage_memory(SMALL, PARALLEL, LAYOUT, COSTS, [{0: held}] * 2, plain)
    more = stage_memory(SMALL, PARALLEL, LAYOUT, COSTS, [{0: held}] * 2, chosen)
    transient = recompute_bytes(SMALL, PARALLEL, chosen)
    assert transient <= 0.5 * GIB  # one layer's recomputed tensors, never a held stage's worth
    for one, other in zip(base, more, strict=True):
        assert other.activations - transient <= one.activations
        assert other.total <= one.total + transient


@pytest.mark.parametrize(
    "flags",
    [
        [],
        ["--recompute-granularity", "selective", "--recompute-modules", "moe_act", "layernorm"],
        ["--recompute-granularity", "full", "--recompute-method", "block",
         "--recompute-num-layers", "3"],
        ["--recompute-granularity", "full", "--recompute-method", "uniform",
         "--recompute-num-layers", "2"],
        ["--use-precision-aware-optimizer", "--exp-avg-dtype", "bf16", "--fp8-param-gather"],
    ],
)  # fmt: skip
def test_the_planners_arrays_agree_with_stage_memory(flags):
    """The search scores memory from arrays (search.evaluate); it must be the same figure."""
    read = memory_settings(flags)
    costs = costs_from_flops(SMALL, PARALLEL)
    model = build_cost_model(SMALL, PARALLEL, costs, 8, settings=read)
    space, cuts = LayoutSpace.holding(LAYOUT)
    counts = space.unit_counts(cuts[None], model.units, SMALL.moe_layer_pattern)
    held = [{0: int(n)} for n in model.in_flight[:, 0]]
    expected = [m.total for m in stage_memory(SMALL, PARALLEL, LAYOUT, costs, held, read)]
    assert evaluate_memory(model, counts, 2)[0] == pytest.approx(expected)


def test_a_recipes_flags_reach_the_planner():
    recipe = load_hf_config("tests/data/hf/DeepSeek-V3/config.json", seq_length=1024)
    flags = ("--recompute-granularity", "selective", "--recompute-modules", "moe_act")
    grouped = (*flags, "--moe-grouped-gemm")
    problem = Problem.of(
        replace(recipe, megatron_args=grouped), COSTS, SearchSpec(8), PlanOptions()
    )
    assert problem.memory.selective == {"moe_act"}
    with pytest.raises(ConfigError, match="moe_act needs --moe-grouped-gemm"):
        replace(recipe, megatron_args=flags)  # megatron-core's TransformerConfig refuses it
    with pytest.raises(ConfigError, match="'experts'"):  # refused as the recipe is built
        replace(recipe, megatron_args=("--recompute-granularity", "selective",
                                       "--recompute-modules", "experts"))  # fmt: skip


def test_fp8_recipes_other_than_delayed_keep_megatrons_own_fp32_main_copy():
    aware = ["--use-precision-aware-optimizer", "--exp-avg-dtype", "bf16", "--exp-avg-sq-dtype",
             "bf16", "--fp8-format", "e4m3"]  # fmt: skip
    assert memory_settings(aware).optimizer_bytes_per_param == 2 + 2 + 2  # delayed: TE's remainder
    blockwise = memory_settings([*aware, "--fp8-recipe", "blockwise"])
    assert blockwise.optimizer_bytes_per_param == 2 + 2 + 4
    offloaded = memory_settings([*aware, "--fp8-recipe", "blockwise", "--optimizer-cpu-offload"])
    assert offloaded.optimizer_bytes_per_param == 2 + 2 + 2


def test_the_model_zoo_deepseek_v3_h100_recipe_fits_in_80_gb():
    """The zoo's H100 best practice trains on 80 GB GPUs; without its memory flags it would not."""
    recipe = load_recipe_file("configs/deepseek_v3_zoo_h100.yaml")
    layout = Layout.parse("Et|(tt|)*30mL", 8)
    costs = costs_from_flops(recipe.model, recipe.parallel)
    held = [dict(enumerate(map(int, row))) for row in in_flight_at_peak(ScheduleShape(8, 4, 128))]
    read = memory_settings(recipe.megatron_args)
    peaks = [
        m.total_gib for m in stage_memory(recipe.model, recipe.parallel, layout, costs, held, read)
    ]
    assert max(peaks) <= 80.0
    plain = stage_memory(recipe.model, recipe.parallel, layout, costs, held)
    assert max(m.total_gib for m in plain) > 95.0


_OTHERS = [
    ["--bf16"],
    ["--seq-length", "4096"],
    ["--use-precision-aware-optimizer"],
    ["--exp-avg-dtype", "bf16"],
    ["--tensor-model-parallel-size=2"],
]
_OTHER_WORDS = st.sampled_from(_OTHERS)
_RECOMPUTE_WORDS = st.sampled_from(
    [["--recompute-granularity", "full"], ["--recompute-method=block"],
     ["--recompute-num-layers", "3"], ["--recompute-modules", "core_attn", "moe_act"],
     ["--recompute-activations"], ["--moe-layer-recompute"], ["--recompute-granularity=selective"]]
)  # fmt: skip
_SETTINGS = st.sampled_from(
    [[], ["--recompute-granularity", "selective", "--recompute-modules", "mlp", "layernorm"],
     ["--recompute-granularity", "full", "--recompute-method", "uniform",
      "--recompute-num-layers", "2"],
     ["--recompute-granularity", "full", "--recompute-method", "block",
      "--recompute-num-layers", "0"]]
)  # fmt: skip


@given(st.lists(st.one_of(_OTHER_WORDS, _RECOMPUTE_WORDS)), _SETTINGS)
def test_with_recompute_keeps_every_other_word_and_runs_exactly_the_given_setting(parts, flags):
    words = [word for part in parts for word in part]
    wanted = memory_settings(flags)
    rewritten = with_recompute(words, wanted)
    others = [w for part in parts if part in _OTHERS for w in part]
    assert list(rewritten[: len(others)]) == others  # in their order, untouched
    assert rewritten[len(others) :] == wanted.recompute_flags()
    assert memory_settings(rewritten) == replace(memory_settings(others), **_recompute_of(wanted))


def _recompute_of(settings: MemorySettings) -> dict[str, object]:
    names = ("recompute_granularity", "recompute_method", "recompute_num_layers")
    return {name: getattr(settings, name) for name in (*names, "recompute_modules")}


@pytest.mark.parametrize(
    ("flags", "mla", "refused"),
    [
        (["moe_act"], False, "moe_act needs --moe-grouped-gemm"),
        (["moe_act", "--moe-grouped-gemm"], False, None),
        (["mla_up_proj"], False, "mla_up_proj needs multi-latent attention"),
        (["mla_up_proj"], True, None),
        (["shared_experts", "--moe-shared-expert-overlap"], False, "cannot go with"),
        (["layernorm", "--fp8-format", "e4m3"], False, "delayed scaling does not support"),
        (["layernorm", "--fp8-format", "e4m3", "--fp8-recipe", "blockwise"], False, None),
    ],
)
def test_the_selective_modules_megatron_core_refuses_are_named(flags, mla, refused):
    settings = memory_settings(
        ["--recompute-granularity", "selective", "--recompute-modules", *flags]
    )
    found = settings.recompute_refusal(mla=mla, mtp=False)
    assert (found is None) if refused is None else (refused in found)
