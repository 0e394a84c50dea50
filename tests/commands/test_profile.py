"""``profile``: its settings are checked before any cluster (the backend, the run policy, the
layouts), and its rows say how each run ended; the runs themselves are faked here (real ones:
tests/runtime/test_layout_runs.py and tests/tuning/test_loop.py)."""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import pytest

from launchers.emulated.hardware import BUNDLED_PROFILE
from ray_layout.commands.common import command_parser
from ray_layout.commands.flags import from_args
from ray_layout.commands.main import main
from ray_layout.commands.profile import BackendFlags, ProfileSettings, _layouts
from ray_layout.errors import ConfigError, LayoutError
from ray_layout.runtime import layout_runs, local
from ray_layout.runtime.policy import RunPolicy
from tests.helpers.commands_cli import HANDBOOK, run_json
from tests.helpers.measure_runs import HANDBOOK_DESIGN

LAYOUT = "Et*5|t*6|t*5|mL"


def test_the_emulated_backend_runs_the_default_hardware_profile():
    backend = BackendFlags().to_backend()
    assert (backend.name, backend.hardware_profile) == ("emulated", Path(BUNDLED_PROFILE))
    assert backend.megatron_path is None


def test_a_megatron_backend_needs_a_checkout_with_pretrain_gpt(tmp_path):
    with pytest.raises(ConfigError, match="the megatron backend needs --megatron-path"):
        BackendFlags(backend="megatron")
    with pytest.raises(ConfigError, match=f"^--megatron-path {tmp_path}: no pretrain_gpt.py there"):
        BackendFlags(backend="megatron", megatron_path=str(tmp_path))
    (tmp_path / "pretrain_gpt.py").write_text("")
    backend = BackendFlags(backend="megatron", megatron_path=str(tmp_path)).to_backend()
    assert backend.megatron_path == tmp_path and backend.hardware_profile is None


def test_a_hardware_profile_that_is_missing_or_broken_is_refused_now(tmp_path):
    with pytest.raises(ConfigError, match=r"^--hardware nowhere\.yaml: no such file$"):
        BackendFlags(hardware="nowhere.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("gpu: [unclosed\n")
    with pytest.raises(ConfigError) as refused:
        BackendFlags(hardware=str(broken))
    assert str(broken) in str(refused.value) and "\n" not in str(refused.value)


def test_the_run_policys_flags_default_to_the_policy_and_are_checked(tmp_path):
    assert profile_settings(tmp_path).policy == RunPolicy()
    given = profile_settings(tmp_path, "--timeout-s", "5", "--max-retries", "0")
    assert given.policy == RunPolicy(timeout_s=5, max_retries=0)
    for flag, bad in (("--timeout-s", "0"), ("--heartbeat-s", "-1")):
        with pytest.raises(ConfigError, match=f"^{flag} must be"):
            profile_settings(tmp_path, flag, bad)


def profile_settings(tmp_path: Path, *argv: str) -> ProfileSettings:
    parser = command_parser(ProfileSettings, "profile", "")
    return from_args(
        ProfileSettings, parser.parse_args([HANDBOOK, "--store", str(tmp_path), *argv])
    )


def test_the_layouts_are_the_given_ones_checked_else_the_profile_designs(tmp_path):
    given = profile_settings(tmp_path, "--layout", LAYOUT, "--layout", "Et*4|t*4|t*4|t*4mL")
    assert [str(x) for x in _layouts(given, given.recipe())] == [LAYOUT, "Et*4|t*4|t*4|t*4mL"]
    designed = profile_settings(tmp_path)
    proposed = [str(x) for x in _layouts(designed, designed.recipe())]
    assert proposed == list(HANDBOOK_DESIGN)  # what profile-layouts proposes
    wrong = profile_settings(tmp_path, "--layout", "Et*5|t*6|t*5|L")
    with pytest.raises(LayoutError, match="0 MTP layers m, the model has 1"):
        _layouts(wrong, wrong.recipe())


@pytest.fixture
def fake_runs(monkeypatch):
    """No cluster: ``connected`` says 4 GPUs a node; each run ends as ``outcomes`` says."""
    outcomes: dict[str, str] = {}
    asked: list = []

    @contextmanager
    def connected(address, nodes, gpus_per_node):
        yield 4, "a fake cluster"

    def run_layouts(recipe, runs, **settings):
        asked.append(settings)
        return [_ended(run.layout, outcomes.get(str(run.layout), "finished")) for run in runs]

    monkeypatch.setattr(local, "connected", connected)
    monkeypatch.setattr(layout_runs, "run_layouts", run_layouts)
    return SimpleNamespace(outcomes=outcomes, asked=asked)


def _ended(layout, status: str) -> SimpleNamespace:
    failed = status != "finished"
    result = SimpleNamespace(
        status=status,
        attempts=2 if failed else 1,
        failure_class="hang" if failed else None,
        error="no iteration line for 600 s" if failed else None,
    )
    ingested = None if failed else SimpleNamespace(run_id=f"run-{len(str(layout))}")
    return SimpleNamespace(layout=layout, result=result, ingested=ingested)


def test_each_run_is_a_row_and_the_next_step_is_the_fit(capsys, tmp_path, fake_runs):
    store = str(tmp_path / "store")
    argv = ["profile", HANDBOOK, "--store", store, "--layout", LAYOUT, "--study", "s"]
    assert main([*argv, "--timeout-s", "60", "--train-iters", "9"]) == 0
    out = capsys.readouterr().out
    assert f"{LAYOUT}: finished (run-15)" in out
    assert f"next: python -m ray_layout fit {HANDBOOK} --store {store} --study s -o costs.json" in (
        " ".join(out.split())
    )
    (asked,) = fake_runs.asked
    assert asked["study"] == "s" and asked["options"].policy.timeout_s == 60
    assert asked["options"].settings.train_iters == 9 and asked["options"].gpus_per_node == 4


def test_a_run_that_did_not_finish_fails_the_command_after_every_row(capsys, tmp_path, fake_runs):
    fake_runs.outcomes[LAYOUT] = "failed"
    argv = [
        "profile",
        HANDBOOK,
        "--store",
        str(tmp_path),
        "--layout",
        LAYOUT,
        "--layout",
        "Et*4|t*4|t*4|t*4mL",
    ]
    assert main([*argv, "--json"]) == 1
    out, err = capsys.readouterr()
    assert err == "error: 1 of 2 profiling runs did not finish\n"
    rows = json.loads(out)
    assert [(row["status"], row["failure_class"], row["attempts"]) for row in rows] == [
        ("failed", "hang", 2),
        ("finished", None, 1),
    ]


def test_the_designs_layouts_are_run_when_none_is_given(capsys, tmp_path, fake_runs):
    rows = run_json(capsys, "profile", HANDBOOK, "--store", str(tmp_path))
    assert [row["layout"] for row in rows] == list(HANDBOOK_DESIGN)
