"""How long the layout x recompute search takes, and how close to the optimum its pick is.

    python benchmarks/bench_recompute.py          # about a minute on 2 cores

Cases (FLOP costs at 400 TFLOP/s unless named): the handbook recipe at PP 4 in 30 GiB with the
example costs (nothing fits without recomputation) and with no limit; the model zoo's
DeepSeek-V3 H100 recipe without its recompute flags at PP 8 VPP 4 (its own shape) and at PP 16
in 80 GiB.  For each: wall time, the settings planned and skipped, the pick, its setting and
what recomputing costs its step, and the gap (how far the pick may be from the fastest pair that
fits: 0 where every setting's search was exhaustive or proven).  Target: the joint plan of
DeepSeek-V3 at PP 16 well under a minute on 2 cores.
"""

from __future__ import annotations

import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ray_layout.model.costs import UnitCosts, costs_from_flops, load_costs  # noqa: E402
from ray_layout.model.memory_settings import with_recompute  # noqa: E402
from ray_layout.model.spec import Recipe, load_recipe_file, with_parallel  # noqa: E402
from search.planner import PlanOptions, Problem, SearchSpec  # noqa: E402
from search.recompute_search import joint_plan, recompute_price  # noqa: E402

TARGET_S = 60.0


def _without_recompute(recipe: Recipe) -> Recipe:
    plain = recipe.flags.memory.without_recompute()
    return replace(recipe, megatron_args=with_recompute(recipe.megatron_args, plain))


def _microbatches(recipe: Recipe) -> int:
    parallel = recipe.parallel
    return parallel.global_batch_size // (parallel.micro_batch_size * parallel.dp)


def _case(name: str, recipe: Recipe, costs: UnitCosts | None, hbm: float | None) -> dict:
    costs = costs or costs_from_flops(recipe.model, recipe.parallel)
    options = PlanOptions(top=3, hbm_gib=hbm)
    problem = Problem.of(recipe, costs, SearchSpec(_microbatches(recipe)), options)
    start = time.perf_counter()
    found = joint_plan(problem)
    seconds = time.perf_counter() - start
    pick = found.candidates[0] if found.candidates else None
    price = None if pick is None else recompute_price(pick, problem)
    return {
        "case": name,
        "seconds": seconds,
        "planned": sum(t.plan is not None for t in found.tried),
        "skipped": sum(t.plan is None for t in found.tried),
        "pick": str(pick.layout) if pick else "nothing fits",
        "recompute": " ".join(pick.recompute) if pick and pick.recompute else "none",
        "step_ms": pick.mean_ms if pick else None,
        "price": price,
        "gap": found.gap,
        "peak_gib": pick.peak_memory_gib if pick else None,
    }


def main() -> None:
    handbook = with_parallel(load_recipe_file("configs/handbook_7b_a1b.yaml"), pp=4)
    example = load_costs("configs/costs/handbook_h200_example.json")
    zoo = _without_recompute(load_recipe_file("configs/deepseek_v3_zoo_h100.yaml"))
    cases = [
        ("handbook PP4, example costs, 30 GiB", handbook, example, 30.0),
        ("handbook PP4, example costs, no limit", handbook, example, None),
        ("DeepSeek-V3 zoo PP8 VPP4, 80 GiB", zoo, None, 80.0),
        ("DeepSeek-V3 zoo PP16, 80 GiB", with_parallel(zoo, pp=16, vpp=1), None, 80.0),
    ]
    rows = [_case(*case) for case in cases]
    for row in rows:
        step = "-" if row["step_ms"] is None else f"{row['step_ms']:,.1f} ms"
        price = "" if row["price"] is None else f" ({row['price']:+.1%} for recomputation)"
        print(
            f"{row['case']}: {row['seconds']:.1f} s, {row['planned']} settings planned, "
            f"{row['skipped']} skipped; pick {row['pick']} + {row['recompute']}, {step}{price}, "
            f"peak {row['peak_gib'] or 0:.1f} GiB, gap {row['gap']:.1%}"
        )
    deepest = rows[-1]["seconds"]
    verdict = "within" if deepest < TARGET_S else "OVER"
    print(f"DeepSeek-V3 PP16 joint plan: {deepest:.1f} s, {verdict} the {TARGET_S:.0f} s target")


if __name__ == "__main__":
    main()
