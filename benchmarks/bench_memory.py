"""How close is the per-stage memory model to Megatron's measured "max allocated"?

    python benchmarks/bench_memory.py          # a few seconds

Cases, each a run whose model, parallel sizes and memory flags are known:

- real logs (``../shared/data/real_megatron_logs/``, read in place; a missing file is skipped
  with a reason): ``05_ms_swift_mcore_2024.log`` (Qwen2-0.5B, TP 1 PP 1 DP 2, 128 tokens,
  distributed optimizer, its arguments dump) and ``08_megatron_bridge_2025.log``
  (Llama-3.2-1B, TP 1 PP 1 DP 8, 1024 tokens, its config dump: the native fused cross
  entropy, ``cross_entropy_loss_fusion: true``, ``cross_entropy_fusion_impl: native``);
- the emulated cluster's profile (``cluster_configs/hardware/h200_emulated.yaml``): the
  handbook recipe at PP 4 on the layouts the tune profiles, each rank reporting what the
  emulated Megatron prints (``launchers/emulated/log_lines.py``: the memory model under the
  profile's calibration, less the capacity overhead).

The prior is ``search.memory`` uncalibrated (every factor 1, no fixed allocation), compared with
max allocated (PyTorch's allocator: the capacity overhead is not in it).  Calibrated: the
factors and fixed allocation ``fit`` fits (``measure.memory_fit``) from some runs, tested on a
run it did not see.  Logs left out, and why: 09a/09b (GPT 70B-shape, TP 4 PP 4): their flags
are not in the excerpt, and the stage-independent peaks show recompute the log does not name;
04 and 10 are DeepSpeed (ZeRO), whose memory is not Megatron's.  Targets: prior within 8%,
calibrated within 3%; the model zoo's DeepSeek-V3 H100 recipe fits in 80 GB.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from launchers.emulated.hardware import load_profile  # noqa: E402
from ray_layout.measure.memory_fit import fit_memory  # noqa: E402
from ray_layout.measure.observations import RunObservation  # noqa: E402
from ray_layout.model.costs import costs_from_flops  # noqa: E402
from ray_layout.model.layout import Layout  # noqa: E402
from ray_layout.model.memory_settings import memory_settings  # noqa: E402
from ray_layout.model.sizing import GIB  # noqa: E402
from ray_layout.model.spec import Recipe, build_recipe, load_recipe_file  # noqa: E402
from search.cost_model import in_flight_at_peak  # noqa: E402
from search.memory import stage_memory  # noqa: E402
from search.pipeline_ops import ScheduleShape  # noqa: E402

LOGS = ROOT.parent / "shared" / "data" / "real_megatron_logs"
MAX_ALLOCATED = re.compile(
    r"\[Rank (\d+)\] \(after \d+ iterations\) memory \(MB\).*?max allocated: ([\d.]+)"
)
PRIOR_TARGET, CALIBRATED_TARGET = 0.08, 0.03


@dataclass(frozen=True)
class Case:
    name: str
    recipe: Recipe
    layout: Layout
    num_microbatches: int
    measured_mb: tuple[float, ...]  # per PP rank


def _measured(path: Path, ranks_per_stage: int, pp: int) -> tuple[float, ...]:
    """Each PP rank's max allocated (its ranks agree; the first one seen is taken)."""
    found: dict[int, float] = {}
    for rank, value in MAX_ALLOCATED.findall(path.read_text()):
        found.setdefault(int(rank) // ranks_per_stage, float(value))
    return tuple(found[stage] for stage in range(pp))


def real_cases() -> tuple[list[Case], list[str]]:
    """The logs whose model and run are known, as the dumps in them state them."""
    qwen2 = {"name": "qwen2-0.5b", "num_layers": 24, "hidden_size": 896, "ffn_hidden_size": 4864,
             "num_attention_heads": 14, "num_query_groups": 2, "kv_channels": 64,
             "seq_length": 128, "vocab_size": 151643 + 293, "add_qkv_bias": True,
             "untie_embeddings_and_output_weights": True}  # fmt: skip
    llama = {"name": "llama-3.2-1b", "num_layers": 16, "hidden_size": 2048,
             "ffn_hidden_size": 8192, "num_attention_heads": 32, "num_query_groups": 8,
             "kv_channels": 64, "seq_length": 1024, "vocab_size": 128256}  # fmt: skip
    specs = [
        ("05_ms_swift_mcore_2024.log", qwen2, {"dp": 2, "global_batch_size": 8},
         ("--recompute-granularity", "selective")),
        ("08_megatron_bridge_2025.log", llama, {"dp": 8, "global_batch_size": 512},
         ("--cross-entropy-loss-fusion", "--cross-entropy-fusion-impl", "native")),
    ]  # fmt: skip
    cases, skipped = [], []
    for log, model, parallel, flags in specs:
        path = LOGS / log
        if not path.exists():
            skipped.append(f"{log}: not found under {LOGS}")
            continue
        recipe = replace(build_recipe(model, parallel, source=log), megatron_args=flags)
        layout = Layout(("E" + "t" * model["num_layers"] + "L",), 1)
        microbatches = recipe.parallel.num_microbatches_or_none or 1
        cases.append(Case(f"{log} ({model['name']})", recipe, layout, microbatches,
                          _measured(path, 1, 1)))  # fmt: skip
    return cases, skipped


EMULATED_LAYOUTS = ("Et*3|t*7|t*6m|L", "Et|t*15|m|L", "Et*4|t*5|t*5|t*2mL", "Et*5|t*4|t*4|t*3mL")


def emulated_cases() -> list[Case]:
    """What the emulated ranks print: the model under the profile's calibration, no overhead."""
    recipe = load_recipe_file(ROOT / "configs/handbook_7b_a1b.yaml")
    profile = load_profile(ROOT / "cluster_configs/hardware/h200_emulated.yaml").costs
    microbatches = recipe.parallel.num_microbatches_or_none or 1
    cases = []
    for text in EMULATED_LAYOUTS:
        layout = Layout.parse(text, recipe.parallel.pp)
        held = _held(recipe, layout, microbatches)
        ranks = stage_memory(recipe.model, recipe.parallel, layout, profile, held)
        measured = tuple((m.total - m.overhead) / 2**20 for m in ranks)
        cases.append(Case(f"emulated {text}", recipe, layout, microbatches, measured))
    return cases


def _held(recipe: Recipe, layout: Layout, microbatches: int) -> list[dict[int, int]]:
    counts = in_flight_at_peak(ScheduleShape(layout.pp, layout.vpp, microbatches))
    return [dict(enumerate(map(int, row))) for row in counts]


def prior_mb(case: Case) -> np.ndarray:
    """The uncalibrated model's allocated bytes per rank (no capacity overhead), in MB."""
    parallel = replace(case.recipe.parallel, pp=case.layout.pp, vpp=case.layout.vpp)
    costs = costs_from_flops(case.recipe.model, parallel)
    held = _held(case.recipe, case.layout, case.num_microbatches)
    settings = memory_settings(case.recipe.megatron_args)
    ranks = stage_memory(case.recipe.model, parallel, case.layout, costs, held, settings)
    return np.array([(m.total - m.overhead) / 2**20 for m in ranks])


def observation(case: Case) -> RunObservation:
    pp = case.layout.pp
    empty = np.zeros((1, pp))
    return RunObservation(case.name, case.layout, case.num_microbatches, empty, empty,
                          max_allocated_mb=np.array(case.measured_mb))  # fmt: skip


def calibrated_errors(cases: list[Case]) -> list[tuple[str, float]]:
    """Fit on every emulated run but one and predict the one left out, in turn."""
    errors = []
    for left_out in cases:
        rest = [observation(c) for c in cases if c is not left_out]
        recipe = left_out.recipe
        base = costs_from_flops(recipe.model, recipe.parallel)
        flags = memory_settings(recipe.megatron_args)
        found = fit_memory(recipe.model, recipe.parallel, rest, base, flags)
        calibrated = replace(base, memory_calibration=found.factors)
        held = _held(recipe, left_out.layout, left_out.num_microbatches)
        ranks = stage_memory(
            recipe.model, recipe.parallel, left_out.layout, calibrated, held, flags
        )
        predicted = np.array([(m.total - m.overhead) / GIB + found.allocated_gib for m in ranks])
        measured = np.array(left_out.measured_mb) / 1024
        errors += [(f"{left_out.name} rank {r}", e) for r, e in enumerate(predicted / measured - 1)]
    return errors


def zoo_peak_gib() -> float:
    recipe = load_recipe_file(ROOT / "configs/deepseek_v3_zoo_h100.yaml")
    layout = Layout.parse("Et|(tt|)*30mL", recipe.parallel.pp)
    costs = costs_from_flops(recipe.model, recipe.parallel)
    held = _held(recipe, layout, recipe.parallel.num_microbatches_or_none or 1)
    settings = memory_settings(recipe.megatron_args)
    ranks = stage_memory(recipe.model, recipe.parallel, layout, costs, held, settings)
    return max(m.total_gib for m in ranks)


def main() -> int:
    real, skipped = real_cases()
    emulated = emulated_cases()
    print(f"{'case':58} {'rank':>4} {'measured MB':>12} {'prior MB':>10} {'error':>7}")
    worst = 0.0
    for case in real + emulated:
        for rank, (measured, prior) in enumerate(
            zip(case.measured_mb, prior_mb(case), strict=True)
        ):
            error = prior / measured - 1
            worst = max(worst, abs(error)) if case in real else worst
            print(f"{case.name:58} {rank:>4} {measured:>12,.1f} {prior:>10,.1f} {error:>+7.1%}")
    for reason in skipped:
        print(f"skipped: {reason}")
    errors = calibrated_errors(emulated)
    calibrated = max(abs(e) for _, e in errors)
    zoo = zoo_peak_gib()
    print(f"prior, real logs: worst {worst:.1%} (target {PRIOR_TARGET:.0%})")
    print(f"calibrated, emulated runs left out in turn: worst {calibrated:.2%} "
          f"(target {CALIBRATED_TARGET:.0%})")  # fmt: skip
    print(f"model zoo DeepSeek-V3 H100 recipe: largest stage {zoo:.1f} GiB (fits 80: {zoo <= 80})")
    return 0 if calibrated <= CALIBRATED_TARGET and zoo <= 80 else 1


if __name__ == "__main__":
    sys.exit(main())
