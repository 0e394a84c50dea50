"""The variables a launcher sets for an emulated rank: importable without torch (a launcher on a
driver has none), and the names the entry point documents."""

from __future__ import annotations

import ast
import subprocess
import sys

import pytest

from launchers.emulated.environment import NODE_ENV, PROFILE_ENV, env_int
from ray_layout.errors import ConfigError
from tests.helpers.paths import ROOT


def test_a_launcher_can_name_them_without_importing_torch():
    """A fresh interpreter: this process has torch loaded by other tests already."""
    check = (
        "import sys; from launchers.emulated.environment import PROFILE_ENV, NODE_ENV; "
        "sys.exit('torch' in sys.modules)"
    )
    result = subprocess.run(
        [sys.executable, "-c", check], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr


def test_the_names_are_the_ones_the_entry_point_documents():
    entry = ast.get_docstring(ast.parse((ROOT / "launchers" / "emulated_megatron.py").read_text()))
    assert f"{PROFILE_ENV}=cluster_configs/hardware/h200_emulated.yaml" in entry
    assert f"``{NODE_ENV}`` (the node this rank runs" in entry
    assert PROFILE_ENV != NODE_ENV


def test_a_ranks_integer_variables_are_read_or_refused_in_one_line(monkeypatch):
    monkeypatch.setenv("RANK", "3")
    assert env_int("RANK") == 3
    monkeypatch.delenv(NODE_ENV, raising=False)
    assert env_int(NODE_ENV, 1) == 1
    monkeypatch.setenv("WORLD_SIZE", "-2")
    with pytest.raises(ConfigError, match="WORLD_SIZE must be a non-negative integer, got '-2'"):
        env_int("WORLD_SIZE")
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    with pytest.raises(ConfigError, match="LOCAL_RANK must be a non-negative integer, got None"):
        env_int("LOCAL_RANK")
