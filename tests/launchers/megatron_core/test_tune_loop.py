"""The whole tune loop on the megatron-core backend (across modules): profiling runs of real
megatron-core ranks on the embedded cluster, the fit of their timers, the plan, a live A/B and the
report, for the tiny MoE with MTP on PP 2; and the fit of two real runs predicting a third."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from ray_layout.measure.store import CostStore
from tests.helpers.paths import ROOT


@pytest.mark.slow
def test_the_tiny_loop_profiles_fits_plans_ab_tests_and_reports(tmp_path):
    runs: list[subprocess.CompletedProcess[str]] = []
    idle = _idle_share(lambda: runs.append(_tune(tmp_path)))
    (done,) = runs
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert "profiling runs on the megatron-core backend" in out
    # on PP 2 the embedding always shares a stage with a decoder layer: three runs tell E,
    # the dense layer and the MoE layer apart
    assert len(re.findall(r"^  \S+: finished$", out, re.M)) == 3
    for unit in ("E", "t_moe", "t_dense"):
        assert re.search(rf"{unit}: forward \d+\.\d+ ms", out)
    # the pick (the count rule's layout here) against Megatron's default, both run live
    assert "2 arms of 2 GPUs" in out
    assert re.search(r"default Ett\|t\*2mL: \d+ iterations", out)
    measured, predicted = (
        float(x) for x in re.search(r"Step: measured (\S+) ms, predicted (\S+) ms", out).groups()
    )
    off = (predicted - measured) / measured
    print(f"A/B arm: predicted {predicted} ms, measured {measured} ms, cores idle {idle:.0%}")
    if idle < QUIET_IDLE_SHARE and abs(off) >= 0.2:  # CPU times on shared cores (docs)
        pytest.skip(f"other work kept the cores busy during the tune (idle {idle:.0%}): {off:+.1%}")
    assert abs(off) < 0.2
    assert (tmp_path / "report/report.md").exists()


def _tune(tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """The tune of the tiny MoE with MTP on PP 2, as a user starts it."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "ray_layout.tune",
            "configs/tiny_moe_mtp.yaml",
            "--pp",
            "2",
            "--backend",
            "megatron-core",
            "--gpus-per-node",
            "4",
            "--profile-iters",
            "8",
            "--ab-top",
            "1",
            "--ab-warmup",
            "2",
            "--ab-batch",
            "3",
            "--ab-looks",
            "2,4",
            "--store",
            str(tmp_path / "store"),
            "--report-dir",
            str(tmp_path / "report"),
            "--study",
            "tiny",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1200,
    )


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ray_layout", *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )


def _cli(*argv: str) -> str:
    done = _run(*argv)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def _median_step(store: Path, study: str) -> float:
    """The median step of a study's only run, past its first two iterations."""
    iterations = CostStore(store).read("iterations", study=study)
    return float(iterations[iterations.iteration > 2].elapsed_ms.median())


# One rank computes at a time (the compute lock), so the runs keep about one of two cores busy;
# below this idle share something else was running, which inflates CPU times (docs)
QUIET_IDLE_SHARE = 0.25


def _idle_share(work: Callable[[], object]) -> float:
    """The share of the machine's CPU time left idle while ``work`` ran (/proc/stat); 1 where
    the machine does not say."""
    before = _cpu_times()
    work()
    after = _cpu_times()
    spent = [b - a for a, b in zip(before, after, strict=True)]
    return (spent[3] + spent[4]) / sum(spent) if sum(spent) else 1.0


def _cpu_times() -> list[int]:
    """The machine's cumulative CPU times (user, nice, system, idle, iowait, ...) in ticks."""
    stat = Path("/proc/stat")
    return [int(x) for x in stat.read_text().split()[1:9]] if stat.exists() else [0] * 8


@pytest.mark.slow
def test_the_fit_of_two_real_runs_predicts_a_third_layouts_step(tmp_path):
    """Profile the design's two layouts, fit, simulate a layout never run, then run it: the
    prediction is within the 10% floor of its measured step (CPU times, one run at a time: -9.7%
    to +6.0% in six checks on 2 idle cores; docs/megatron_core.md).  CPU times on shared cores
    move with the machine's other work (two tries beside other work here missed by -17.8% and
    -29.1% with the cores 43% idle; a CI run's fit refused its own runs), so a miss gets up to
    two more tries from fresh runs; three misses fail, unless the cores were busy (then the test
    skips, saying so)."""
    misses = []
    for attempt in ("first", "second", "third"):
        miss = _fit_and_predict(tmp_path / attempt)
        if miss is None:
            return
        misses.append(miss)
    outcomes = "; ".join(text for text, _ in misses)
    if any(busy for _, busy in misses):
        pytest.skip(f"other work kept the cores busy during the runs: {outcomes}")
    pytest.fail(f"three tries missed: {outcomes}")


def _fit_and_predict(folder: Path) -> tuple[str, bool] | None:
    """One try: profile the design's two runs on PP 3, fit them, simulate ``Et|t*3|mL`` and run
    it.  None when the fit took the runs and predicted the third within 10%; otherwise what
    missed, and whether the cores were under the quiet idle share during the runs."""
    store, base = folder / "store", ["configs/tiny_moe_mtp.yaml", "--pp", "3"]
    # one GPU per node: the embedded cluster has room for one run at a time, so no run's CPU
    # times are inflated by another sharing the cores
    core = ["--backend", "megatron-core", "--gpus-per-node", "1", "--train-iters", "8"]
    profile = [*base, *core, "--store", str(store)]
    idle = [_idle_share(lambda: _cli("profile", *profile, "--study", "fit"))]
    costs = folder / "costs.json"
    fit = _run("fit", *base, "--store", str(store), "--study", "fit", "-o", str(costs))
    cores = f"cores idle {idle[0]:.0%} during the runs"
    if fit.returncode != 0:
        assert "miss the measured compute" in fit.stderr, fit.stdout[-3000:] + fit.stderr[-3000:]
        return f"fit refused ({fit.stderr.strip()}); {cores}", idle[0] < QUIET_IDLE_SHARE
    third = "Et|t*3|mL"
    simulated = json.loads(
        _cli("simulate", base[0], third, *base[1:], "--costs", str(costs), "--json")
    )
    idle.append(_idle_share(lambda: _cli("profile", *profile, "--layout", third, "--study", "3")))
    measured = _median_step(store, "3")
    off = (simulated["mean_ms"] - measured) / measured
    outcome = (
        f"{third}: predicted {simulated['mean_ms']:.1f} ms, measured {measured:.1f} ms "
        f"({off:+.1%}); cores idle {', '.join(f'{share:.0%}' for share in idle)} during the runs"
    )
    print(outcome)
    return None if abs(off) < 0.10 else (outcome, min(idle) < QUIET_IDLE_SHARE)
