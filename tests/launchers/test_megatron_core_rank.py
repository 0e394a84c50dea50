"""``python -m launchers.megatron_core_rank``: the entry exits 2 with one line on bad input."""

from __future__ import annotations

import os
import subprocess
import sys

from ray_layout.errors import EXIT_BAD_INPUT
from tests.helpers.paths import ROOT


def test_the_entry_refuses_a_missing_world_in_one_line():
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    done = subprocess.run(
        [sys.executable, "-m", "launchers.megatron_core_rank", "--num-layers", "2"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == EXIT_BAD_INPUT
    assert done.stderr.count("\n") == 1 and "WORLD_SIZE" in done.stderr
