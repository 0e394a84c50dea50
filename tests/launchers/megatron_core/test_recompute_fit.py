"""A fit of real megatron-core runs without recompute predicts runs that recompute (across
modules: the backend's recompute settings, the profile and fit commands, the cost model's
recompute pricing and the simulator).  The design's two runs of the tiny MoE on PP 3 are fitted;
the fit, priced with each run's recompute settings, predicts ``Et|t*3|mL`` run with full
recompute (uniform, one layer per checkpoint) and with selective recompute of every layer's MLP
(``mlp`` on the dense layer, ``moe`` on the MoE layers and MTP), each within the 10% floor of its
measured step, or its step over the control's (the same layout run without recompute in the
same try) within 10% of the measured ratio: the price itself.  Where the fit misses the control,
the try cannot judge the price.  Each rank's backward-compute is printed beside."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest

from ray_layout.model.costs import load_costs, stage_compute_ms
from ray_layout.model.layout import Layout
from ray_layout.model.loading import load_recipe
from ray_layout.runtime.layout_runs import layout_recipe
from tests.helpers.megatron_core_fits import (
    TINY,
    DesignFit,
    Miss,
    fit_design_runs,
    median_rank_timer,
    median_step,
    until_one_meets,
)
from tests.helpers.paths import ROOT

THIRD = "Et|t*3|mL"
RECOMPUTE = {
    "full": "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1",
    # the modules whose CPU time follows their FLOPs on the tiny model; core_attn and layernorm
    # cost a checkpoint's overhead there, which FLOP shares do not see (docs/megatron_core.md)
    "selective": "--recompute-granularity selective --recompute-modules mlp moe",
}
STEP_BOUND = 0.10  # the fit-of-two-runs floor (docs/megatron_core.md)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(RECOMPUTE))
def test_a_fit_of_runs_without_recompute_predicts_a_run_that_recomputes(tmp_path, name):
    """CPU times on shared cores move with the machine's other work, so a miss gets up to two
    more tries from a fresh fit and run, as the fit of two runs predicting a third does
    (``test_tune_loop.py``)."""
    until_one_meets(tmp_path, partial(_fit_and_predict, name))


def _fit_and_predict(name: str, folder: Path) -> Miss | None:
    """One try: the design's two runs fitted, then the same layout predicted and run without
    recompute (the control) and with ``name``'s.  None when the prediction met its bounds;
    otherwise what missed.  A try whose control misses the floor says nothing of the recompute's
    price (the fit itself is off on this layout, as other work on the cores makes it): it counts
    as a busy try, which three of skip rather than fail."""
    design = fit_design_runs(folder)
    if not isinstance(design, DesignFit):
        return design
    control = float(design.simulate(THIRD)["mean_ms"])
    design.profile(THIRD, "control")
    plain = median_step(design.store, "control")
    if abs(control - plain) / plain >= STEP_BOUND:
        text = f"{THIRD} without recompute: predicted {control:.1f} ms, measured {plain:.1f} ms"
        return f"{text}; {design.cores}", True
    config = _with_flags(folder / f"{name}.yaml", RECOMPUTE[name])
    predicted = float(design.simulate(THIRD, config)["mean_ms"])
    design.profile(THIRD, name, config)
    measured = median_step(design.store, name)
    off = (predicted - measured) / measured
    # what recomputing adds, predicted and measured against the control of the same try: the
    # price alone, free of the drift the fit and the cores share between the two runs
    priced = (predicted / control) / (measured / plain) - 1
    backward = _backward_offs(design, config, name)
    met = abs(off) < STEP_BOUND or abs(priced) < STEP_BOUND
    outcome = (
        f"{THIRD} with {name} recompute: predicted {predicted:.1f} ms, measured {measured:.1f} ms "
        f"({off:+.1%}; over the control {priced:+.1%}); backward-compute per rank "
        f"{', '.join(f'{e:+.1%}' for e in backward)}"
    )
    print(f"{outcome}; {design.cores}")
    return None if met else design.miss(outcome)


def _with_flags(path: Path, flags: str) -> Path:
    """A copy of the tiny MoE's config whose job runs with ``flags``."""
    text = (ROOT / TINY).read_text()
    assert "megatron_args" not in text
    path.write_text(f"{text}megatron_args: [{', '.join(flags.split())}]\n")
    return path


def _backward_offs(design: DesignFit, config: Path, study: str) -> list[float]:
    """Each PP rank's predicted backward-compute per step (the fit's backward plus what the
    run's recompute settings re-run) off the measured one, relative to the measured."""
    layout = Layout.parse(THIRD, 3)
    recipe = layout_recipe(load_recipe(str(config)), layout)
    _, backward = stage_compute_ms(
        load_costs(design.costs), recipe.model, layout.stages, recipe.flags.memory
    )
    microbatches = recipe.parallel.num_microbatches_or_none or 1
    measured = median_rank_timer(design.store, study, "backward-compute")
    return [(ms * microbatches - rank) / rank for ms, rank in zip(backward, measured, strict=True)]
