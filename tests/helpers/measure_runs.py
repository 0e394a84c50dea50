"""The handbook recipe's profiling runs as the fit sees them, built from known unit costs.

Shared by the tests of the fit, the profile design, the observations and the memory
calibration: the recipe, its example costs (the truth the fit should give back) and noise-free
or noisy observations of runs of given layouts (``synthetic_runs`` writes their logs).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from ray_layout.measure.logs import parse_log
from ray_layout.measure.observations import RunObservation, observation_from_log
from ray_layout.model.costs import UnitCosts, load_costs
from ray_layout.model.layout import Layout
from ray_layout.model.spec import ParallelConfig, Recipe, load_recipe_file
from tests.helpers.synthetic_runs import synthetic_log

HANDBOOK = load_recipe_file("configs/handbook_7b_a1b.yaml")
TRUTH = load_costs("configs/costs/handbook_h200_example.json")
MICROBATCHES = 8
# Two layouts that identify the handbook's units on PP=4 (the fit's fixture runs)
QUICKSTART = ("Et*4|t*6|t*6|mL", "E|t*8|t*7|tmL")
# The design the tune profiles for the handbook on PP=4 with 32 micro-batches and 131 GiB, under
# the FLOP guess (its MoE layers carry their EP 2 all-to-alls)
HANDBOOK_DESIGN = ("Et*5|t*6|t*5|mL", "E|t*7|t*7|t*2mL")
# Layouts that keep MTP beside the loss: the simulator multiplies an MTP-standalone layout's step
# by ``mtp_standalone_factor`` (1.12), which the synthetic logs do not print, so the step-time
# checks use layouts the factor does not touch.
KEPT = ("Ett|t*6|t*8|mL", "E|t*8|t*8|mL")


def observe(
    texts: Sequence[str],
    noise_cv: float = 0.0,
    iterations: int = 8,
    costs: UnitCosts = TRUTH,
    recipe: Recipe = HANDBOOK,
) -> list[RunObservation]:
    """A run of each layout in ``texts`` under ``costs``, MICROBATCHES each, a seed each."""
    runs = []
    for index, text in enumerate(texts):
        layout = Layout.parse(text, recipe.parallel.pp)
        log = synthetic_log(
            recipe.model,
            recipe.parallel,
            layout,
            costs,
            MICROBATCHES,
            iterations=iterations,
            noise_cv=noise_cv,
            seed=index,
        )
        observed = observation_from_log(
            f"run{index}", parse_log(log), layout, recipe.parallel, MICROBATCHES
        )
        runs.append(observed)
    return runs


ON_4_GPU_NODES = replace(TRUTH, gpus_per_node=4)  # PP=4 x DP=2: stages 0-1 and 2-3 share a node


def observe_on(
    costs: UnitCosts,
    texts: Sequence[str] = KEPT,
    extra_p2p_ms: float = 0.0,
    parallel: ParallelConfig = HANDBOOK.parallel,
    steps: bool = True,
    microbatches: Sequence[int] = (MICROBATCHES, MICROBATCHES),
) -> list[RunObservation]:
    """Noise-free runs of ``texts`` (with ``microbatches``) simulated on
    ``costs.gpus_per_node``-GPU nodes; the printed step pays ``extra_p2p_ms`` on every transfer
    (the timers do not); ``steps=False`` drops the iteration lines, as a log without them
    would."""
    runs = []
    for index, (text, count) in enumerate(zip(texts, microbatches, strict=True)):
        layout = Layout.parse(text, parallel.pp)
        log = synthetic_log(HANDBOOK.model, parallel, layout, costs, count, iterations=8,
                            seed=index, extra_p2p_ms=extra_p2p_ms)  # fmt: skip
        if not steps:
            log = "".join(line for line in log.splitlines(True) if " iteration " not in line)
        runs.append(observation_from_log(f"run{index}", parse_log(log), layout, parallel,
                                         count))  # fmt: skip
    return runs


# Runs of 8 and 32 micro-batches: the latency costs the longer one more transfers, a fixed tail
# the same, so their steps tell the two apart.
APART = (MICROBATCHES, 4 * MICROBATCHES)
