"""Hardware profiles: the shipped ones load with the seed study's costs, and a bad one is one
line naming the file and the field."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from launchers.emulated.hardware import load_profile
from ray_layout.errors import ConfigError
from tests.helpers.launchers_emulated import H200, PROFILES


def write_profile(directory: Path, file_name: str, **change) -> Path:
    """The H200 profile with ``change`` applied (a None value drops the key)."""
    raw = yaml.safe_load(H200.read_text()) | change
    path = directory / file_name
    path.write_text(yaml.safe_dump({k: v for k, v in raw.items() if v is not None}))
    return path


def test_shipped_profiles_load():
    h200, a100 = load_profile(H200), load_profile(PROFILES / "a100_emulated.yaml")
    assert (h200.name, h200.hbm_gib) == ("h200_emulated", 139.8)
    assert h200.costs.mtp_standalone_factor == pytest.approx(1.12)  # 1 + mtp_standalone_extra
    forward = h200.costs.forward_ms
    assert forward["m"] == pytest.approx(1.4 * forward["t"])  # the seed study, not FLOP ratios
    assert forward["L"] == pytest.approx(3.8 * forward["t"])
    assert a100.costs.forward_ms["t"] > forward["t"] and a100.hbm_gib < h200.hbm_gib


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"hbm_gib": None}, "hbm_gib must be a finite number"),
        ({"time_scale": 0}, "time_scale must be at least 0.0001, got 0"),
        ({"time_scale": 1e-300}, "time_scale must be at least 0.0001, got 1e-300"),
        ({"hbm_gib": 1e9}, "hbm_gib must be at most 1024 GiB, got 1000000000.0"),
        ({"jitter_cv": 9e6}, "jitter_cv must be at most 1, got 9000000.0"),
        ({"mtp_standalone_extra": 1e9}, "mtp_standalone_extra must be at most 3"),
        ({"name": [1, 2]}, "name must be a non-empty string, got [1, 2]"),
        ({"mtp_standalone_factor": 1.2}, "not a profile field"),
        ({"forward_ms": {"E": 1.0, "t": 10.0}}, "forward_ms lacks unit(s) L"),
        ({"colour": "blue"}, "unknown key(s) colour"),
        ({"jitter_cv": -0.1}, "jitter_cv must be at least 0, got -0.1"),
        ({"hbm_gib": True}, "hbm_gib must be a finite number, got True"),
        ({"time_scale": float("inf")}, "time_scale must be a finite number, got inf"),
        ({"format": "ray_layout.costs/1"}, "format is not a profile field"),
    ],
)
def test_bad_profile_is_one_line(tmp_path, change, message):
    path = write_profile(tmp_path, "bad.yaml", **change)
    with pytest.raises(ConfigError, match=re.escape(message)) as info:
        load_profile(path)
    assert "\n" not in str(info.value) and str(path) in str(info.value)


def test_a_profile_without_a_name_is_named_after_its_file(tmp_path):
    profile = load_profile(write_profile(tmp_path, "lab_cluster.yaml", name=None, jitter_cv=0))
    assert profile.name == "lab_cluster"
    assert profile.jitter_cv == 0.0  # no noise is a valid profile
    extra = load_profile(write_profile(tmp_path, "more.yaml", mtp_standalone_extra=0.3))
    assert extra.costs.mtp_standalone_factor == pytest.approx(1.3)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("1: 2\n", "key 1 is not text"),
        ("colour: {1: blue}\n", "key 1 is not text"),
        ("hbm_gib: 80\n", "duplicate key 'hbm_gib'"),
    ],
)
def test_keys_of_a_profile_are_text_given_once(tmp_path, extra, message):
    path = tmp_path / "bad.yaml"
    path.write_text(H200.read_text() + extra)
    with pytest.raises(ConfigError, match=re.escape(message)) as info:
        load_profile(path)
    assert "\n" not in str(info.value) and str(info.value).startswith(f"{path}:")
