"""Search benchmarks: seven planning cases (16 layers to DeepSeek-V3), throughput, Ray sharding.

    python benchmarks/bench_search.py              # everything (about two minutes on 2 cores)
    python benchmarks/bench_search.py --skip-ray   # without the Ray sharding run
    python benchmarks/bench_search.py --only 4     # one planning case

Prints one line per measurement; the table in docs/search.md comes from this script.
"""

from __future__ import annotations

import argparse
import itertools
import os
import time
from dataclasses import dataclass, replace

import numpy as np

from ray_layout.model.costs import UnitCosts, costs_from_flops, load_costs
from ray_layout.model.loading import load_recipe
from ray_layout.model.spec import Recipe, build_recipe, with_parallel
from search.cost_model import build_cost_model
from search.evaluate import score
from search.pipeline_ops import ScheduleShape
from search.planner import Plan, PlanOptions, Problem, SearchSpec, plan
from search.schedule import compile_schedule
from search.space import LayoutSpace

HANDBOOK = "configs/handbook_7b_a1b.yaml"
HANDBOOK_COSTS = "configs/costs/handbook_h200_example.json"
DEEPSEEK = "tests/data/hf/DeepSeek-V3/config.json"
BLOCKING_P2P = ("--no-overlap-p2p-communication",)  # the interleaved schedule without overlap
EP_OVERLAP = ("--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute")  # combined 1F1B
QWEN3_30B = "tests/data/hf/Qwen3-30B-A3B/config.json"


def dense_recipe(layers: int, pp: int, name: str) -> Recipe:
    """A Llama-class dense model (hidden 8192 from 80 layers on, else 4096), 128k vocabulary."""
    hidden = 8192 if layers >= 80 else 4096
    model = {"name": name, "num_layers": layers, "hidden_size": hidden,
             "num_attention_heads": hidden // 128, "num_query_groups": 8,
             "ffn_hidden_size": 28672 if hidden == 8192 else 14336, "seq_length": 4096,
             "vocab_size": 128256}  # fmt: skip
    return build_recipe(model, {"pp": pp, "dp": 1, "micro_batch_size": 1}, source=name)


def measured_like(recipe: Recipe, base: float = 10.0, output: float = 3.8) -> UnitCosts:
    """Costs shaped like a measurement: per decoder layer ``base`` ms forward, the MTP block
    1.4x and the output layer ``output`` x a layer (3.8: the handbook's measured ratio),
    backward twice; the step tail and p2p as the FLOP model derives them."""
    ratios = {"E": 0.1, "t": 1.0, "t_dense": 1.0, "t_moe": 1.0, "m": 1.4, "L": output}
    flops = costs_from_flops(recipe.model, recipe.parallel)
    forward = {u: base * ratios[u] for u in flops.forward_ms}
    return replace(flops, forward_ms=forward, backward_ms={u: 2 * v for u, v in forward.items()},
                   jitter_cv={u: 0.03 for u in forward}, source="benchmark")  # fmt: skip


@dataclass(frozen=True)
class Case:
    label: str
    recipe: Recipe
    costs: UnitCosts
    microbatches: int
    target_s: float


def cases() -> list[Case]:
    handbook = load_recipe(HANDBOOK)
    deepseek = with_parallel(load_recipe(DEEPSEEK), pp=16, ep=8, dp=8)
    found = [Case("1. handbook 16+1 MTP, PP 4, M 32", handbook, load_costs(HANDBOOK_COSTS), 32,
                  0.2)]  # fmt: skip
    dense_32 = dense_recipe(32, 8, "dense-32L")
    found.append(Case("2. dense 32 layers, PP 8, M 128, output-heavy (L = 6 layers)", dense_32,
                      measured_like(dense_32, output=6.0), 128, 2.0))  # fmt: skip
    qwen = load_recipe(QWEN3_30B)
    for pp in (8, 16):
        run = with_parallel(qwen, pp=pp, ep=8, dp=8)
        found.append(Case(f"3. Qwen3-30B-A3B 48 layers, PP {pp}, M 64", run, measured_like(run),
                          64, 5.0))  # fmt: skip
    for pp in (8, 16):
        run = dense_recipe(80, pp, "dense-80L")
        found.append(Case(f"3. Llama-70B-class 80 layers, PP {pp}, M 64", run,
                          measured_like(run), 64, 5.0))  # fmt: skip
    for vpp in (1, 2):
        run = with_parallel(deepseek, vpp=vpp) if vpp > 1 else deepseek
        step = 4 if vpp == 1 else 5
        found.append(Case(f"{step}. DeepSeek-V3 61+1 MTP, PP 16, VPP {vpp}, M 64, measured-like",
                          run, measured_like(run), 64, 10.0))  # fmt: skip
        found.append(Case(f"{step}. DeepSeek-V3 61+1 MTP, PP 16, VPP {vpp}, M 64, FLOP costs",
                          run, costs_from_flops(run.model, run.parallel), 64, 10.0))  # fmt: skip
    blocking = replace(with_parallel(deepseek, vpp=2), megatron_args=BLOCKING_P2P)
    for costs, name in (
        (measured_like(blocking), "measured-like"),
        (costs_from_flops(blocking.model, blocking.parallel), "FLOP costs"),
    ):
        found.append(Case(f"5. DeepSeek-V3 61+1 MTP, PP 16, VPP 2, M 64, {name}, blocking p2p",
                          blocking, costs, 64, 10.0))  # fmt: skip
    combined = replace(with_parallel(deepseek, vpp=2, ep=64, dp=64), megatron_args=EP_OVERLAP)
    for costs, name in (  # measured-like: dispatch and combine 4 of a layer's 10 ms forward
        (replace(measured_like(combined), a2a_ms=2.0), "measured-like"),
        (costs_from_flops(combined.model, combined.parallel), "FLOP costs"),
    ):
        found.append(Case(f"7. DeepSeek-V3 61+1 MTP, PP 16, VPP 2, EP 64, M 64, {name}, "
                          "combined 1F1B", combined, costs, 64, 10.0))  # fmt: skip
    for pp in (16, 32):
        run = dense_recipe(94, pp, "Qwen3-235B-class-94L")
        found.append(Case(f"6. 94 layers, PP {pp}, M 128", run, measured_like(run), 128, 10.0))
    return found


