"""One emulated rank's entry: every bad input (environment, command line, profile) returns 2 with
one line on stderr before any process group is joined, and a run of another shape than the
profile's costs is warned about."""

from __future__ import annotations

import re

import pytest

from launchers.emulated.config import run_config
from launchers.emulated.environment import NODE_ENV, PROFILE_ENV
from launchers.emulated.hardware import load_profile
from launchers.emulated.rank_program import _warn_on_other_shape, main
from ray_layout.errors import EXIT_BAD_INPUT
from tests.helpers.launchers_emulated import H200, HANDBOOK
from tests.helpers.megatron_oracle import MEGATRON_CPU_WARNINGS

pytestmark = [pytest.mark.filterwarnings(w) for w in MEGATRON_CPU_WARNINGS]

GOOD = {"RANK": "0", "WORLD_SIZE": "4", PROFILE_ENV: str(H200)}


@pytest.mark.parametrize(
    ("environment", "argv", "message"),
    [
        (
            GOOD | {"WORLD_SIZE": None},
            HANDBOOK,
            "WORLD_SIZE must be a non-negative integer, got None",
        ),
        (GOOD | {"RANK": "-1"}, HANDBOOK, "RANK must be a non-negative integer, got '-1'"),
        (GOOD | {"RANK": "4"}, HANDBOOK, "RANK 4 is not below WORLD_SIZE 4"),
        (GOOD, [*HANDBOOK, "--no-such-flag"], "unknown Megatron flag --no-such-flag"),
        (GOOD | {PROFILE_ENV: None}, HANDBOOK, f"{PROFILE_ENV} is not set"),
        (GOOD | {PROFILE_ENV: "/no/such/profile.yaml"}, HANDBOOK, "/no/such/profile.yaml"),
        (GOOD | {NODE_ENV: "first"}, HANDBOOK, f"{NODE_ENV} must be a non-negative integer"),
        (
            GOOD | {"LOCAL_RANK": " "},
            HANDBOOK,
            "LOCAL_RANK must be a non-negative integer, got ' '",
        ),
    ],
)
def test_bad_input_returns_2_with_one_line(monkeypatch, capsys, environment, argv, message):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", PROFILE_ENV, NODE_ENV):
        monkeypatch.delenv(name, raising=False)
    for name, value in environment.items():
        if value is not None:
            monkeypatch.setenv(name, value)
    assert main(argv) == EXIT_BAD_INPUT
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert re.search(re.escape(message), err)


def test_a_run_of_another_shape_than_the_profiles_costs_is_warned_about(capsys):
    """The H200 profile has costs for EP 2; the handbook flags here run EP 1."""
    profile = load_profile(H200)
    _warn_on_other_shape(run_config(HANDBOOK, 4), profile)
    err = capsys.readouterr().err
    assert err == (
        "warning: h200_emulated has costs for micro-batch 2, sequence 4096, TP 1, EP 2; this run "
        "has 2, 4096, 1, 1: using them as they are\n"
    )
    same = run_config([*HANDBOOK, "--expert-model-parallel-size", "2"], 8)
    _warn_on_other_shape(same, profile)
    assert capsys.readouterr().err == ""
