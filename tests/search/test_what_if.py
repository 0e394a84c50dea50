"""What-ifs when nothing fits: the steps to try, the flags each adds, and re-planning under
them, so that the one that fits is named with its pick and largest stage."""

from __future__ import annotations

from dataclasses import replace

from ray_layout.model.costs import load_costs
from ray_layout.model.hf_config import load_hf_config
from ray_layout.model.layout import Layout
from ray_layout.model.memory_settings import PLAIN, memory_settings
from ray_layout.model.spec import load_recipe_file
from search.planner import PlanOptions, Problem, SearchSpec, plan
from search.what_if import WhatIf, steps, what_ifs

HANDBOOK = load_recipe_file("configs/handbook_7b_a1b.yaml")
COSTS = load_costs("configs/costs/handbook_h200_example.json")
V3 = load_hf_config("tests/data/hf/DeepSeek-V3/config.json", seq_length=1024).model


def test_steps_go_from_cheap_selective_recompute_to_full():
    tried = steps(V3, PLAIN)
    assert tried[0].selective == {"layernorm", "moe_act", "mla_up_proj"}
    assert tried[1].precision_aware and tried[1].optimizer_bytes_per_param == 6
    assert tried[2].selective == tried[0].selective and tried[2].precision_aware
    assert tried[3].recompute_granularity == "full" and tried[3].recompute_num_layers == 1
    dense = replace(V3, moe_layer_pattern=(), mla=None)
    assert steps(dense, PLAIN)[0].selective == {"layernorm"}


def test_steps_the_job_already_takes_are_left_out():
    flags = ["--recompute-granularity", "full", "--recompute-method", "uniform",
             "--recompute-num-layers", "1", "--use-precision-aware-optimizer",
             "--exp-avg-dtype", "bf16", "--exp-avg-sq-dtype", "bf16"]  # fmt: skip
    assert steps(V3, memory_settings(flags)) == []


def test_a_what_if_names_the_flags_the_pick_and_its_largest_stage():
    flags = ("--recompute-granularity", "selective", "--recompute-modules", "moe_act")
    fits = WhatIf(flags, Layout.parse("Et*4|t*5|t*6|tmL", 4), 71.24, 6444.6, 0.0791)
    assert fits.line(80) == (
        "with `--recompute-granularity selective --recompute-modules moe_act` the pick "
        "Et*4|t*5|t*6|tmL fits: its largest stage is 71.2 GiB (step 6,444.6 ms, +7.9% for "
        "recomputation)"
    )
    assert WhatIf(flags, None, 93.94).line(80).endswith("still no layout fits in 80 GiB: "
                                                       "the smallest peak is 93.9 GiB")  # fmt: skip


def test_re_planned_what_ifs_fit_where_the_job_does_not():
    options = PlanOptions(top=1, samples=8, hbm_gib=30.0)
    problem = Problem.of(HANDBOOK, COSTS, SearchSpec(num_microbatches=32), options)
    assert not plan(problem).candidates  # the plain job: nothing fits in 30 GiB
    found = what_ifs(problem)
    assert found[0].flags[:2] == ("--recompute-granularity", "selective")
    fitting = [w for w in found if w.layout is not None]
    assert fitting and all(w.largest_stage_gib <= 30.0 for w in fitting)
    full = found[-1]
    assert full.flags == ("--recompute-granularity", "full", "--recompute-method", "uniform",
                          "--recompute-num-layers", "1")  # fmt: skip
    assert full.layout is not None and full.recompute_cost > 0.1  # every layer re-run
    # the same flags in the recipe give the same pick
    taken = Problem.of(replace(HANDBOOK, megatron_args=full.flags), COSTS, problem.spec, options)
    assert plan(taken).candidates[0].peak_memory_gib <= 30.0
