"""``python -m ray_layout.tune`` (``ray_layout/tune.py``): the entry ``ray job submit`` runs,
started as a user starts it; its exit status is the tune command's."""

from __future__ import annotations

import subprocess
import sys

from ray_layout import tune as entry
from ray_layout.commands import tune
from tests.helpers.paths import ROOT


def run_entry(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ray_layout.tune", *argv],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
        timeout=120,
    )


def test_the_entry_is_the_tune_commands_main():
    assert entry.main is tune.main


def test_help_names_the_entry_and_exits_0():
    done = run_entry("--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: python -m ray_layout.tune ")
    assert "--pipeline-model-parallel-layout" in " ".join(done.stdout.split())


def test_bad_input_exits_2_in_one_line_before_any_cluster():
    done = run_entry("configs/handbook_7b_a1b.yaml", "--ab-top", "-1")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == "error: --ab-top must be >= 0, got -1\n"


def test_ep_overlap_on_the_cpu_megatron_core_backend_exits_2_before_any_cluster(tmp_path):
    config = tmp_path / "handbook_ep.yaml"
    flags = "megatron_args: [--overlap-moe-expert-parallel-comm, --delay-wgrad-compute]\n"
    config.write_text((ROOT / "configs" / "handbook_7b_a1b.yaml").read_text() + flags)
    done = run_entry(str(config), "--pp", "4", "--vpp", "2", "--backend", "megatron-core")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1
    assert "--overlap-moe-expert-parallel-comm cannot run" in done.stderr
