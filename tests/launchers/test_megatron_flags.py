"""A profiling run is the user's own job: every supported input (project YAML with
``megatron_args:``, the Hugging Face configs, a launch script) built into the full rank command
line and checked against Megatron's flag table, the tuner-owned flags replaced and reported, the
speed flags kept, and the study id keyed on the flags that change unit costs."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import replace
from pathlib import Path

import pytest

from launchers.megatron import MegatronRunSettings, megatron_arguments
from launchers.megatron_flags import TUNER_OWNED
from ray_layout.commands.main import main
from ray_layout.errors import ConfigError
from ray_layout.model.baselines import count_based
from ray_layout.model.layout import Layout
from ray_layout.model.loading import load_recipe
from ray_layout.model.megatron_args import megatron_flag_table
from ray_layout.model.megatron_recipe import load_megatron_command_line
from ray_layout.model.spec import Recipe, with_parallel
from ray_layout.runtime.layout_runs import Backend, rank_command, rank_env_of
from ray_layout.runtime.placement import launch_env, rank_order
from ray_layout.tuning.settings import study_id
from tests.helpers.paths import ROOT

SCRIPT = ROOT / "tests" / "data" / "train_moe_16l.sh"
HF = ROOT / "tests" / "data" / "hf"
FLAG_TABLE = ROOT / "ray_layout" / "model" / "data" / "megatron_args_core_v0.16.1.json"
SETTINGS = MegatronRunSettings(train_iters=30)


SPEED_FLAGS = (
    ["--moe-grouped-gemm"], ["--overlap-grad-reduce"], ["--overlap-param-gather"],
    ["--rotary-base", "1000000"], ["--norm-epsilon", "1e-6"],
    ["--moe-router-load-balancing-type", "aux_loss"], ["--moe-aux-loss-coeff", "1e-3"],
    ["--transformer-impl", "transformer_engine"], ["--lr", "1e-4"], ["--weight-decay", "0.1"],
)  # fmt: skip


def rank_argv(recipe: Recipe, layout: Layout | None, tmp_path: Path) -> list[str]:
    """The full command line of a rank of the real backend (a fake checkout)."""
    (tmp_path / "pretrain_gpt.py").touch()
    backend = Backend("megatron", megatron_path=tmp_path)
    command, _ = rank_command(backend, recipe, layout, SETTINGS)
    assert command[1] == str(tmp_path / "pretrain_gpt.py")
    return command[2:]


def check_against_table(args: list[str]) -> dict[str, list[str]]:
    """An independent walk over the JSON dump of Megatron's parser: every flag exists and
    appears once, switches take nothing, the rest their count of typed values.  Flag -> values."""
    table = {flag: entry for entry in json.loads(FLAG_TABLE.read_text()) for flag in entry["flags"]}
    found: dict[str, list[str]] = {}
    i = 0
    while i < len(args):
        flag = args[i]
        assert flag in table, flag
        assert flag not in found, f"{flag} twice"
        entry, i = table[flag], i + 1
        taken = []
        while i < len(args) and not args[i].startswith("--"):
            taken.append(args[i])
            i += 1
        if entry["nargs"] == 0:
            assert taken == [], flag
        elif entry["nargs"] is None:
            assert len(taken) == 1, flag
        converter = {"int": int, "float": float, "str": str}.get(entry["type"])
        for text in taken:
            if converter:
                typed = converter(text)
                assert entry["choices"] is None or typed in entry["choices"], (flag, text)
        found[flag] = taken
    return found


def yaml_with_flags(tmp_path: Path, flags: list[str]) -> Path:
    text = (ROOT / "configs" / "handbook_7b_a1b.yaml").read_text()
    path = tmp_path / "handbook.yaml"
    path.write_text(text + "\nmegatron_args: " + json.dumps(flags) + "\n")
    return path


def hf_with_flags(tmp_path: Path, name: str, flags: list[str]) -> Path:
    raw = json.loads((HF / name / "config.json").read_text()) | {"megatron_args": flags}
    path = tmp_path / name / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(raw))
    return path


def test_the_launch_script_profiles_with_every_one_of_its_speed_flags(tmp_path):
    recipe = load_recipe(str(SCRIPT))
    layout = Layout.parse("Ett|(tt|)*6t*2mL", 4)  # VPP 2, as the script's
    args = rank_argv(recipe, layout, tmp_path)
    found = check_against_table(args)
    for flag, *values in SPEED_FLAGS:
        assert found[flag] == values, flag
    assert found["--pipeline-model-parallel-layout"] == [str(layout)]
    assert found["--train-iters"] == ["30"] and "--mock-data" in found
    for owned in (
        "--save",
        "--load",
        "--data-path",
        "--tensorboard-dir",
        "--lr-warmup-iters",
        "--num-virtual-stages-per-pipeline-rank",
        "--split",
        "--tokenizer-model",
    ):
        assert owned not in found, owned  # fmt: skip
    notes = megatron_arguments(recipe, layout, SETTINGS).notes
    assert "replaced --train-iters 500000 with 30" in notes
    assert "removed --save $CHECKPOINT_PATH (checkpoint: the tuner's)" in notes
    assert len(notes) == len(set(notes))
    loaded = load_megatron_command_line(shlex.join(["torchrun", "--nproc_per_node", "16",
                                                    "pretrain_gpt.py", *args]))  # fmt: skip
    assert replace(loaded.model, name=recipe.model.name) == recipe.model
    assert loaded.parallel == recipe.parallel


def test_the_launch_script_without_a_layout_keeps_megatrons_vpp(tmp_path):
    found = check_against_table(rank_argv(load_recipe(str(SCRIPT)), None, tmp_path))
    assert found["--num-virtual-stages-per-pipeline-rank"] == ["2"]
    assert "--pipeline-model-parallel-layout" not in found


def test_kept_data_keeps_the_users_data_and_tokenizer(tmp_path):
    recipe = load_recipe(str(SCRIPT))
    merged = megatron_arguments(recipe, None, replace(SETTINGS, keep_data=True))
    found = check_against_table(list(merged.argv))
    assert found["--data-path"] == ["/data/corpus/fineweb_text_document"]
    assert found["--tokenizer-type"] == ["HuggingFaceTokenizer"]
    assert found["--vocab-size"] == ["151936"] and "--mock-data" not in found


@pytest.mark.parametrize("name", sorted(path.name for path in HF.iterdir()))
def test_every_hf_config_with_its_megatron_args(tmp_path, name):
    flags = ["--moe-grouped-gemm", "--recompute-granularity", "selective", "--train-iters", "9"]
    recipe = load_recipe(str(hf_with_flags(tmp_path, name, flags)))
    assert recipe.megatron_args[-len(flags) :] == tuple(flags)  # after the derived ones
    recipe = with_parallel(recipe, pp=4, dp=recipe.parallel.ep)
    m = recipe.model
    layout = count_based(m.num_layers, m.mtp_num_layers, 4)
    found = check_against_table(rank_argv(recipe, layout, tmp_path))
    assert found["--recompute-granularity"] == ["selective"] and "--moe-grouped-gemm" in found
    assert found["--train-iters"] == ["30"]
    if m.num_layers % 4 == 0:  # Megatron's own split exists
        found = check_against_table(rank_argv(recipe, None, tmp_path))
        assert "--pipeline-model-parallel-layout" not in found


def test_a_project_yaml_with_megatron_args_and_vpp(tmp_path):
    path = yaml_with_flags(tmp_path, ["--fp8-format", "hybrid", "--attention-backend", "flash"])
    recipe = with_parallel(load_recipe(str(path)), vpp=2)
    layout = Layout.parse("Ett|tt|tt|tt|tt|tt|tt|ttmL", 4)
    found = check_against_table(rank_argv(recipe, layout, tmp_path))
    assert found["--fp8-format"] == ["hybrid"] and found["--attention-backend"] == ["flash"]
    assert "--no-overlap-p2p-communication" not in found  # the user's overlap stays on


def test_a_user_who_turned_p2p_overlap_off_keeps_it_off(tmp_path):
    path = yaml_with_flags(tmp_path, ["--no-overlap-p2p-communication"])
    recipe = with_parallel(load_recipe(str(path)), vpp=2)
    layout = Layout.parse("Ett|tt|tt|tt|tt|tt|tt|ttmL", 4)
    found = check_against_table(rank_argv(recipe, layout, tmp_path))
    assert found["--no-overlap-p2p-communication"] == []


def test_profiling_runs_turn_ep_overlap_off_and_say_so_while_ab_runs_keep_it(tmp_path):
    """A profiling run's timers must part forward from backward, which combined 1F1B's merged
    steps do not (and Megatron refuses it on PP 4 without VPP): both flags leave it, once each."""
    ep_overlap = ["--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute"]
    recipe = with_parallel(load_recipe(str(yaml_with_flags(tmp_path, ep_overlap))), vpp=2)
    layout = Layout.parse("Ett|tt|tt|tt|tt|tt|tt|ttmL", 4)
    ab = megatron_arguments(recipe, layout, SETTINGS)
    assert set(ep_overlap) <= set(ab.argv) and not any("EP overlap" in n for n in ab.notes)
    profiling = megatron_arguments(recipe, layout, replace(SETTINGS, profiling=True))
    assert not set(ep_overlap) & set(profiling.argv)
    check_against_table(list(profiling.argv))
    removed = [note for note in profiling.notes if "EP overlap is off in profiling runs" in note]
    assert [note.split()[1] for note in removed] == ep_overlap


def test_deepseek_on_pp16_without_a_layout_is_an_error_naming_the_problem():
    recipe = with_parallel(load_recipe(str(HF / "DeepSeek-V3" / "config.json")), pp=16, ep=8,
                           dp=8)  # fmt: skip
    with pytest.raises(ConfigError, match=r"61 layers on PP 16 without a layout: .*not divisible"):
        megatron_arguments(recipe, None, SETTINGS)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--lr", "fast"], "--lr needs a value of type float"),
        ("--bf16", "megatron_args must be a list"),
        ([True], "megatron_args must be a list"),
    ],
)
def test_bad_megatron_args_are_one_line_errors_at_load(tmp_path, flags, message):
    path = tmp_path / "m.yaml"
    path.write_text((ROOT / "configs" / "handbook_7b_a1b.yaml").read_text()
                    + "\nmegatron_args: " + json.dumps(flags) + "\n")  # fmt: skip
    with pytest.raises(ConfigError, match=message):
        load_recipe(str(path))


def test_a_flag_the_table_does_not_know_is_kept_with_one_note(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text((ROOT / "configs" / "handbook_7b_a1b.yaml").read_text()
                    + '\nmegatron_args: ["--moe-grouped-gem"]\n')  # fmt: skip
    recipe = load_recipe(str(path))
    assert recipe.megatron_args == ("--moe-grouped-gem",)
    assert [note for note in recipe.notes if "--moe-grouped-gem unknown" in note]


def test_every_tuner_owned_flag_is_megatrons():
    table = megatron_flag_table()
    owned = [flag for flags in TUNER_OWNED.values() for flag in flags]
    assert [flag for flag in owned if flag not in table] == []
    assert len(owned) == len(set(owned))


def test_the_study_id_follows_the_flags_that_change_unit_costs():
    recipe = load_recipe("configs/handbook_7b_a1b.yaml")
    backend = Backend(
        "emulated", hardware_profile=Path("cluster_configs/hardware/h200_emulated.yaml")
    )
    plain = study_id(recipe, backend)
    with_lr = replace(recipe, megatron_args=("--lr", "3e-4"))
    assert study_id(with_lr, backend) == plain  # the learning rate costs nothing
    full = ("--recompute-granularity", "full", "--recompute-method", "uniform",
            "--recompute-num-layers", "1")  # fmt: skip
    for flags in (full, ("--fp8-format", "hybrid"),
                  ("--attention-backend", "flash"), ("--moe-router-dtype", "fp32"),
                  ("--overlap-grad-reduce",), ("--fp16",)):  # fmt: skip
        assert replace(recipe, megatron_args=flags).flags.cost_words == flags
        assert study_id(replace(recipe, megatron_args=flags), backend) != plain, flags
    nccl = replace(recipe, environment=(("NCCL_ALGO", "Ring"),))
    assert study_id(nccl, backend) != plain  # an export changes what runs measure


def test_megatron_command_prints_the_rank_command_line(capsys):
    layout = "Ett|(tt|)*6t*2mL"
    assert main(["megatron-command", str(SCRIPT), "--layout", layout, "--rank", "9", "--json"]) == 0
    out, err = capsys.readouterr()
    report = json.loads(out)
    assert set(report) == {"argv", "env"}
    assert report["argv"][1] == "/opt/megatron-lm/pretrain_gpt.py"
    found = check_against_table(report["argv"][2:])
    assert found["--pipeline-model-parallel-layout"] == [layout] and "--moe-grouped-gemm" in found
    assert report["env"]["RANK"] == "9" and report["env"]["WORLD_SIZE"] == "16"
    assert report["env"]["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"  # TP 2
    assert report["env"]["NCCL_IB_TIMEOUT"] == "19"  # the script's export
    assert "GPUS_PER_NODE" not in report["env"]  # a variable of the script, not exported
    assert "replaced --train-iters 500000 with 10" in err.splitlines()
    assert "exports carried into every rank: CUDA_DEVICE_MAX_CONNECTIONS=1, NCCL_IB_TIMEOUT=19" in (
        err.splitlines()
    )
    assert main(["megatron-command", str(SCRIPT), "--layout", layout]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith("PYTHONUNBUFFERED=1 ") and " --moe-grouped-gemm " in line
    assert re.search(r"--pipeline-model-parallel-layout 'Ett\|\(tt\|\)\*6t\*2mL'", line)


def test_megatron_command_prints_the_environment_a_run_launches_with(capsys):
    """The same rank of a run Ray placed on two nodes of 8 GPUs (in any order) is launched with
    exactly the environment megatron-command prints: every GPU of its node, LOCAL_RANK its own."""
    assert main(["megatron-command", str(SCRIPT), "--rank", "9", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)["env"]
    recipe = load_recipe(SCRIPT)
    placed = [(node, gpu) for node in ("raylet-b", "raylet-a") for gpu in range(7, -1, -1)]
    ordered = rank_order(placed, recipe.parallel)
    rank_env = rank_env_of(recipe, 8)
    assert printed == launch_env(rank_env, ordered, 9, "localhost", 29500)
    assert printed["CUDA_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7" and printed["LOCAL_RANK"] == "1"


def test_megatron_command_errors_are_one_line(capsys):
    hf = str(HF / "DeepSeek-V3" / "config.json")
    assert main(["megatron-command", hf, "--pp", "16", "--ep", "8", "--dp", "8"]) == 2
    assert "61 layers on PP 16 without a layout" in capsys.readouterr().err
    assert main(["megatron-command", str(SCRIPT), "--layout", "Et*8|t*8mL", "--rank", "16"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith("error: ")


def test_a_repeated_flag_keeps_its_last_value_once_and_fp16_replaces_bf16():
    recipe = load_recipe("configs/handbook_7b_a1b.yaml")
    flags = ("--clip-grad", "1.0", "--fp16", "--clip-grad", "0.5")
    args = list(megatron_arguments(replace(recipe, megatron_args=flags), None, SETTINGS).argv)
    found = check_against_table(args)
    assert found["--clip-grad"] == ["0.5"] and "--fp16" in found and "--bf16" not in found
