"""The megatron-core rank end to end: real ranks build the layout's stages in megatron-core and
print a log the product's parser reads (MoE with MTP on 1F1B, VPP 2 and standalone MTP; dense;
EP 2 with the alltoall dispatcher); full recompute re-runs the forward and trains the same; bad
input is one line and exit 2."""

from __future__ import annotations

import re

import pytest

from launchers.megatron_core.gpt_build import check_runs_on_cpu, expected_stage
from launchers.megatron_core.rank_main import BUILT_PREFIX, core_settings, main
from ray_layout.errors import EXIT_BAD_INPUT, ConfigError
from ray_layout.measure.log_records import ParsedLog
from ray_layout.measure.logs import parse_log
from ray_layout.model.job_flags import job_flags
from ray_layout.model.layout import Layout
from tests.helpers.megatron_core_ranks import TINY, core_arguments, run_ranks
from tests.helpers.paths import ROOT


def _built(stderr: str) -> list[tuple[str, list[int]]]:
    """The stages a rank's built line names: (symbols, decoder layer numbers) per chunk."""
    line = next(line for line in stderr.splitlines() if line.startswith(BUILT_PREFIX))
    chunks = line.split(": ", 2)[2].split(" | ")
    parsed = []
    for chunk in chunks:
        symbols, numbers = re.fullmatch(r"(\S*) \[(.*)\]", chunk.strip()).groups()
        parsed.append((symbols, [int(n) for n in numbers.split(",") if n.strip()]))
    return parsed


def _check_layers(layout: Layout, outputs) -> None:
    per_stage = len(outputs) // layout.pp  # TP = CP = 1: DP ranks inside each PP rank
    for output in outputs:
        assert output.returncode == 0, output.stderr[-2000:]
        # every blocking call is held off the clock: no rank waited out the compute lock
        assert "without the compute lock" not in output.stderr
        pp_rank = output.rank // per_stage
        expected = [expected_stage(layout, pp_rank, chunk) for chunk in range(layout.vpp)]
        assert _built(output.stderr) == [(e.symbols, list(e.layer_numbers)) for e in expected]


DENSE = ROOT / "configs/tiny_dense.yaml"
EP2 = ROOT / "configs/tiny_moe_ep2.yaml"


@pytest.mark.slow
@pytest.mark.megatron
@pytest.mark.parametrize(
    "text, pp, config, world, batch",
    [
        ("Ett|t*2mL", 2, TINY, 2, 4),
        ("Et|tt|t|mL", 2, TINY, 2, 4),
        ("Ett|ttm|L", 3, TINY, 3, 4),
        ("Ett|ttL", 2, DENSE, 2, 4),
        ("Ett|t*2mL", 2, EP2, 4, 8),
    ],
    ids=["1f1b-pp2", "vpp2", "standalone-mtp-pp3", "dense-pp2", "ep2-alltoall"],
)
def test_each_rank_builds_its_stage_and_the_parser_reads_its_log(
    tmp_path, text, pp, config, world, batch
):
    layout = Layout.parse(text, pp)
    argv = core_arguments(layout, iterations=2, global_batch=batch, config=config)
    outputs = run_ranks(argv, world, tmp_path)
    _check_layers(layout, outputs)
    last = parse_log(outputs[-1].stdout)
    assert [record.iteration for record in last.iterations] == [1, 2]
    assert last.iterations[-1].losses["lm loss"] > 0
    assert last.skipped_lines == 0
    timed = {record.timer for record in last.timers}
    assert {"forward-compute", "backward-compute", "forward-backward", "optimizer"} <= timed
    assert {record.rank for record in last.timers} == set(range(world))
    assert not last.unknown_timers
    assert any(output.stdout.count("memory (MB)") for output in outputs)


@pytest.mark.slow
@pytest.mark.megatron
@pytest.mark.parametrize(
    "text, pp", [("Ett|tt|m|L", 2), ("Et|t|t|t|m|L", 3)], ids=["mtp-rank-0", "mtp-middle-rank"]
)
def test_untied_standalone_mtp_with_vpp_builds_in_pretrain_gpts_embedding_group(tmp_path, text, pp):
    """Untied, the embedding group is rank 0 and the MTP ranks: these build and train (with
    megatron-core's default group, the first rank 0 layout hangs)."""
    config = tmp_path / "untied.yaml"
    tied = "untie_embeddings_and_output_weights: false"
    assert tied in TINY.read_text()
    config.write_text(TINY.read_text().replace(tied, "untie_embeddings_and_output_weights: true"))
    layout = Layout.parse(text, pp)
    argv = core_arguments(layout, iterations=2, global_batch=2 * pp, config=config)
    outputs = run_ranks(argv, pp, tmp_path)
    _check_layers(layout, outputs)
    assert [r.iteration for r in parse_log(outputs[-1].stdout).iterations] == [1, 2]


