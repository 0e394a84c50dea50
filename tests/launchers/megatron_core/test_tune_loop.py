"""The whole tune loop on the megatron-core backend (across modules): profiling runs of real
megatron-core ranks on the embedded cluster, the fit of their timers, the plan, a live A/B and the
report, for the tiny MoE with MTP on PP 2; and the fit of two real runs predicting a third."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.megatron_core_fits import (
    QUIET_IDLE_SHARE,
    DesignFit,
    Miss,
    fit_design_runs,
    idle_share,
    median_step,
    until_one_meets,
)
from tests.helpers.paths import ROOT


@pytest.mark.slow
def test_the_tiny_loop_profiles_fits_plans_ab_tests_and_reports(tmp_path):
    runs: list[subprocess.CompletedProcess[str]] = []
    idle = idle_share(lambda: runs.append(_tune(tmp_path)))
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


@pytest.mark.slow
def test_the_fit_of_two_real_runs_predicts_a_third_layouts_step(tmp_path):
    """Profile the design's two layouts, fit, simulate a layout never run, then run it: the
    prediction is within the 10% floor of its measured step (CPU times, one run at a time: -9.7%
    to +6.0% in six checks on 2 idle cores; docs/megatron_core.md).  CPU times on shared cores
    move with the machine's other work (two tries beside other work here missed by -17.8% and
    -29.1% with the cores 43% idle; a CI run's fit refused its own runs), so a miss gets up to
    two more tries from fresh runs; three misses fail, unless the cores were busy (then the test
    skips, saying so)."""
    until_one_meets(tmp_path, _fit_and_predict)


def _fit_and_predict(folder: Path) -> Miss | None:
    """One try: profile the design's two runs on PP 3, fit them, simulate ``Et|t*3|mL`` and run
    it.  None when the fit took the runs and predicted the third within 10%; otherwise what
    missed, and whether the cores were under the quiet idle share during the runs."""
    design = fit_design_runs(folder)
    if not isinstance(design, DesignFit):
        return design
    third = "Et|t*3|mL"
    predicted = float(design.simulate(third)["mean_ms"])
    design.profile(third, "3")
    measured = median_step(design.store, "3")
    off = (predicted - measured) / measured
    outcome = f"{third}: predicted {predicted:.1f} ms, measured {measured:.1f} ms ({off:+.1%})"
    print(f"{outcome}; {design.cores}")
    return None if abs(off) < 0.10 else design.miss(outcome)