def run_case(case: Case) -> Plan:
    spec = SearchSpec(num_microbatches=case.microbatches)
    options = PlanOptions(top=10)
    started, cpu = time.perf_counter(), time.process_time()
    result = plan(Problem.of(case.recipe, case.costs, spec, options))
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    best = result.candidates[0]
    if result.proven_bound_ms is None:
        proof = "all scored"
    else:
        gap = max(0.0, 1 - result.proven_bound_ms / best.noise_free_ms)
        proof = "proven optimal" if gap < 1e-9 else f"proven gap {gap:.2%}"
        proof += "" if result.complete else " (top 10 unfinished)"
    print(
        f"{case.label}: {seconds:.2f} s wall, {cpu:.2f} s CPU (target < {case.target_s:g} s), "
        f"{result.space_size:.3g} layouts, {result.scored:,} scored, {result.schedule}, "
        f"{result.method}, {proof}; "
        f"pick {best.layout} ({result.ties[0]:,} tied)"
        + (f"; gap: {result.bound_reason}" if result.bound_reason else "")
    )
    return result


def throughput() -> None:
    """Noise-free scoring rate of one core (the planner's inner loop) at PP 8, M 128."""
    run = dense_recipe(32, 8, "dense-32L")
    space = LayoutSpace(32, 0, 8)
    program = compile_schedule(ScheduleShape(8, 1, 128))
    model = build_cost_model(run.model, run.parallel, measured_like(run), 128)
    cuts = np.concatenate(list(itertools.islice(space.cut_blocks(4096), 4)))
    counts = space.unit_counts(cuts, model.units, model.moe_pattern)
    score(program, model, counts[:64])
    started = time.perf_counter()
    score(program, model, counts)
    rate = len(cuts) / (time.perf_counter() - started)
    print(f"noise-free scoring, PP 8, M 128: {rate:,.0f} layouts/s/core ({len(cuts):,} layouts)")


def ray_sharding() -> None:
    import ray

    from ray_layout.runtime.sharding import ray_map_shards

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    case = next(c for c in cases() if c.label.startswith("3. Qwen3") and "PP 16" in c.label)
    # no time limit: the shards must finish for their top to be the whole top
    spec = SearchSpec(num_microbatches=case.microbatches, shards=2, time_limit_s=120.0)
    options = PlanOptions(top=10)
    started = time.perf_counter()
    local = plan(Problem.of(case.recipe, case.costs, replace(spec, shards=1), options))
    alone = time.perf_counter() - started
    ray.init(address="local", num_cpus=2, include_dashboard=False,
             object_store_memory=200 * 2**20,
             logging_level="ERROR")  # fmt: skip
    try:
        started = time.perf_counter()
        sharded = plan(
            Problem.of(case.recipe, case.costs, spec, options),
            map_shards=ray_map_shards,
        )
        seconds = time.perf_counter() - started
    finally:
        ray.shutdown()
    same = sharded.candidates == local.candidates and sharded.ties == local.ties
    finished = local.complete and sharded.complete
    print(f"Ray sharding, {case.label}: 1 process {alone:.1f} s, 2 Ray tasks on "
          f"{os.cpu_count()} cores {seconds:.1f} s; identical top 10 and tie counts: {same} "
          f"(both finished: {finished})")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-ray", action="store_true")
    parser.add_argument("--only", help="run only the planning cases whose label starts so")
    args = parser.parse_args()
    if args.only is None:
        throughput()
    for case in cases():
        if args.only is None or case.label.startswith(args.only):
            run_case(case)
    if not args.skip_ray and args.only is None:
        ray_sharding()


if __name__ == "__main__":
    main()
