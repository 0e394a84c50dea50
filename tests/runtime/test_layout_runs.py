"""Emulated profiling runs on the simulated multi-node cluster, ingested and fitted."""

from __future__ import annotations

import hashlib
import re
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from launchers.emulated.config import run_config
from launchers.emulated.hardware import load_profile
from launchers.megatron import MegatronRunSettings
from ray_layout.ab.live import memory_per_stage
from ray_layout.errors import ConfigError
from ray_layout.measure.fit import fit_costs
from ray_layout.measure.ingest import observations_from_store
from ray_layout.measure.store import CostStore
from ray_layout.model.layout import Layout
from ray_layout.model.memory_settings import memory_settings
from ray_layout.model.spec import load_recipe_file, with_parallel
from ray_layout.runtime import layout_runs
from ray_layout.runtime.layout_runs import (
    Backend,
    LayoutRun,
    RunOptions,
    rank_command,
    rank_env_of,
    recompute_recipe,
    run_id,
    run_layouts,
)
from ray_layout.runtime.policy import RunPolicy
from ray_layout.runtime.run_spec import RunResult

HANDBOOK = load_recipe_file("configs/handbook_7b_a1b.yaml")
PROFILE = Path("cluster_configs/hardware/h200_emulated.yaml")
EMULATED_POLICY = RunPolicy(timeout_s=240.0, heartbeat_s=120.0)  # emulated ranks start in seconds


def test_backends_build_their_commands(tmp_path):
    layout = Layout.parse("Et*4|t*4|t*4|t*4mL", 4)
    emulated = Backend("emulated", hardware_profile=PROFILE)
    command, env = rank_command(emulated, HANDBOOK, layout, MegatronRunSettings())
    assert command[1:3] == ["-m", "launchers.emulated_megatron"]
    assert env["RAY_LAYOUT_HARDWARE_PROFILE"].endswith("h200_emulated.yaml")
    checkout = tmp_path / "Megatron-LM"
    checkout.mkdir()
    (checkout / "pretrain_gpt.py").write_text("")
    real, env = rank_command(Backend("megatron", megatron_path=checkout), HANDBOOK, layout,
                             MegatronRunSettings())  # fmt: skip
    assert real[1].endswith("pretrain_gpt.py") and env == {}
    assert real[2:] == command[3:]  # one argument list for both backends
    with pytest.raises(ConfigError, match="megatron-path"):
        Backend("megatron")


def test_the_megatron_core_backend_runs_its_rank_program_on_the_same_arguments():
    layout = Layout.parse("Et*4|t*4|t*4|t*4mL", 4)
    core = Backend("megatron-core", hardware_profile=PROFILE)
    command, env = rank_command(core, HANDBOOK, layout, MegatronRunSettings())
    emulated, _ = rank_command(
        Backend("emulated", hardware_profile=PROFILE), HANDBOOK, layout, MegatronRunSettings()
    )
    assert command[1:3] == ["-m", "launchers.megatron_core_rank"]
    assert command[3:] == emulated[3:] and "RAY_LAYOUT_HARDWARE_PROFILE" in env
    assert core.hardware == "cpu"  # its times are CPU times
    # CPU times grow when runs share cores: one run at a time unless the user says otherwise
    assert core.runs_at_once(None) == 1 and core.runs_at_once(3) == 3
    assert Backend("emulated", hardware_profile=PROFILE).runs_at_once(None) is None
    with pytest.raises(ConfigError, match="megatron-core backend needs a hardware profile"):
        Backend("megatron-core")


