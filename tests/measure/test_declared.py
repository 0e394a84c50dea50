"""Logs checked against what their runs were declared to be: the world, the ranks, the pipeline
stages, the micro-batches, cut logs, the same log declared twice, and the layout the timers
suggest when the declared one cannot explain them."""

from __future__ import annotations

import multiprocessing
import os
import re
import signal
from dataclasses import replace
from pathlib import Path
from unittest import mock

import pytest

from ray_layout.errors import ConfigError, MeasurementError
from ray_layout.measure.declared import check_log
from ray_layout.measure.fit import fit_costs
from ray_layout.measure.ingest import (
    LoggedRun,
    ingest,
    observations_from_store,
    observations_of_logged_runs,
)
from ray_layout.measure.log_format import world_line
from ray_layout.measure.log_world import parse_world
from ray_layout.measure.logs import parse_log
from ray_layout.measure.store import CostStore
from ray_layout.model.costs import load_costs
from ray_layout.model.layout import Layout
from ray_layout.model.spec import load_recipe_file
from tests.helpers.synthetic_runs import synthetic_log

HANDBOOK = load_recipe_file("configs/handbook_7b_a1b.yaml")  # TP 1, PP 4, EP 2, DP 2
TRUTH = load_costs("configs/costs/handbook_h200_example.json")
STANDALONE = ("Et*3|t*7|t*6m|L", "Et|t*15|m|L")
MICROBATCHES = 16
SPAWN = multiprocessing.get_context("spawn")


def log_of(text: str, parallel=HANDBOOK.parallel, iterations: int = 8, seed: int = 0) -> str:
    layout = Layout.parse(text, parallel.pp)
    return synthetic_log(HANDBOOK.model, parallel, layout, TRUTH, MICROBATCHES,
                         iterations=iterations, noise_cv=0.01, seed=seed)  # fmt: skip


