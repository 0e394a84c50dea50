"""Bad input stops at the door: every reproducer a new user met, run as that user
would run it, ends in exit 2 and one line on stderr naming the flag or file: no traceback, no
hang, no file written, no cluster started, and never more than a bounded amount of memory.

Each case runs in a child under a memory limit and a time limit
(``tests/helpers/isolated_command.py``), in an empty working folder; ``{name}`` in an argument
is a file of the ``inputs`` fixture.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.helpers.isolated_command import run_isolated
from tests.helpers.malformed_inputs import COSTS, HANDBOOK, HARDWARE, LAYOUT, ROOT, write_inputs

PLAN = ["plan", HANDBOOK, "--pp", "4", "--costs", COSTS]
SIMULATE = ["simulate", HANDBOOK, LAYOUT, "--costs", COSTS]
FIT = ["fit", HANDBOOK, "--run", f"{LAYOUT}={{log}}"]
INGEST = ["ingest", HANDBOOK, "--run", f"{LAYOUT}={{log}}"]
PROFILE_LAYOUTS = ["profile-layouts", HANDBOOK, "--pp", "4"]
PROFILE = ["profile", HANDBOOK, "--pp", "4", "--store", "store", "--hardware", HARDWARE]
TUNE = [HANDBOOK, "--pp", "4", "--hardware", HARDWARE]  # python -m ray_layout.tune


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, str]:
    return write_inputs(tmp_path_factory.mktemp("inputs"))


CASES = [
    # size / layouts / profile-layouts with a billion layers; huge numbers anywhere
    (["size", "{billion}"], "num_layers must be <= 1,024"),
    (["layouts", "{billion}", "--pp", "4", "--count"], "num_layers must be <= 1,024"),
    (["profile-layouts", "{billion}", "--pp", "4"], "num_layers must be <= 1,024"),
    (["plan", "{deep}", "--pp", "64", "--costs", COSTS], "65,536 layer placements to search"),
    (["profile-layouts", "{deep}", "--pp", "64"], "65,536 layer placements to search"),
    (["size", "{digits}"], "digits.yaml: not valid YAML"),
    (["plan", "{zero_divisor}", "--pp", "4", "--costs", COSTS],
     "make_vocab_size_divisible_by must be >= 1, got 0"),
    (["layouts", HANDBOOK, "--pp", str(10**30), "--count"], "--pp must be <= 65,536"),
    (["layouts", HANDBOOK, "--pp", "4", "--limit", "-1"], "--limit must be >= 0"),
    (["layouts", HANDBOOK, "--pp", "4", "--limit", str(10**7)], "--limit must be <= 10,000"),
    (["layouts", HANDBOOK, "--pp", "4", "--vpp", "512"], "more than 1,024"),
    # validate: repeat counts that would fill memory
    (["validate", "t*" + "9" * 5000, "--pp", "1", "--num-layers", "16"],
     "more than 1,000,000 symbols"),
    (["validate", "(t*999999|)*999", "--pp", "999", "--num-layers", "16"],
     "more than 1,000,000 symbols"),
    (["validate", "Et|L", "--pp", "2", "--num-layers", "0"], "--num-layers must be >= 1"),
    (["validate", "Et|L", "--pp", "2", "--num-layers", str(10**9)],
     "--num-layers must be <= 1,024"),
    (["size", HANDBOOK, "--seq-length", "0"], "--seq-length must be >= 1, got 0"),
    (["size", HANDBOOK, "--seq-length", str(10**12)], "--seq-length must be <= 16,777,216"),
    (["size", HANDBOOK, "--tp", "2", "--pp", "16", "--dp", "65536"], "GPUs, more than 1,048,576"),
    (["size", HANDBOOK, "--pp", "a\nb"], "--pp: must be an integer in digits (0-9), got 'a\\nb'"),
    # plan: run-away work, meaningless counts, costs that break the arithmetic
    ([*PLAN, "--micro-batches", str(10**6)], "--micro-batches must be <= 16,384"),
    ([*PLAN, "--micro-batches", str(10**9)], "--micro-batches must be <= 16,384"),
    ([*PLAN, "--micro-batches", "0"], "--micro-batches must be >= 1"),
    ([*PLAN, "--pp", "16", "--micro-batches", "16384"], "forward passes per step"),
    (["plan", HANDBOOK, "--pp", "10000", "--costs", COSTS], "PP 10000 x VPP 1"),
    ([*PLAN, "--sweep-vpp", "1,1000"], "--sweep-vpp 1000"),
    ([*PLAN, "--sweep-vpp", "1,0"], "--sweep-vpp must be >= 1, got 0"),
    ([*PLAN, "--sweep-vpp", "1,x"], "--sweep-vpp must be integers"),
    ([*PLAN, "--samples", str(10**9)], "--samples must be <= 100,000"),
    ([*PLAN, "--samples", "100000"], "sampled forward passes, more than 1,048,576"),
    ([*PLAN, "--samples", "10000", "--micro-batches", "1024"], "give fewer --samples"),
    ([*PLAN, "--group-size", str(10**9)], "--group-size must be <= 16,384"),
    ([*PLAN, "--samples", "0"], "--samples must be >= 1, got 0"),
    ([*PLAN, "--samples", "-5"], "--samples must be >= 1, got -5"),
    ([*PLAN, "--top", "0"], "--top must be >= 1"),
    ([*PLAN, "--top", "-1"], "--top must be >= 1"),
    ([*PLAN, "--seed", "-1"], "--seed must be >= 0"),
    (["plan", HANDBOOK, "--pp", "4", "--costs", "{huge_costs}"], "huge_costs.json: forward_ms"),
    (["plan", HANDBOOK, "--pp", "4", "--costs", "{zero_costs}"], "zero_costs.json: decoder"),
    (["plan", HANDBOOK, "--pp", "4", "--costs", "{folder}/missing.json"], "no such file"),
    ([*PLAN, "--hbm-gb", "nan"], "--hbm-gb: must be a decimal number (such as 2, 0.5, 1e-3)"),
    ([*PLAN, "--hbm-gb", "inf"], "--hbm-gb: must be a decimal number"),
    ([*PLAN, "--hbm-gb", "1e400"], "--hbm-gb: must be a number a float holds (up to 1.8e308)"),
    ([*PLAN, "--micro-batches", "1_6"], "--micro-batches: must be an integer in digits (0-9)"),
    ([*PLAN, "--hbm-gb", "-1"], "--hbm-gb must be positive"),
    ([*PLAN, "--group-size", "0"], "--group-size must be >= 1"),
    ([*PLAN, "--shards", "0"], "--shards must be >= 1"),
    ([*PLAN, "--shards", "-2"], "--shards must be >= 1"),
    ([*PLAN, "--shards", "2", "--ray-address", "127.0.0.1:1"], "--ray-address 127.0.0.1:1"),
    # simulate: the same, and where the timeline goes
    ([*SIMULATE, "--micro-batches", str(10**6)], "--micro-batches must be <= 16,384"),
    ([*SIMULATE, "--samples", str(10**9)], "--samples must be <= 100,000"),
    (["simulate", HANDBOOK, LAYOUT, "--costs", "{zero_costs}"], "zero_costs.json"),
    (["simulate", HANDBOOK, LAYOUT, "--costs", "{huge_costs}"], "huge_costs.json"),
    ([*SIMULATE, "--timeline", "{folder}/no/such/t.png"], "no such folder"),
    ([*SIMULATE, "--timeline", "{folder}/t.txt"], "must end in .png, .svg, .pdf"),
    ([*SIMULATE, "--timeline", "{folder}"], "is a folder, not a file"),
    # fit / ingest: where the output and the store go, and the counts they read logs with
    ([*FIT, "-o", "{folder}/no/such/c.json"], "no such folder"),
    ([*FIT, "-o", "{folder}"], "-o {folder}: is a folder, not a file"),
    ([*FIT, "-o", "/proc/1/c.json"], "is not writable"),
    (["fit", HANDBOOK, "--store", HANDBOOK, "-o", "c.json"], "is a file, not a folder"),
    (["fit", HANDBOOK, "--store", f"{HANDBOOK}/sub", "-o", "c.json"], "is a file"),
    ([*INGEST, "--store", HANDBOOK], "--store"),
    ([*INGEST, "--store", f"{HANDBOOK}/sub"], "cannot be made"),
    ([*INGEST, "--store", "/proc/1/store"], "--store /proc/1/store: /proc/1 is not writable"),
    ([*INGEST, "--store", "store", "--study", "../x"], "--study must be a plain name"),
    ([*INGEST, "--store", ""], "--store must name a folder"),
    ([*FIT, "-o", "c.json", "--gpus-per-node", "0"], "--gpus-per-node must be >= 1"),
    ([*FIT, "-o", "c.json", "--gpus-per-node", "-8"], "--gpus-per-node must be >= 1"),
    ([*FIT, "-o", "c.json", "--micro-batches", "0"], "--micro-batches must be >= 1"),
    ([*FIT, "-o", "c.json", "--micro-batches", "-3"], "--micro-batches must be >= 1"),
    ([*FIT, "-o", "c.json", "--micro-batches", str(10**9)], "--micro-batches must be <= 16,384"),
    ([*INGEST, "--store", "store", "--micro-batches", str(10**9)], "--micro-batches must be <="),
    # input files: special and huge files, aliases, keys, encodings, absurd costs
    (["size", "{fifo}"], "fifo.yaml: a FIFO, not a regular file"),
    (["size", "/dev/zero"], "/dev/zero: a character device, not a regular file"),
    (["size", "{sparse}"], "sparse.yaml: 9,000,000,000 bytes, more than the 1,000,000"),
    (["size", "{laughs}"], "laughs.yaml: more than 100,000 values"),
    (["size", "{twice}"], "twice.yaml:28: duplicate key 'num_layers'"),
    (["size", "{int_key}"], "int_key.yaml:28: key 1 is not text"),
    (["size", "{int_key_parallel}"], "int_key_parallel.yaml:22: key 1 is not text"),
    (["size", "{no_parallel}"], "no_parallel.yaml: parallel must be a mapping, got False"),
    (["size", "{freq}"], "freq.yaml: moe_layer_freq has 24 entries but num_layers is 16"),
    (["size", "{latin1}"], "latin1.yaml: not UTF-8 text at byte"),
    (["size", "{layers_hf}", "--pp", "4"], "num_hidden_layers must be <= 1,024"),
    (["plan", HANDBOOK, "--pp", "4", "--costs", "{latin1_costs}"], "not UTF-8 text at byte"),
    (["plan", HANDBOOK, "--pp", "4", "--costs", "{twice_costs}"], "duplicate key 'tp'"),
    (["plan", HANDBOOK, "--pp", "4", "--costs", "{tiny_costs}"],
     "tiny_costs.json: mtp_standalone_factor must be at least 0.5, got 1e-300"),
    (["plan", HANDBOOK, "--pp", "4", "--costs", "{subnormal_costs}"],
     "forward_ms.t must be 0 or at least 1e-06 ms (1 ns), got 5e-324"),
    (["plan", HANDBOOK, "--pp", "4", "--costs", "{jitter_costs}"],
     "jitter_costs.json: jitter_cv.t must be at most 1, got 9000000.0"),
    # profile-layouts
    ([*PROFILE_LAYOUTS, "--runs", "-1"], "--runs must be >= 1"),
    ([*PROFILE_LAYOUTS, "--runs", str(10**6)], "--runs must be <= 64"),
    ([*PROFILE_LAYOUTS, "--train-iters", "0"], "--train-iters must be >= 5: the fit drops"),
    ([*PROFILE_LAYOUTS, "--train-iters", "-5"], "--train-iters must be >= 5: the fit drops"),
    ([*PROFILE_LAYOUTS, "--micro-batches", str(10**9)], "--micro-batches must be <= 16,384"),
]  # fmt: skip

# tune and profile: every setting checked before a cluster is started or joined
CLUSTER_CASES = [
    (["--hardware", "{folder}/missing.yaml"], "no such file"),
    (["--hardware", "{broken_hardware}"], "broken_hardware.yaml: not valid YAML"),
    (["--hardware", "{int_key}"], "int_key.yaml:28: key 1 is not text"),
    (["--timeout-s", "0"], "--timeout-s must be positive"),
    (["--timeout-s", "nan"], "--timeout-s: must be a decimal number"),
    (["--heartbeat-s", "-1"], "--heartbeat-s must be positive"),
    (["--gpus-per-node", "0"], "--gpus-per-node must be >= 1"),
    (["--study", "../x"], "--study must be a plain name"),
    (["--backend", "megatron", "--megatron-path", "{folder}"], "--megatron-path"),
    (["--backend", "megatron"], "needs --megatron-path"),
    (["--pp", "10000"], "PP 10000 x VPP 1"),
    (["--ray-address", "127.0.0.1:1"], "--ray-address 127.0.0.1:1: no Ray cluster answers"),
    (["--ray-address", "nonsense"], "--ray-address must be HOST:PORT"),
    (["--ray-address", "h:" + "9" * 5000], "--ray-address must be HOST:PORT"),
    (["--ray-address", "127.0.0.1:0100000"], "--ray-address must be HOST:PORT"),
]  # fmt: skip
TUNE_ONLY = [
    (["--hbm-gb", "nan"], "--hbm-gb: must be a decimal number"),
    (["--samples", "0"], "--samples must be >= 1"),
    (["--nodes", "0"], "--nodes must be >= 1"),
    (["--report-dir", HANDBOOK], "--report-dir"),
    (["--report-dir", "/proc/1/report"], "not writable"),
    (["--ab-alpha", "2"], "alpha must lie strictly between 0 and 1"),
    (["--ab-looks", "3,x"], "--ab-looks must be integers"),
    (["--ab-batch", "1000000"], "iterations per arm, more than 1,000,000"),
    (["--samples", "100000"], "sampled forward passes"),
    (["--global-batch-size", "1048576"], "a step of 262,144 micro-batches"),
]  # fmt: skip


def _filled(argv: list[str], inputs: dict[str, str]) -> list[str]:
    return [arg.format(**inputs) if "{" in arg else arg for arg in argv]


def _listing(folder: Path) -> list[str]:
    return sorted(str(path) for path in folder.rglob("*"))


def assert_refused(argv: list[str], message: str, inputs: dict[str, str], entry="main") -> None:
    """Exit 2, one line ``error: ...`` holding ``message``, nothing written anywhere."""
    folder = Path(inputs["folder"]).parent
    before = _listing(folder)
    outcome = run_isolated(_filled(argv, inputs), entry=entry)
    assert outcome.exit_code == 2, (outcome.exit_code, outcome.stderr[-2000:])
    assert "Traceback" not in outcome.stderr
    assert len(outcome.stderr_lines) == 1, outcome.stderr
    assert outcome.stderr.startswith("error: ")
    assert message.format(**inputs) in outcome.stderr
    assert outcome.files_left == () and _listing(folder) == before


def _case_id(argv: list[str]) -> str:
    words = [w if len(w) < 24 else w[:10] + "…" for w in argv if not w.startswith(str(ROOT))]
    return " ".join(words)


@pytest.mark.parametrize(("argv", "message"), CASES, ids=[_case_id(a) for a, _ in CASES])
def test_refused_with_one_line(inputs, argv, message):
    assert_refused(argv, message, inputs)


@pytest.mark.parametrize(
    ("extra", "message"),
    CLUSTER_CASES + TUNE_ONLY,
    ids=[_case_id(a) for a, _ in CLUSTER_CASES + TUNE_ONLY],
)
def test_tune_refuses_before_any_cluster(inputs, extra, message):
    assert_refused([*TUNE, *extra], message, inputs, entry="tune")


def test_tune_refuses_a_search_too_large_to_hold(inputs):
    argv = ["{deep}", "--pp", "64", "--hardware", HARDWARE]
    assert_refused(argv, "65,536 layer placements to search", inputs, entry="tune")


@pytest.mark.parametrize(
    ("extra", "message"), CLUSTER_CASES, ids=[_case_id(a) for a, _ in CLUSTER_CASES]
)
def test_profile_refuses_before_any_cluster(inputs, extra, message):
    assert_refused([*PROFILE, *extra], message, inputs)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes in any folder")
def test_a_store_in_a_read_only_folder_is_refused(inputs, tmp_path):
    tmp_path.chmod(0o555)
    try:
        assert_refused([*INGEST, "--store", str(tmp_path / "store")], "is not writable", inputs)
    finally:
        tmp_path.chmod(0o755)
