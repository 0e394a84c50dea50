"""How faithful is the emulated cluster to its own profile?  Profile it as the tune does, fit,
and hold the fit and the measured steps against the costs the ranks were given.

    python benchmarks/bench_emulator.py                  # about 1 min on 2 cores
    python benchmarks/bench_emulator.py --iterations 20  # longer runs, steadier means

Setup: the quickstart (``make run``): the handbook recipe (configs/handbook_7b_a1b.yaml) with
``--pp 4`` = PP 4 x DP 2 x EP 2 = 8 ranks, global batch 128 (32 micro-batches), on nodes of 4
GPUs (so a pipeline crosses a node), every rank the CPU-emulated Megatron sleeping the costs of
cluster_configs/hardware/h200_emulated.yaml.  The runs are the layouts the tune profiles
(``profile_design`` called as the driver's profiling phase calls it: FLOP-guessed costs,
``--hbm-gb 131``, MTP beside the loss), ``--profile-iters 8`` iterations each, one after the
other, each rank the command the tune's profiling runs (``rank_command``) started as a plain
subprocess (no Ray: its start-up would only add load); the logs are parsed and fitted with
``fit_costs`` as the tune fits them.  Each rank's residual overhead (ops that ended past their
deadline) comes from the ``emulator:`` line of its stderr.

Targets: fitted unit costs (t, E, m + L, forward and backward) within 3% of the profile; p2p
within 25% or 0.2 ms; each run's measured mean step within 2% of the simulator's step for its
layout under the ranks' own costs.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from launchers.emulated.config import run_config  # noqa: E402
from launchers.emulated.environment import NODE_ENV  # noqa: E402
from launchers.emulated.hardware import load_profile  # noqa: E402
from launchers.emulated.rank_costs import RankCosts, rank_costs  # noqa: E402
from launchers.megatron import MegatronRunSettings  # noqa: E402
from ray_layout.measure.design import PAIR, profile_design  # noqa: E402
from ray_layout.measure.fit import fit_costs  # noqa: E402
from ray_layout.measure.logs import parse_log  # noqa: E402
from ray_layout.measure.observations import observation_from_log  # noqa: E402
from ray_layout.measure.step_fit import simulated_step_ms  # noqa: E402
from ray_layout.model.costs import costs_from_flops  # noqa: E402
from ray_layout.model.layout import Layout  # noqa: E402
from ray_layout.model.spec import Recipe, load_recipe_file, with_parallel  # noqa: E402
from ray_layout.runtime.layout_runs import Backend, rank_command  # noqa: E402
from search.pipeline_ops import ScheduleShape  # noqa: E402
from search.schedule import compile_schedule  # noqa: E402
from search.simulator import simulate, stage_durations  # noqa: E402

PROFILE = ROOT / "cluster_configs/hardware/h200_emulated.yaml"
GPUS_PER_NODE, HBM_GIB, PROFILE_ITERS = 4, 131.0, 8  # the quickstart's (Makefile: make run)
UNIT_BOUND, P2P_BOUND, P2P_SLACK_MS, STEP_BOUND = 0.03, 0.25, 0.2, 0.02
OVERHEAD_LINE = re.compile(
    r"emulator: rank (\d+): (\d+) of (\d+) ops ended past their deadline, "
    r"by ([\d.]+) ms on average and ([\d.]+) ms at most"
)


def load() -> str:
    return " / ".join(f"{value:.2f}" for value in os.getloadavg())


def residual_overhead(stderr: list[str]) -> tuple[int, int, float, float]:
    """Ops past their deadline, ops in all, the mean and the worst lateness (emulated ms)."""
    late = total = 0
    weighted = worst = 0.0
    for match in (m for text in stderr for m in OVERHEAD_LINE.finditer(text)):
        n, ops = int(match[2]), int(match[3])
        late, total = late + n, total + ops
        weighted += n * float(match[4])
        worst = max(worst, float(match[5]))
    return late, total, weighted / late if late else 0.0, worst


def run_ranks(recipe: Recipe, layout: Layout, iterations: int, scratch: Path) -> tuple[str, list]:
    """Every rank of one run at once, as a launcher would: the last rank's stdout (iterations
    and timers) with every rank's memory lines, and every rank's stderr."""
    settings = MegatronRunSettings(train_iters=iterations)
    command, extra = rank_command(Backend("emulated", hardware_profile=PROFILE), recipe, layout,
                                  settings)  # fmt: skip
    world, port = recipe.parallel.world_size, free_port()
    processes = []
    for rank in range(world):
        env = (
            os.environ
            | extra
            | {
                "RANK": str(rank),
                "WORLD_SIZE": str(world),
                "LOCAL_RANK": str(rank % GPUS_PER_NODE),
                NODE_ENV: str(rank // GPUS_PER_NODE),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
            }
        )
        with open(scratch / f"{rank}.out", "w") as out, open(scratch / f"{rank}.err", "w") as err:
            processes.append(subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=err))
    codes = [process.wait(timeout=600) for process in processes]
    stderr = [(scratch / f"{rank}.err").read_text() for rank in range(world)]
    if any(codes):
        raise SystemExit(f"{layout}: ranks exited {codes}: {stderr}")
    stdout = "".join((scratch / f"{rank}.out").read_text() for rank in range(world))
    return stdout, stderr


def own_costs(recipe: Recipe, layout: Layout) -> list[RankCosts]:
    """What each PP rank of the run was given to sleep (the profile through the emulator)."""
    command, _ = rank_command(Backend("emulated", hardware_profile=PROFILE), recipe, layout,
                              MegatronRunSettings())  # fmt: skip
    config = run_config(command[3:], recipe.parallel.world_size)
    profile = load_profile(PROFILE)
    return [rank_costs(config, profile.costs, rank) for rank in range(layout.pp)]


def simulated_own_step(recipe: Recipe, ranks: list[RankCosts]) -> float:
    """The simulator (search.simulator, an implementation of its own) on the ranks' own costs:
    their compute, their step tail and the links of nodes of GPUS_PER_NODE."""
    pp, per_stage = len(ranks), recipe.parallel.world_size // len(ranks)
    truth = load_profile(PROFILE).costs
    links = [truth.p2p_intra_node_ms if stage * per_stage // GPUS_PER_NODE
             == (stage + 1) % pp * per_stage // GPUS_PER_NODE else truth.p2p_inter_node_ms
             for stage in range(pp)]  # fmt: skip
    step = simulate(
        compile_schedule(ScheduleShape(pp, 1, recipe.parallel.num_microbatches_or_none)),
        stage_durations([sum(rank.forward_ms) for rank in ranks]),
        stage_durations([sum(rank.backward_ms) for rank in ranks]),
        np.array(links),
        tail_ms=np.array([rank.grad_sync_ms + rank.optimizer_ms for rank in ranks]),
    ).step
    return float(step[0])


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=PROFILE_ITERS)
    args = parser.parse_args(argv)
    recipe = with_parallel(load_recipe_file(ROOT / "configs/handbook_7b_a1b.yaml"), pp=4)
    truth = load_profile(PROFILE).costs
    microbatches = recipe.parallel.num_microbatches_or_none
    guess = costs_from_flops(recipe.model, replace(recipe.parallel, vpp=1))
    design = profile_design(recipe.model, recipe.parallel, microbatches, guess, hbm_gib=HBM_GIB,
                            standalone_mtp=False)  # fmt: skip
    print(f"design: {', '.join(map(str, design.layouts))} (worst relative error "
          f"{design.worst_relative_error:.2f} x cv), {args.iterations} iterations of "
          f"{microbatches} micro-batches each")  # fmt: skip
    observations, stderr, own = [], [], []
    print(f"load before: {load()}", flush=True)
    with tempfile.TemporaryDirectory() as scratch:
        for layout in design.layouts:
            stdout, errors = run_ranks(recipe, layout, args.iterations, Path(scratch))
            parallel = replace(recipe.parallel, vpp=layout.vpp)
            observations.append(observation_from_log(str(layout), parse_log(stdout), layout,
                                                     parallel, microbatches))  # fmt: skip
            stderr += errors
            own.append(own_costs(recipe, layout))
    print(f"load after: {load()}")
    late, ops, mean_late, worst_late = residual_overhead(stderr)
    fitted = fit_costs(recipe.model, recipe.parallel, observations, gpus_per_node=GPUS_PER_NODE)
    costs, passed = fitted.costs, True
    shortest = min(run.step_ms or np.inf for run in observations)
    rows = []
    for name, table, fits in (("forward", "forward_ms", fitted.forward_ms),
                              ("backward", "backward_ms", fitted.backward_ms)):  # fmt: skip
        want = getattr(truth, table)
        rows += [(f"{name} t", want["t"], fits["t"]), (f"{name} E", want["E"], fits["E"]),
                 (f"{name} {PAIR}", want["m"] + want["L"], fits[PAIR])]  # fmt: skip
    print(
        f"{'unit':<14}{'profile':>9}{'fitted':>9}{'error':>8}{'ms':>8}  target  "
        f"(error x {microbatches} micro-batches, of the shortest step {shortest:.0f} ms)"
    )
    for name, want, got in rows:
        error = got / want - 1
        passed &= abs(error) <= UNIT_BOUND
        print(
            f"{name:<14}{want:9.3f}{got:9.3f}{error:8.1%}{got - want:+8.3f}  "
            f"±{UNIT_BOUND:.0%}     {abs(got - want) * microbatches / shortest:.2%}"
        )
    latency = fitted.p2p_latency_ms
    for name, want, got in (
        ("p2p intra", truth.p2p_intra_node_ms, costs.p2p_intra_node_ms),
        ("p2p inter", truth.p2p_inter_node_ms, costs.p2p_inter_node_ms),
    ):
        ok = abs(got - want) <= max(P2P_BOUND * want, P2P_SLACK_MS)
        passed &= ok
        print(f"{name:<14}{want:9.3f}{got:9.3f}{got / want - 1:8.1%}{got - want:+8.3f}  "
              f"±{P2P_BOUND:.0%} or {P2P_SLACK_MS} ms (fit's latency {latency:.3f} ms "
              "included)")  # fmt: skip
    print("compute timers per micro-batch against the ranks' own costs (mean over intervals):")
    for run, ranks in zip(observations, own, strict=True):
        for name, table, given in (("forward", run.forward_ms, "forward_ms"),
                                   ("backward", run.backward_ms, "backward_ms")):  # fmt: skip
            timed = table.mean(axis=0) / run.num_microbatches
            errors = [
                t / sum(getattr(rank, given)) - 1 for t, rank in zip(timed, ranks, strict=True)
            ]
            print(f"  {run.layout!s:<18}{name:<9}" + " ".join(f"{e:+6.1%}" for e in errors))
    print(f"{'layout':<18}{'simulated':>10}{'measured':>10}{'error':>8}  target  (planner's)")
    for run, ranks in zip(observations, own, strict=True):
        simulated = simulated_own_step(recipe, ranks)
        planner = simulated_step_ms(recipe.model, recipe.parallel, truth, run)
        measured = run.step_ms or float("nan")
        error = measured / simulated - 1
        passed &= abs(error) <= STEP_BOUND
        print(f"{run.layout!s:<18}{simulated:10.1f}{measured:10.1f}{error:8.1%}  "
              f"±{STEP_BOUND:.0%}    {planner:.1f}")  # fmt: skip
    print(f"residual overhead: {late} of {ops} ops ended past their deadline, by "
          f"{mean_late:.3f} ms on average, {worst_late:.3f} ms at most (emulated ms)")  # fmt: skip
    print("all targets met" if passed else "some targets missed")
    return 0 if passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