@pytest.fixture(scope="module")
def logs(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("logs")
    paths = {}
    for index, text in enumerate(STANDALONE):
        paths[text] = folder / f"run{index}.log"
        paths[text].write_text(log_of(text, seed=index))
    return paths


def observation_of_logged_run(run: LoggedRun):
    """One log straight to the fit, as ``fit --run`` reads it: its observation and notes."""
    (observation,), notes = observations_of_logged_runs([run], HANDBOOK.model)
    return observation, notes


def declared(text: str, path: Path, **sizes) -> LoggedRun:
    parallel = replace(HANDBOOK.parallel, **sizes)
    layout = Layout.parse(text, parallel.pp)
    return LoggedRun(layout, path, replace(parallel, vpp=layout.vpp))


def test_a_pp4_log_declared_as_pp2_is_refused_not_stored(logs, tmp_path):
    store, path = CostStore(tmp_path), logs[STANDALONE[0]]
    with pytest.raises(ConfigError, match=r"ranks up to 7.*TP·CP·DP·PP is 4"):
        ingest(store, HANDBOOK.model, [declared(STANDALONE[0], path, pp=2)], "s")
    assert store.read("runs").empty
    # a world that adds up (DP 4 × PP 2 = 8) still shows 4 stages: 2 ranks receive nothing
    with pytest.raises(ConfigError, match=r"show 4 pipeline stage\(s\) \(2 of 8.*PP 2"):
        ingest(store, HANDBOOK.model, [declared(STANDALONE[0], path, pp=2, dp=4)], "s")
    assert store.read("runs").empty


def test_micro_batches_given_must_be_those_the_log_shows(logs, tmp_path):
    run = replace(declared(STANDALONE[0], logs[STANDALONE[0]]), num_microbatches=8)
    with pytest.raises(ConfigError, match="= 16 micro-batches, but 8 were given"):
        ingest(CostStore(tmp_path), HANDBOOK.model, [run], "s")
    memory_only = "".join(line for line in logs[STANDALONE[0]].read_text().splitlines(True)
                          if "memory (MB)" in line)  # fmt: skip
    assert "[Rank 6]" in memory_only  # the last stage's first rank: a world of at least 7
    with pytest.raises(ConfigError, match=r"rank 6 prints its memory, outside .* = 4"):
        check_log(parse_log(memory_only), Layout.parse("Et*8|t*8mL", 2),
                  replace(HANDBOOK.parallel, pp=2), 1, "log")  # fmt: skip
    wrong_batch = replace(run, num_microbatches=None, parallel=replace(run.parallel, dp=3))
    with pytest.raises(ConfigError, match=r"a world of 8 GPUs, but .* is 12"):  # DP 3
        ingest(CostStore(tmp_path), HANDBOOK.model, [wrong_batch], "s")
    parsed = parse_log(logs[STANDALONE[0]].read_text())
    sized = replace(HANDBOOK.parallel, micro_batch_size=3)
    with pytest.raises(ConfigError, match="global batch size 64 is no multiple"):
        check_log(parsed, Layout.parse(STANDALONE[0], 4), sized, None, "log")


def test_the_same_log_declared_otherwise_is_the_same_run(logs, tmp_path):
    store, path = CostStore(tmp_path), logs[STANDALONE[0]]
    (first,) = ingest(store, HANDBOOK.model, [declared(STANDALONE[0], path)], "s")
    (again,) = ingest(store, HANDBOOK.model, [declared(STANDALONE[0], path)], "s")
    assert first.stored and not again.stored and first.run_id == again.run_id
    with pytest.raises(ConfigError, match=rf"already stored .* as {first.run_id} with layout"):
        ingest(store, HANDBOOK.model, [declared(STANDALONE[1], path)], "s")
    copy = tmp_path / "copy.log"  # another name, same content: the same run
    copy.write_bytes(path.read_bytes())
    with pytest.raises(ConfigError, match=r"layout Et\*3\|t\*7\|t\*6m\|L; not stored again "
                       r"with layout Ett\|t\*6\|t\*8\|mL$"):  # fmt: skip
        ingest(store, HANDBOOK.model, [declared("Ett|t*6|t*8|mL", copy)], "s")
    assert store.read("runs")["run_id"].tolist() == [first.run_id]
    (other,) = ingest(store, HANDBOOK.model, [declared(STANDALONE[0], copy)], "another")
    assert other.stored and other.notes == (f"{copy}: the same log is also stored in study 's'",)


def cut_after(text: str, blocks: int, extra_lines: int) -> str:
    """The log up to its ``blocks``-th timer block header and ``extra_lines`` lines of it."""
    lines = text.splitlines(keepends=True)
    headers = [i for i, line in enumerate(lines) if "times across ranks" in line]
    return "".join(lines[: headers[blocks - 1] + 1 + extra_lines])


def test_a_cut_last_block_is_left_out_and_the_fit_is_right(logs, tmp_path):
    runs = []
    for index, text in enumerate(STANDALONE):
        whole = logs[text].read_text()
        path = tmp_path / f"cut{index}.log"
        path.write_text(cut_after(whole, 8, 12))  # the last block cut inside forward-compute
        runs.append(declared(text, path))
    observed = [observation_of_logged_run(run) for run in runs]
    assert all("interval 7) is cut short" in notes[0] for _, notes in observed)
    result = fit_costs(HANDBOOK.model, HANDBOOK.parallel, [obs for obs, _ in observed])
    for unit in ("t", "m", "L"):  # the cut block's missing ranks would read as 0 ms
        assert result.costs.backward_ms[unit] == pytest.approx(TRUTH.backward_ms[unit], rel=0.01)
    assert result.costs.backward_ms["E"] == pytest.approx(TRUTH.backward_ms["E"], abs=0.15)


def test_a_log_too_short_or_lacking_ranks_is_refused(logs, tmp_path):
    whole = logs[STANDALONE[0]].read_text()
    short = tmp_path / "short.log"
    short.write_text(cut_after(whole, 5, 0))
    with pytest.raises(MeasurementError, match=r"4 complete training timer block\(s\), 2 after"):
        observation_of_logged_run(declared(STANDALONE[0], short))
    holes = tmp_path / "holes.log"
    lines = whole.splitlines(keepends=True)
    header = [i for i, line in enumerate(lines) if "times across ranks" in line][3]
    rank5 = next(i for i in range(header, len(lines)) if "rank  5:" in lines[i])
    holes.write_text("".join(lines[:rank5] + lines[rank5 + 1 :]))  # block 3 loses rank 5
    with pytest.raises(MeasurementError, match=r"interval 3 lacks rank\(s\) 5 of 8"):
        ingest(CostStore(tmp_path), HANDBOOK.model, [declared(STANDALONE[0], holes)], "s")


def test_the_world_a_log_states_is_checked_and_taken(logs, tmp_path):
    text = logs[STANDALONE[0]].read_text()
    path = tmp_path / "dp1.log"  # the handbook config says DP 2, EP 2; this log, DP 1
    path.write_text(world_line(4, dp=1, cp=1, tp=1, pp=4) + "\n" + text)
    parsed = parse_log(path.read_text())
    assert parse_world(path.read_text()).sizes == {"dp": 1, "cp": 1, "tp": 1, "pp": 4}
    layout = Layout.parse(STANDALONE[0], 4)
    with pytest.raises(ConfigError, match=r"line 1\) states a world of 4 .*given DP 2"):
        check_log(parsed, layout, HANDBOOK.parallel, None, str(path), explicit={"dp"})
    with pytest.raises(ConfigError, match=r"GPU\(s\) per pipeline stage cannot hold EP 2"):
        check_log(parsed, layout, HANDBOOK.parallel, None, str(path))
    with pytest.raises(ConfigError) as refused:
        check_log(parsed, layout, HANDBOOK.parallel, None, "x")
    assert "\n" not in str(refused.value)
    stated = tmp_path / "dp2.log"
    stated.write_text(world_line(8, dp=2, cp=1, tp=1, pp=4) + "\n" + text)
    one = replace(HANDBOOK.parallel, dp=1, ep=1)
    checked = check_log(parse_log(stated.read_text()), layout, one, None, "log")
    assert checked.parallel.dp == 2 and checked.num_microbatches == MICROBATCHES
    assert checked.notes == ("log: DP 2 from the log (the config says 1)",)
    pp2 = replace(one, pp=2)  # PP left to the config: the layout is read with the log's PP 4
    checked = check_log(parse_log(stated.read_text()), Layout.parse(STANDALONE[0], 2), pp2,
                        None, "log")  # fmt: skip
    assert (checked.layout.pp, checked.layout.vpp, checked.parallel.pp) == (4, 1, 4)
    with pytest.raises(ConfigError, match=r"log: with the log's PP 4: layout has 2 stages"):
        check_log(parse_log(stated.read_text()), Layout.parse("Et*8|t*8mL", 2), pp2, None, "log")


def test_a_log_declared_with_another_layout_is_refused_with_the_one_its_timers_show(logs):
    right = [observation_of_logged_run(declared(t, logs[t]))[0] for t in STANDALONE]
    (wrong, _) = observation_of_logged_run(declared(STANDALONE[1], logs[STANDALONE[0]]))
    wrong = replace(wrong, name="wrong")
    with pytest.raises(MeasurementError, match=r"wrong: PP rank 0 .*suggest layout "
                       r"Et\*3\|t\*7\|t\*6m\|L\).*--accept-residuals") as refused:  # fmt: skip
        fit_costs(HANDBOOK.model, HANDBOOK.parallel, [*right, wrong])
    assert "\n" not in str(refused.value)
    accepted = fit_costs(HANDBOOK.model, HANDBOOK.parallel, [*right, wrong],
                         accept_residuals=True)  # fmt: skip
    assert accepted.suggested_layouts == {"wrong": "Et*3|t*7|t*6m|L"}
    assert any("suggest layout" in warning for warning in accepted.warnings)
    # two runs that disagree: either may be wrong, and each gets the layout the other implies
    pair = fit_costs(HANDBOOK.model, HANDBOOK.parallel, [right[0], wrong], accept_residuals=True)
    assert pair.suggested_layouts == {right[0].name: STANDALONE[1], "wrong": STANDALONE[0]}
    alone = fit_costs(HANDBOOK.model, HANDBOOK.parallel, [wrong])  # 4 ranks, 4 units: no check
    assert any("nothing checks that each run's layout" in w for w in alone.warnings)


def _ingest_killed_before_runs_row(root: str, path: str) -> None:
    real_replace = os.replace

    def replace_or_die(src, dst):
        if "table=runs" in str(dst):
            os.kill(os.getpid(), signal.SIGKILL)
        real_replace(src, dst)

    with mock.patch.object(os, "replace", replace_or_die):
        ingest(CostStore(root), HANDBOOK.model, [declared(STANDALONE[0], Path(path))], "s")


def test_an_ingest_killed_half_way_is_redone_at_once(logs, tmp_path):
    killed = SPAWN.Process(target=_ingest_killed_before_runs_row,
                           args=(str(tmp_path), str(logs[STANDALONE[0]])))  # fmt: skip
    killed.start()
    killed.join(120)
    assert killed.exitcode == -signal.SIGKILL
    store = CostStore(tmp_path)
    with pytest.raises(MeasurementError, match="no finished runs"):
        observations_from_store(store, "s", HANDBOOK.model, HANDBOOK.parallel)
    (result,) = ingest(store, HANDBOOK.model, [declared(STANDALONE[0], logs[STANDALONE[0]])], "s")
    assert result.stored  # not "already in the store": its writer is dead
    (observed,) = observations_from_store(store, "s", HANDBOOK.model, HANDBOOK.parallel)
    assert observed.name == result.run_id and observed.forward_ms.shape == (6, 4)


def test_logs_of_a_dp1_world_fitted_with_the_handbook_config_are_refused(tmp_path):
    """The handbook config says DP 2, EP 2; these runs ran DP 1, EP 1 on 4 GPUs."""
    small = replace(HANDBOOK.parallel, dp=1, ep=1)
    runs = []
    for index, text in enumerate(STANDALONE):
        path = tmp_path / f"dp1-{index}.log"
        path.write_text(log_of(text, parallel=small, seed=index))
        runs.append(path)
    with pytest.raises(ConfigError, match=r"a world of 4 GPUs, but the run's TP·CP·DP·PP is 8"):
        observation_of_logged_run(declared(STANDALONE[0], runs[0]))
    observed = [observation_of_logged_run(declared(t, p, dp=1, ep=1))[0]
                for t, p in zip(STANDALONE, runs, strict=True)]  # fmt: skip
    with pytest.raises(ConfigError, match=r"the runs ran DP 1 \(.*\), but DP 2 was given"):
        fit_costs(HANDBOOK.model, HANDBOOK.parallel, observed, explicit={"dp"})
    result = fit_costs(HANDBOOK.model, HANDBOOK.parallel, observed)
    assert "EP 1 from the runs (the config says 2)" in result.warnings
    assert "DP 1 from the runs (the config says 2)" in result.warnings
    assert result.costs.forward_ms["t"] == pytest.approx(10.0, rel=0.01)
    assert result.costs.optimizer_ms_per_gparam == pytest.approx(5.0, rel=0.02)
    other = tmp_path / "dp2.log"
    other.write_text(log_of(STANDALONE[1], parallel=replace(small, dp=2), seed=1))
    mixed = [observed[0], observation_of_logged_run(declared(STANDALONE[1], other, ep=1))[0]]
    with pytest.raises(ConfigError, match=r"must share DP: .*0\.log ran 1, .* ran 2"):
        fit_costs(HANDBOOK.model, HANDBOOK.parallel, mixed)


def arguments_block(**arguments) -> str:
    """Rank 0's arguments block as Megatron prints it."""
    lines = [f"  {name} {'.' * (48 - len(name))} {value}" for name, value in arguments.items()]
    dashes = "-" * 24
    return "\n".join([f"{dashes} arguments {dashes}", *lines, f"{dashes} end of arguments"]) + "\n"


def test_a_restarted_or_mixed_log_is_refused_not_fitted(logs, tmp_path):
    """A job restarted into the same file counts its iterations again from 1; two runs' lines
    mixed go back too: both are several runs, refused whole (not fitted with biased numbers)."""
    whole = logs[STANDALONE[0]].read_text()
    restarted = tmp_path / "restarted.log"
    restarted.write_text(whole + whole)
    with pytest.raises(MeasurementError, match=r"iteration 1 follows iteration 8: .*more than one"):
        ingest(CostStore(tmp_path), HANDBOOK.model, [declared(STANDALONE[0], restarted)], "s")
    starts = re.compile(r"(?=^ \[[^\]]*\] iteration)", flags=re.M)
    chunks = [starts.split(logs[text].read_text()) for text in STANDALONE]
    mixed = tmp_path / "mixed.log"
    mixed.write_text("".join(a + b for a, b in zip(*chunks, strict=True)))
    with pytest.raises(MeasurementError, match=r"follows iteration"):
        ingest(CostStore(tmp_path), HANDBOOK.model, [declared(STANDALONE[0], mixed)], "s")
    assert CostStore(tmp_path).read("runs").empty
    resumed = tmp_path / "resumed.log"  # a restart that resumes where the first start stopped
    second = whole.replace("iteration        ", "iteration       1", -1)  # iterations 11-18
    second = second.replace("/       8 |", "/      18 |")  # of --train-iters 18
    start = world_line(8, dp=2, cp=1, tp=1, pp=4) + "\n"
    resumed.write_text(start + whole + start + second)
    with pytest.raises(MeasurementError, match=r"states its world at lines 1, \d+: a job started"):
        ingest(CostStore(tmp_path), HANDBOOK.model, [declared(STANDALONE[0], resumed)], "s")


def test_a_global_batch_size_given_that_the_log_contradicts_is_refused(logs):
    parsed = parse_log(logs[STANDALONE[0]].read_text())  # 16 micro-batches of 2 × DP 2 = 64
    layout = Layout.parse(STANDALONE[0], 4)
    sized = replace(HANDBOOK.parallel, global_batch_size=128)
    explicit = {"global_batch_size"}
    with pytest.raises(ConfigError, match="global batch size is 64, but --global-batch-size 128"):
        check_log(parsed, layout, sized, None, "log", explicit)
    assert check_log(parsed, layout, sized, None, "log").num_microbatches == 16


def test_a_vpp_the_log_contradicts_is_refused(tmp_path):
    """The 1F1B and interleaved schedules time different p2p calls: a VPP-2 layout declared for
    a VPP-1 log (or the reverse) is refused, as is a PP-2 log declared as PP 4 (which re-read
    with the log's PP 2 would be PP 2 × VPP 2)."""
    plain = parse_log(log_of(STANDALONE[0]))
    eight = Layout.parse("Et|t*2|t*2|t*2|t*2|t*2|t*3|t*2mL", 4)  # VPP 2 on PP 4
    refused = r"non-interleaved schedule .* so VPP 1, but layout Et\|\(tt\|\)\*5.* is VPP 2 on PP 4"
    with pytest.raises(ConfigError, match=refused):
        check_log(plain, eight, replace(HANDBOOK.parallel, vpp=2), None, "log")
    interleaved = parse_log(log_of(str(eight)))
    with pytest.raises(ConfigError, match=r"interleaved schedule \(.*\), so VPP over 1, but"):
        check_log(interleaved, Layout.parse(STANDALONE[0], 4), HANDBOOK.parallel, None, "log")
    assert check_log(interleaved, eight, replace(HANDBOOK.parallel, vpp=2), None, "log")
    pp2 = replace(HANDBOOK.parallel, pp=2)
    two = world_line(4, dp=2, cp=1, tp=1, pp=2) + "\n" + log_of("Et*8|t*8mL", parallel=pp2)
    with pytest.raises(ConfigError, match=r"so VPP 1, but layout .* is VPP 2 on PP 2"):
        check_log(parse_log(two), Layout.parse(STANDALONE[0], 4), HANDBOOK.parallel, None, "log")


def test_what_the_log_s_arguments_state_wins_over_the_declaration():
    text = log_of(STANDALONE[0])
    layout, parallel = Layout.parse(STANDALONE[0], 4), HANDBOOK.parallel

    def checked(explicit=(), **arguments):
        parsed = parse_log(arguments_block(**arguments) + text)
        return check_log(parsed, layout, parallel, None, "log", explicit, HANDBOOK.model)

    with pytest.raises(ConfigError, match="arguments say hidden_size 4096, but the config's"):
        checked(hidden_size=4096)  # a log of another model
    with pytest.raises(ConfigError, match="arguments say num_experts 0"):
        checked(num_experts="None")
    with pytest.raises(ConfigError, match="virtual_pipeline_model_parallel_size 2, but layout"):
        checked(virtual_pipeline_model_parallel_size=2)
    with pytest.raises(ConfigError, match=r"pipeline_model_parallel_layout Et\*4.*declared as"):
        checked(pipeline_model_parallel_layout="Et*4|t*6|t*6|mL")
    with pytest.raises(ConfigError, match="arguments state EP 1, but the run was given EP 2"):
        checked({"ep"}, expert_model_parallel_size=1)
    with pytest.raises(ConfigError, match=r"state global batch size 256, but .* given global"):
        checked({"global_batch_size"}, global_batch_size=256)
    same = checked(
        hidden_size=HANDBOOK.model.hidden_size,
        pipeline_model_parallel_layout=layout,
        virtual_pipeline_model_parallel_size="None",
        data_parallel_size=2,
    )
    assert same.layout == layout and same.notes == ()
