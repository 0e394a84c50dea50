"""Search benchmarks: simulation throughput, the handbook plan, DeepSeek-V3's shape, Ray sharding.

    python benchmarks/bench_search.py            # everything (about two minutes on 2 cores)
    python benchmarks/bench_search.py --skip-ray # without the Ray sharding run

Prints one line per measurement; the numbers in docs/search.md come from this script.
"""

from __future__ import annotations

import argparse
import itertools
import os
import time
from dataclasses import replace

import numpy as np

from ray_layout.model.costs import costs_from_flops, load_costs
from ray_layout.model.loading import load_recipe
from ray_layout.model.spec import with_parallel
from search.cost_model import build_cost_model
from search.evaluate import monte_carlo, score, standard_normals
from search.planner import PlanOptions, SearchSpec, plan
from search.schedule import compile_schedule
from search.space import LayoutSpace

HANDBOOK = "configs/handbook_7b_a1b.yaml"
HANDBOOK_COSTS = "configs/costs/handbook_h200_example.json"
DEEPSEEK = "tests/data/hf/DeepSeek-V3/config.json"


def timed(action, *args, repeat: int = 1):
    """(result, seconds per call) of ``action(*args)``."""
    start = time.perf_counter()
    for _ in range(repeat):
        result = action(*args)
    return result, (time.perf_counter() - start) / repeat


def throughput() -> None:
    handbook = load_recipe(HANDBOOK)
    deepseek_16 = with_parallel(load_recipe(DEEPSEEK), pp=16, vpp=2, ep=8, dp=8)
    cases = (
        (with_parallel(handbook, pp=4), load_costs(HANDBOOK_COSTS), 32),
        (with_parallel(handbook, pp=4, vpp=2), load_costs(HANDBOOK_COSTS), 32),
        (deepseek_16, costs_from_flops(deepseek_16.model, deepseek_16.parallel), 64),
    )
    for run, costs, microbatches in cases:
        pp, vpp = run.parallel.pp, run.parallel.vpp
        layers, mtp = run.model.num_layers, run.model.mtp_num_layers
        space = LayoutSpace(layers, mtp, pp, vpp, allow_standalone_mtp=True)
        program = compile_schedule(pp, vpp, microbatches)
        model = build_cost_model(run.model, run.parallel, costs, microbatches)
        cuts = np.concatenate(list(itertools.islice(space.cut_blocks(4096), 8)))
        counts = space.unit_counts(cuts, model.units, model.moe_pattern)
        _, seconds = timed(score, program, model, counts, repeat=3)
        rate = len(cuts) / seconds
        normals = standard_normals(program, 256, 0)
        sample = counts[:64]
        _, mc_seconds = timed(monte_carlo, program, model, sample, normals)
        print(
            f"throughput {run.model.name} PP={pp} VPP={vpp} M={microbatches}: "
            f"{rate:,.0f} layouts/s noise-free "
            f"({len(cuts):,} per batch), {64 / mc_seconds:,.0f} layouts/s with 256 Monte Carlo "
            f"samples (= {64 * 256 / mc_seconds:,.0f} simulated steps/s), one core"
        )


def handbook_plan() -> None:
    recipe = load_recipe(HANDBOOK)
    costs = load_costs(HANDBOOK_COSTS)
    spec = SearchSpec(num_microbatches=32)
    options = PlanOptions(top=10, hbm_gib=131)
    plan(recipe.model, recipe.parallel, costs, spec, options)  # warm the schedule cache
    compile_schedule.cache_clear()
    result, seconds = timed(plan, recipe.model, recipe.parallel, costs, spec, options)
    best = result.candidates[0]
    print(
        f"handbook plan PP=4 (680 layouts + baselines, Monte Carlo, memory): {seconds:.2f} s; "
        f"pick {best.layout} {result.speedup(best, 'Megatron default'):.2f}x vs default, "
        f"{result.speedup(best, 'count-based rule'):.2f}x vs count-based"
    )


def deepseek() -> None:
    recipe = with_parallel(load_recipe(DEEPSEEK), pp=16, ep=8, dp=8)
    costs = costs_from_flops(recipe.model, recipe.parallel)
    for vpp in (1, 2):
        run = replace(recipe, parallel=replace(recipe.parallel, vpp=vpp))
        spec = SearchSpec(num_microbatches=64)
        result, seconds = timed(plan, run.model, run.parallel, costs, spec, PlanOptions(top=5))
        best = result.candidates[0]
        gap = max(0.0, 1 - result.proven_bound_ms / best.noise_free_ms)
        state = "proven optimal" if result.complete else f"proven within {gap:.1%}"
        print(
            f"DeepSeek-V3 61+1 PP=16 VPP={vpp} M=64 (FLOP costs): {seconds:.1f} s, "
            f"{result.space_size:.2e} layouts, {result.scored:,} simulated, "
            f"{result.nodes:,} search nodes, {state}; pick {best.layout}"
        )


def ray_sharding() -> None:
    import ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    recipe = with_parallel(load_recipe(HANDBOOK), pp=4, vpp=2, ep=2, dp=2)
    costs = load_costs(HANDBOOK_COSTS)
    spec = SearchSpec(num_microbatches=32, allow_standalone_mtp=True)
    options = PlanOptions(top=10, block_size=2048)
    local, alone = timed(plan, recipe.model, recipe.parallel, costs, spec, options)
    ray.init(num_cpus=4, include_dashboard=False, object_store_memory=200 * 2**20,
             logging_level="ERROR")  # fmt: skip
    try:
        sharded_spec = replace(spec, shards=4)
        plan(recipe.model, recipe.parallel, costs, sharded_spec, options)  # start the workers
        sharded, seconds = timed(plan, recipe.model, recipe.parallel, costs, sharded_spec, options)
    finally:
        ray.shutdown()
    same = sharded.candidates == local.candidates
    print(
        f"Ray sharding, handbook PP=4 VPP=2 ({local.scored:,} layouts), local 4-CPU Ray on "
        f"{os.cpu_count()} cores: 1 process {alone:.2f} s, 4 shards {seconds:.2f} s "
        f"({alone / seconds:.2f}x), identical top: {same}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-ray", action="store_true")
    args = parser.parse_args()
    throughput()
    handbook_plan()
    deepseek()
    if not args.skip_ray:
        ray_sharding()


if __name__ == "__main__":
    main()
