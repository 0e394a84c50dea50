"""The tune takes the GPU memory from the cluster, never assumes it: the emulated GPUs' from their
hardware profile, a real GPU's from a probe on a worker (which fails in one line on fake GPUs)."""

from __future__ import annotations

from pathlib import Path

import pytest

from launchers.emulated.hardware import load_profile
from ray_layout.driver.phases import cluster_hbm_gib
from ray_layout.errors import RunFailure
from ray_layout.runtime.profiling import Backend

PROFILE = Path("cluster_configs/hardware/h200_emulated.yaml")


def test_the_emulated_cluster_has_its_hardware_profiles_memory():
    hbm_gib, where = cluster_hbm_gib(Backend("emulated", hardware_profile=PROFILE))
    assert hbm_gib == load_profile(PROFILE).hbm_gib and where == "h200_emulated.yaml"


def test_a_probe_on_a_gpu_without_cuda_is_a_one_line_run_failure(ray_cluster, tmp_path):
    (tmp_path / "pretrain_gpt.py").touch()
    with pytest.raises(
        RunFailure, match=r"cannot read the GPUs' memory .*; give --hbm-gb$"
    ) as caught:
        cluster_hbm_gib(Backend("megatron", megatron_path=tmp_path))
    assert "\n" not in str(caught.value)