def test_bad_input_is_one_line_and_exit_2(monkeypatch, capsys):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert main(["--num-layers", "4"]) == EXIT_BAD_INPUT
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "RANK" in error


def test_a_layout_that_deadlocks_megatron_core_is_refused(monkeypatch, capsys):
    """MTP on the embedding's PP rank in another virtual stage, tied embeddings: one line,
    before any process group, instead of a hang in megatron-core's embedding all-reduce."""
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    layout = Layout.parse("Ett|tt|m|L", 2)
    assert main(core_arguments(layout, iterations=1)) == EXIT_BAD_INPUT
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "does not build in megatron-core 0.16.1" in error


def test_ep_overlap_is_refused_on_cpu_ranks_and_before_a_tune_starts(monkeypatch, capsys):
    """Combined 1F1B needs a CUDA stream for its all-to-alls: one line and exit 2 from a rank
    (``tests/test_tune.py``: and from the tune, before any cluster starts)."""
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    layout = Layout.parse("Et|t|t|tmL", 2)
    argv = [*core_arguments(layout, iterations=1), "--overlap-moe-expert-parallel-comm"]
    assert main(argv) == EXIT_BAD_INPUT
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "--overlap-moe-expert-parallel-comm cannot run" in error
    with pytest.raises(ConfigError, match="tune it on the emulated or the megatron backend"):
        check_runs_on_cpu(job_flags(["--overlap-moe-expert-parallel-comm"]))
    check_runs_on_cpu(job_flags(["--moe-grouped-gemm"]))  # nothing to refuse


def test_uniform_recompute_of_mtp_in_twos_is_refused_before_any_group(monkeypatch, capsys):
    """megatron-core asserts one layer per checkpoint in the MTP layer's first forward: one line
    and exit 2 (the job's settings are refused as they are read) instead of a traceback from the
    MTP rank."""
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    uniform = "--recompute-granularity full --recompute-method uniform --recompute-num-layers 2"
    argv = [*core_arguments(Layout.parse("Ett|t*2mL", 2), iterations=1), *uniform.split()]
    assert main(argv) == EXIT_BAD_INPUT
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "must be 1 for MTP recompute" in error


def test_settings_come_from_the_command_line():
    argv = core_arguments(Layout.parse("Ett|t*2mL", 2), iterations=1)
    assert core_settings(argv).dispatcher == "alltoall"  # the product's default for MoE


FULL_RECOMPUTE = "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1"


@pytest.mark.slow
@pytest.mark.megatron
def test_full_recompute_reruns_the_forward_in_the_backward_and_trains_the_same(tmp_path):
    """The same layout without and with full recompute: every rank's backward-compute grows by
    about its forward (a whole re-run of its layers), and the losses are the same, dropout
    included (the re-run forward draws the first one's masks: the rng states adaptation)."""
    layout = Layout.parse("Ett|t*2mL", 2)
    argv = core_arguments(layout, iterations=6)
    logs = {"plain": tmp_path / "plain", "full": tmp_path / "full"}
    backward, losses = {}, {}
    for name, folder in logs.items():
        folder.mkdir()
        flags = FULL_RECOMPUTE.split() if name == "full" else []
        outputs = run_ranks([*argv, *flags], layout.pp, folder)
        _check_layers(layout, outputs)
        log = parse_log(outputs[-1].stdout)
        backward[name] = [_median_timer(log, "backward-compute", rank) for rank in range(2)]
        losses[name] = [record.losses["lm loss"] for record in log.iterations]
    assert losses["full"] == pytest.approx(losses["plain"], rel=1e-5)
    # recomputing the whole forward about doubles a backward (2-3x here): far above the noise
    assert all(
        full > 1.3 * plain for full, plain in zip(backward["full"], backward["plain"], strict=True)
    ), backward


def _median_timer(log: ParsedLog, timer: str, rank: int) -> float:
    """A rank's median ``timer`` past the first two iterations."""
    values = sorted(
        r.ms for r in log.timers if r.timer == timer and r.rank == rank and r.iteration > 2
    )
    return values[len(values) // 2]
