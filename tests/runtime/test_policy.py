"""One run policy, one set of defaults: RunPolicy checks itself, every settings class nests it
whole rather than copying its fields, and its fields are the flags that build it."""

from __future__ import annotations

import importlib
import inspect
import math
import pkgutil
from dataclasses import MISSING, Field, fields, is_dataclass
from typing import get_type_hints

import pytest

import ray_layout
from ray_layout.commands import profile as profile_command
from ray_layout.commands.common import command_parser
from ray_layout.commands.flags import from_args
from ray_layout.commands.tune import TuneFlags, build_parser, tune_settings
from ray_layout.errors import ConfigError
from ray_layout.model.loading import load_recipe
from ray_layout.runtime.layout_runs import RunOptions, run_layouts
from ray_layout.runtime.policy import RunPolicy
from ray_layout.runtime.run_spec import RunSpec
from ray_layout.tuning.settings import TuneOptions

CONFIG = "configs/handbook_7b_a1b.yaml"
POLICY_FIELDS = {item.name: item for item in fields(RunPolicy)}


def _default(item: Field) -> object:
    if item.default_factory is not MISSING:
        return item.default_factory()
    return item.default


def _dataclasses_of(package) -> list[type]:
    """Every dataclass defined in a module of ``package`` (``__main__`` runs, so not that)."""
    found = []
    for module_info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        if module_info.name.rpartition(".")[2] == "__main__":
            continue
        module = importlib.import_module(module_info.name)
        found += [value for value in vars(module).values()
                  if isinstance(value, type) and is_dataclass(value)
                  and value.__module__ == module.__name__]  # fmt: skip
    return found


def test_a_policy_refuses_what_no_run_could_keep():
    assert RunPolicy(timeout_s=1, heartbeat_s=0.5, max_retries=0).timeout_s == 1
    for name in ("timeout_s", "heartbeat_s", "placement_timeout_s", "stop_grace_s"):
        for bad in (True, "60", None):
            with pytest.raises(ConfigError, match=f"^{name} must be a finite number of seconds"):
                RunPolicy(**{name: bad})
    for bad in (0, -1.0, math.nan, math.inf):
        with pytest.raises(ConfigError, match=r"^stop_grace_s must be a finite number of seconds"):
            RunPolicy(stop_grace_s=bad)
    for bad in (1.5, True, None):
        with pytest.raises(ConfigError, match=r"^max_retries must be a whole number >= 0"):
            RunPolicy(max_retries=bad)


def test_a_value_a_flag_refuses_is_refused_in_the_flag_s_words():
    """Built in code or from the command line, a policy says which flag a bad value is for."""
    with pytest.raises(ConfigError, match=r"^--max-retries must be >= 0, got -1$"):
        RunPolicy(max_retries=-1)
    for name in ("timeout_s", "heartbeat_s", "placement_timeout_s"):
        flag = "--" + name.replace("_", "-")
        for bad, problem in ((0, "must be positive"), (math.inf, "must be a finite number")):
            with pytest.raises(ConfigError, match=f"^{flag} {problem}, got {bad}$"):
                RunPolicy(**{name: bad})


def test_no_settings_class_keeps_a_policy_default_of_its_own():
    """A field named like a policy field outside RunPolicy, with a default of its own, is a
    copy that drifts from the policy."""
    classes = _dataclasses_of(ray_layout)
    names = {kind.__qualname__ for kind in classes}
    expected = {"TuneFlags", "ProfileSettings", "TuneOptions", "TuneSettings"}
    expected |= {"RunOptions", "RunSpec", "RunPolicy"}
    assert expected <= names
    copies = []
    for kind in classes:
        if kind is RunPolicy:
            continue
        for item in fields(kind):
            policy = POLICY_FIELDS.get(item.name)
            if policy is not None and _default(item) != policy.default:
                copies.append(f"{kind.__module__}.{kind.__qualname__}.{item.name}")
    assert copies == []


@pytest.mark.parametrize("kind", [TuneOptions, RunOptions, RunSpec])
def test_the_settings_that_carry_a_policy_nest_it_whole(kind):
    policy = next(item for item in fields(kind) if item.name == "policy")
    assert get_type_hints(kind)["policy"] is RunPolicy
    assert _default(policy) == RunPolicy()
    assert not POLICY_FIELDS.keys() & {item.name for item in fields(kind)}


def test_flags_build_one_policy_for_the_tune_and_the_profile_command(tmp_path):
    given = ["--timeout-s", "5", "--heartbeat-s", "2.5", "--max-retries", "0",
             "--placement-timeout-s", "7"]  # fmt: skip
    wanted = RunPolicy(timeout_s=5, heartbeat_s=2.5, max_retries=0, placement_timeout_s=7)
    flags = from_args(TuneFlags, build_parser().parse_args([CONFIG, *given]))
    assert tune_settings(flags, load_recipe(CONFIG), 4).options.policy == wanted
    untouched = from_args(TuneFlags, build_parser().parse_args([CONFIG]))
    assert tune_settings(untouched, load_recipe(CONFIG), 4).options.policy == RunPolicy()
    kind = profile_command.ProfileSettings
    parser = command_parser(kind, "profile", "profile")
    store = ["--store", str(tmp_path / "store")]
    assert from_args(kind, parser.parse_args([CONFIG, *store, *given])).policy == wanted
    assert from_args(kind, parser.parse_args([CONFIG, *store])).policy == RunPolicy()
    with pytest.raises(ConfigError, match="--max-retries must be >= 0"):
        from_args(kind, parser.parse_args([CONFIG, *store, "--max-retries", "-1"]))


def test_the_policy_s_flags_are_its_fields_in_the_runs_section_but_the_grace_period():
    text = build_parser().format_help()
    assert "runs:\n  --timeout-s TIMEOUT_S\n                        one attempt of a run" in text
    assert "--stop-grace-s" not in text


def test_run_layouts_takes_its_settings_by_name():
    parameters = list(inspect.signature(run_layouts).parameters.values())
    assert [p.name for p in parameters[:2]] == ["recipe", "runs"]
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in parameters[2:])
