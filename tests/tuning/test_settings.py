"""What a tune needs besides the recipe: its options, each a flag of the tune command declared
once, and the study id its measurements are kept under: the same for the same measurements, new
for anything that changes them (a resume must never read a stale study)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from launchers.emulated.hardware import BUNDLED_PROFILE, load_profile
from ray_layout.ab.stats import ABConfig
from ray_layout.commands.flags import from_args
from ray_layout.commands.tune import TuneFlags, build_parser
from ray_layout.errors import ConfigError
from ray_layout.model.spec import with_parallel
from ray_layout.runtime.layout_runs import Backend
from ray_layout.tuning.settings import TuneOptions, study_id
from tests.helpers.tuning_small import CONFIG, HARDWARE, SMALL


def test_study_id_is_stable_and_changes_with_what_changes_the_measurements():
    emulated = Backend("emulated", hardware_profile=HARDWARE)
    assert study_id(SMALL, emulated) == study_id(SMALL, emulated)
    assert study_id(SMALL, emulated).startswith("handbook_7b_a1b-pp2-")
    other_hardware = Backend(
        "emulated", hardware_profile=Path("cluster_configs/hardware/a100_emulated.yaml")
    )
    assert study_id(SMALL, emulated) != study_id(SMALL, other_hardware)
    assert study_id(SMALL, emulated) != study_id(with_parallel(SMALL, dp=4), emulated)


EMULATED = Backend("emulated", hardware_profile=HARDWARE)


def test_a_flag_that_changes_unit_costs_is_a_new_study_and_one_that_does_not_is_not():
    flags = (*SMALL.megatron_args, "--log-interval", "5")
    assert study_id(replace(SMALL, megatron_args=flags), EMULATED) == study_id(SMALL, EMULATED)
    recompute = ("--recompute-granularity", "selective")
    ids = {
        study_id(replace(SMALL, megatron_args=(*flags, *recompute)), EMULATED),
        study_id(replace(SMALL, megatron_args=("--fp16",)), EMULATED),
        study_id(replace(SMALL, megatron_args=("--overlap-grad-reduce",)), EMULATED),
        study_id(SMALL, EMULATED),
    }
    assert len(ids) == 4


def test_a_launch_scripts_exports_are_a_new_study():
    nccl = replace(SMALL, environment=(("NCCL_ALGO", "Ring"),))
    assert study_id(nccl, EMULATED) != study_id(SMALL, EMULATED)
    other = replace(SMALL, environment=(("NCCL_ALGO", "Tree"),))
    assert study_id(nccl, EMULATED) != study_id(other, EMULATED)


def test_the_study_id_reads_as_the_model_and_its_pp():
    pp4 = study_id(with_parallel(SMALL, pp=4), EMULATED)
    assert pp4.startswith("handbook_7b_a1b-pp4-") and len(pp4.rpartition("-")[2]) == 8


def test_the_default_hardware_profile_is_there_to_load():
    assert load_profile(BUNDLED_PROFILE).hbm_gib > 0


def test_the_tune_runs_outside_the_repository_with_its_default_hardware(tmp_path, monkeypatch):
    """The default --hardware is found from the package, not from the working folder."""
    from ray_layout.commands.profile import BackendFlags

    monkeypatch.chdir(tmp_path)
    backend = BackendFlags().to_backend()
    assert backend.hardware_profile == BUNDLED_PROFILE and backend.hardware_profile.is_file()


def test_the_tune_command_s_flags_are_the_options_fields_with_their_defaults():
    """One declaration: the flag, its help and its default come from the option's field."""
    assert from_args(TuneFlags, build_parser().parse_args([CONFIG])).options == TuneOptions()
    text = build_parser().format_help()
    assert "  --samples SAMPLES     Monte Carlo samples\n" in text
    assert "  --hbm-gb HBM_GB       GPU memory limit in GiB for the search\n" in text
    given = build_parser().parse_args([CONFIG, "--samples", "64", "--allow-standalone-mtp"])
    options = from_args(TuneFlags, given).options
    assert (options.samples, options.allow_standalone_mtp, options.ab) == (64, True, ABConfig())


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"samples": 0}, "--samples must be >= 1, got 0"),
        ({"hbm_gib": 0.0}, "--hbm-gb must be positive, got 0.0"),
        ({"ab_top": -1}, "--ab-top must be >= 0, got -1"),
        ({"runs_at_once": 0}, "--runs-at-once must be >= 1, got 0"),
        ({"recompute": "always"}, "--recompute must be job or auto, got 'always'"),
    ],
)
def test_options_built_in_code_are_checked_as_the_flags_are(given, message):
    """The benchmarks build the options themselves: a bad value is the flag's one line."""
    with pytest.raises(ConfigError) as refused:
        TuneOptions(**given)
    assert str(refused.value) == message
