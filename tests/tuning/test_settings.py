"""What a tune needs besides the recipe, and the study id its measurements are kept under: the
same for the same measurements, new for anything that changes them (a resume must never read a
stale study)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from launchers.emulated.hardware import BUNDLED_PROFILE, load_profile
from ray_layout.model.spec import with_parallel
from ray_layout.runtime.layout_runs import Backend
from ray_layout.tuning.settings import study_id
from tests.helpers.tuning_small import HARDWARE, SMALL


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
    flags = ("--log-interval", "5")
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