def test_a_launch_scripts_exports_reach_every_rank_and_name_the_run():
    layout = Layout.parse("Et*4|t*4|t*4|t*4mL", 4)
    exported = (("NCCL_IB_TIMEOUT", "19"), ("NVTE_FWD_LAYERNORM_SM_MARGIN", "8"),
                ("OMP_NUM_THREADS", "8"), ("RANK", "5"))  # fmt: skip
    recipe = replace(HANDBOOK, environment=exported)
    rank_env = rank_env_of(recipe, gpus_per_node=4)
    for rank in (0, 7):  # every rank, of either backend: the rank environment is the launch's
        env = rank_env(rank, 8, "10.0.0.1", 29500, [rank % 4])
        assert env["NCCL_IB_TIMEOUT"] == "19" and env["NVTE_FWD_LAYERNORM_SM_MARGIN"] == "8"
        assert env["OMP_NUM_THREADS"] == "8"  # the script's own setting over the launch's default
        assert env["RANK"] == str(rank) and env["RAY_LAYOUT_NODE_RANK"] == str(rank // 4)
    command, _ = rank_command(Backend("emulated", hardware_profile=PROFILE), recipe, layout,
                              MegatronRunSettings())  # fmt: skip
    # the same command under other exports is another run; without exports the id is unchanged
    digest = hashlib.sha256(" ".join(command).encode()).hexdigest()[:12]
    assert run_id("ab", command, ()) == f"ab-{digest}"
    assert run_id("ab", command, exported) != run_id("ab", command, ())
    assert run_id("ab", command, exported[:1]) != run_id("ab", command, exported)


SELECTIVE = ("--recompute-granularity", "selective", "--recompute-modules", "layernorm", "moe_act")
FULL = ("--recompute-granularity", "full", "--recompute-method", "uniform",
        "--recompute-num-layers", "1")  # fmt: skip


def test_a_run_with_its_own_recomputation_carries_it_on_every_ranks_command_line(
    monkeypatch, tmp_path
):
    """The built command replaces the job's recompute flags with the run's, the emulated rank
    reads them back as its memory settings, and the run is another run (another id); a run of
    the job's own setting keeps the user's flags as written."""
    grouped = (*HANDBOOK.megatron_args, "--moe-grouped-gemm")  # which moe_act recompute needs
    recipe = replace(with_parallel(HANDBOOK, pp=2, global_batch_size=32),
                     megatron_args=(*grouped, *FULL))  # fmt: skip
    specs = []

    def run_many(built, **kwargs):
        specs.extend(built)
        return [RunResult(s.run_id, "failed", "oom", [], [], 1, "x") for s in built]

    monkeypatch.setattr(layout_runs, "run_many", run_many)
    layout = Layout.parse("Et*9|t*7mL", 2)
    runs = [
        LayoutRun(layout, kind="ab", recompute=memory_settings((*grouped, *SELECTIVE))),
        LayoutRun(layout, kind="ab", recompute=memory_settings(FULL)),
        LayoutRun(layout, kind="ab"),
    ]
    options = RunOptions(gpus_per_node=4, settings=MegatronRunSettings(train_iters=6))
    backend = Backend("emulated", hardware_profile=PROFILE)
    run_layouts(recipe, runs, backend=backend, store=CostStore(tmp_path), study="s",
                log_dir=None, options=options)  # fmt: skip
    recomputed, own, unchanged = (spec.command for spec in specs)
    words = " ".join(recomputed)
    assert " ".join(SELECTIVE) in words and "--recompute-method" not in words
    assert own == unchanged and " ".join(FULL) in " ".join(own)
    assert specs[0].run_id != specs[2].run_id and specs[1].run_id == specs[2].run_id
    emulated = run_config(recomputed[3:], recipe.parallel.world_size)  # what each rank runs
    assert emulated.memory == memory_settings((*grouped, *SELECTIVE))
    assert run_config(own[3:], recipe.parallel.world_size).memory == memory_settings(
        (*grouped, *FULL)
    )
    assert recompute_recipe(recipe, None) is recipe
    assert recompute_recipe(recipe, memory_settings(FULL)) is recipe


RANK_LOG = re.compile(r"rank-\d+\.log$")
_opened_rank_logs: list[tuple[str, str]] = []  # (path, mode) of every rank log opened here
sys.addaudithook(  # hooks stay for the process: this one only notes rank logs opened here
    lambda event, args: (
        _opened_rank_logs.append((str(args[0]), str(args[1])))
        if event == "open" and isinstance(args[0], str | Path) and RANK_LOG.search(str(args[0]))
        else None
    )
)


def rank_logs_read() -> list[str]:
    """Rank logs this process opened for anything but writing them."""
    return [path for path, mode in _opened_rank_logs if not mode.startswith("w")]


def test_eight_emulated_ranks_on_two_nodes_end_in_the_store(ray_cluster, tmp_path):
    """PP=4 x DP=2 on nodes of 4 fake GPUs: two profiling runs side by side would need 16
    GPUs of the 12, so they queue; each is ingested and the fit recovers the profile's t.
    No log folder: every rank's output reaches the store through Ray, the driver opens no
    rank log, and the memory lines of every rank with DP rank 0 (one per stage) are stored."""
    recipe = with_parallel(HANDBOOK, pp=4, ep=2, dp=2, global_batch_size=32)
    store = CostStore(tmp_path / "store")
    layouts = [Layout.parse("Et*3|t*7|t*6m|L", 4), Layout.parse("Et|t*15|m|L", 4)]
    settings = MegatronRunSettings(train_iters=6)
    options = RunOptions(gpus_per_node=4, settings=settings, policy=EMULATED_POLICY)
    backend = Backend("emulated", hardware_profile=PROFILE)
    _opened_rank_logs.clear()
    runs = run_layouts(recipe, [LayoutRun(layout) for layout in layouts], backend=backend,
                       store=store, study="emu", log_dir=None, options=options)  # fmt: skip
    assert [r.result.status for r in runs] == ["finished", "finished"], [r.result for r in runs]
    assert all(r.ingested and r.ingested.stored for r in runs)
    assert rank_logs_read() == [] and not list(tmp_path.rglob("rank-*.log"))
    rows = store.read("runs", study="emu")
    ingested = rows[rows.backend == "external"]
    assert len(ingested) == 2 and set(ingested.num_microbatches) == {8}
    assert set(ingested.source) == {r.result.run_id for r in runs}  # the cluster run's id
    timers = store.read_run_data("timers", study="emu")
    assert set(timers["rank"]) == set(range(8))  # every rank's timers reached the last rank
    memory = store.read_run_data("memory", study="emu")
    for run in runs:
        mine = memory[memory.run_id == run.ingested.run_id]
        assert set(mine["rank"]) == {0, 2, 4, 6} and set(mine.pp_rank) == {0, 1, 2, 3}
    observations = observations_from_store(store, "emu", recipe.model, recipe.parallel)
    fitted = fit_costs(recipe.model, recipe.parallel, observations)
    truth = load_profile(PROFILE).costs  # what the emulator slept; the tuner never reads it
    assert fitted.costs.forward_ms["t"] == pytest.approx(truth.forward_ms["t"], rel=0.15)
    again = run_layouts(recipe, [LayoutRun(layout) for layout in layouts], backend=backend,
                        store=store, study="emu", log_dir=None, options=options)  # fmt: skip
    assert [r.resumed for r in again] == [True, True]  # the store had them: nothing ran again
    assert [r.ingested.run_id for r in again] == [r.ingested.run_id for r in runs]
    assert len(store.read("runs", study="emu")) == len(rows)


def test_an_ab_arm_stopped_early_stores_every_stage_s_memory(ray_cluster, tmp_path):
    """An A/B arm watched live (iteration lines through Ray) and stopped early: its timers
    and every stage's measured memory reach the store; with a log folder the driver writes the
    raw logs there."""
    recipe = with_parallel(HANDBOOK, pp=4, ep=2, dp=2, global_batch_size=32)
    store = CostStore(tmp_path / "store")
    layout = Layout.parse("Et*3|t*7|t*6m|L", 4)
    seen: list[str] = []

    def watch(run_id: str, lines: list[str]) -> str | None:
        seen.extend(lines)
        return "enough" if len(seen) >= 8 else None

    options = RunOptions(gpus_per_node=4, settings=MegatronRunSettings(train_iters=40),
                         policy=replace(EMULATED_POLICY, max_retries=0))  # fmt: skip
    backend = Backend("emulated", hardware_profile=PROFILE)
    _opened_rank_logs.clear()
    (run,) = run_layouts(recipe, [LayoutRun(layout, kind="ab", source="t:arm", watch=watch)],
                         backend=backend, store=store, study="emu", log_dir=tmp_path / "logs",
                         options=options)  # fmt: skip
    assert (run.result.status, run.result.error) == ("stopped", "enough"), run.result
    assert rank_logs_read() == [] and len(_opened_rank_logs) == 8  # written, never read
    assert [p.name for p in run.result.log_paths] == [f"rank-{r}.log" for r in range(8)]
    assert run.result.log_paths[0].parent == tmp_path / "logs" / run.result.run_id
    assert run.ingested is not None and run.ingested.timer_rows > 0
    memory = memory_per_stage(store, "emu", run.ingested.run_id, 4)
    assert len(memory) == 4 and all(gib > 0 for gib in memory)


def test_profile_command_refuses_a_megatron_backend_without_a_checkout(capsys):
    from ray_layout.commands.main import main

    assert main(["profile", "configs/handbook_7b_a1b.yaml", "--pp", "4", "--backend", "megatron",
                 "--store", "unused"]) == 2  # fmt: skip
    assert "needs --megatron-path" in capsys.readouterr().err
