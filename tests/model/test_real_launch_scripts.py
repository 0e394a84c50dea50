"""Every real launch script and HF config in ../shared/data (read in place, never copied) goes
through size, megatron-command, layouts and plan with the --env values and overrides it needs;
totals match the published counts (SOURCES.md), and the Megatron command line each gives is one
Megatron's own parse_args + validate_args accept (tests/megatron_arguments_oracle).  Then each
way a script can defeat a static reading, as a small script of its own."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from ray_layout.commands.main import main
from ray_layout.model.layout import parse_stages
from tests.helpers.bash_oracle import bash_commands, entry_commands
from tests.helpers.megatron_arguments_oracle import parse_megatron_args, validate_megatron_args
from tests.helpers.megatron_oracle import MEGATRON_CPU_WARNINGS
from tests.helpers.paths import SHARED_DATA

pytestmark = [pytest.mark.filterwarnings(w) for w in MEGATRON_CPU_WARNINGS]
BASH = shutil.which("bash")

SHARED = SHARED_DATA
SCRIPTS = SHARED / "real_launch_scripts"
HF_CONFIGS = SHARED / "real_hf_configs"

GKE_ENV = ("NNODES=8", "NODE_RANK=0", "MASTER_ADDR=h", "MASTER_PORT=1", "FP8_RECIPE=blockwise")
GKE_LAYOUT = "Et*2|(tt|)*22t|(tt|)*7mL"  # the script's own --pipeline-model-parallel-layout


@dataclass(frozen=True)
class Case:
    path: str  # relative to ../shared/data
    flags: tuple[str, ...]  # --env values and overrides the file needs
    published_b: float | None  # published total (billions, without MTP), SOURCES.md
    plan: tuple[str, ...]  # what plan needs on top: a PP that divides, micro-batches, EP
    strip: tuple[str, ...] = ()  # the user's own flags unknown to core 0.16.1, for the oracle


def env(*assignments: str) -> tuple[str, ...]:
    return tuple(word for text in assignments for word in ("--env", text))


# Model files (no launch command) have no global batch size, hence --micro-batches 8, and PP 1,
# hence --pp 4 for plan.
MICRO = ("--micro-batches", "8")
CASES = {
    # torchrun's --nnodes/--node_rank/--master_addr/--master_port come from the job's
    # environment (NNODES etc.), and FP8_RECIPE is tested by an `if` on the environment; the
    # tokenizer (HuggingFace) is not loaded, so the vocabulary is given.  World = 8 nodes x 8.
    # "DeepSeek-V3-shaped job": SOURCES.md publishes no count for it.
    "gke": Case(
        "real_launch_scripts/llm-on-gke_run-train.sh",
        (*env(*GKE_ENV), "--vocab-size", "129280"),
        None,
        ("--pp", "8", "--top", "1"),
    ),
    # Model files whose tokenizer (HuggingFace) is not loaded: the vocabulary is given.
    "modelopt_dsv2_lite": Case(
        "real_launch_scripts/modelopt_DeepSeek-V2-Lite.sh",
        ("--vocab-size", "102400"),
        15.7,
        ("--pp", "4", *MICRO),
    ),
    "modelopt_qwen3": Case(
        "real_launch_scripts/modelopt_Qwen3-30B-A3B.sh",
        ("--vocab-size", "151936"),
        30.5,
        ("--pp", "4", *MICRO),
    ),
    # HuggingFace tokenizer: vocabulary given.  Its --megatron-fsdp-* flags are the user's own,
    # unknown to core 0.16.1's parser (passed through with a note): stripped before the oracle.
    "sbatch_dsv3": Case(
        "real_launch_scripts/sbatch_mfsdp_deepseek_v3.sh",
        ("--vocab-size", "129280"),
        671,
        ("--pp", "4", "--top", "1"),
        strip=("--megatron-fsdp-grad-comm-dtype", "--megatron-fsdp-main-grads-dtype"),
    ),
    # MOE_LAYER_FREQ is built by a loop and $(IFS=', '; echo ...): read with no hint; the
    # model file sets no --seq-length.
    "slime_dsv3": Case(
        "real_launch_scripts/slime_deepseek-v3.sh",
        ("--seq-length", "4096"),
        671,
        ("--pp", "4", *MICRO),
    ),
    "slime_qwen3": Case(
        "real_launch_scripts/slime_qwen3-30B-A3B.sh",
        ("--seq-length", "4096"),
        30.5,
        ("--pp", "4", *MICRO),
    ),
    # No --seq-length in the model file.
    "slime_glm45": Case(
        "real_launch_scripts/slime_glm4.5-355B-A32B.sh",
        ("--seq-length", "4096"),
        355,
        ("--pp", "4", *MICRO),
    ),
    # SLURM_NNODES and WANDB_API_KEY come from the job's environment, $1 $2 $3 are the script's
    # arguments (checkpoint, tokenizer, data paths); the Llama-2 tokenizer is not loaded.
    "mixtral": Case(
        "real_launch_scripts/train_mixtral_8x7b_distributed.sh",
        (
            *env("SLURM_NNODES=4", "WANDB_API_KEY=", "1=/ckpt", "2=/tok", "3=/data"),
            "--vocab-size",
            "32000",
        ),
        46.7,
        ("--pp", "4"),
    ),
    # HF configs need nothing.
    "kimi_k2": Case(
        "real_hf_configs/Kimi-K2-Instruct/config.json", (), 1040, ("--pp", "4", *MICRO)
    ),
    "glm45_air": Case("real_hf_configs/GLM-4.5-Air/config.json", (), 106, ("--pp", "4", *MICRO)),
}


def params(marks: dict[str, pytest.MarkDecorator] | None = None):
    marks = marks or {}
    return [pytest.param(name, id=name, marks=marks.get(name, ())) for name in CASES]


def path_of(case: Case) -> str:
    path = SHARED / case.path
    if not path.exists():
        pytest.skip(f"{path} is not there (the shared data of the project)")
    return str(path)


def run_json(capsys, *argv: str) -> dict:
    capsys.readouterr()
    assert main([*argv, "--json"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("name", params())
def test_size_total_matches_the_published_count(name, capsys):
    case = CASES[name]
    report = run_json(capsys, "size", path_of(case), *case.flags)
    total = report["parameters"]["total"]  # excludes MTP layers ("mtp" is its own key)
    assert total > 0
    if case.published_b is not None:
        assert total / 1e9 == pytest.approx(case.published_b, rel=0.015)


def megatron_command(capsys, case: Case, *extra: str) -> tuple[list[str], int]:
    report = run_json(capsys, "megatron-command", path_of(case), *case.flags, *extra)
    argv = report["argv"][2:]  # without python and pretrain_gpt.py
    assert report["env"]["RANK"] == "0"
    return argv, int(report["env"]["WORLD_SIZE"])


def without(argv: list[str], flags: tuple[str, ...]) -> list[str]:
    """argv without each of ``flags`` and its value."""
    kept: list[str] = []
    skip = False
    for word in argv:
        if skip:
            skip = False
        elif word in flags:
            skip = True
        else:
            kept.append(word)
    return kept


@pytest.mark.megatron
@pytest.mark.parametrize("name", params())
def test_megatron_command_passes_megatron_validate_args(name, capsys):
    case = CASES[name]
    argv, world = megatron_command(capsys, case)
    for flag in case.strip:
        assert flag in argv
    validate_megatron_args(parse_megatron_args(without(argv, case.strip)), world)


@pytest.mark.megatron
def test_gke_command_with_its_layout_given_passes_megatron(capsys):
    case = CASES["gke"]
    argv, world = megatron_command(capsys, case, "--layout", GKE_LAYOUT)
    assert world == 8 * 8
    args = validate_megatron_args(parse_megatron_args(argv), world)
    assert args.pipeline_model_parallel_size == 8


def test_gke_command_keeps_the_scripts_own_layout(capsys):
    case = CASES["gke"]
    argv, _ = megatron_command(capsys, case)
    given = argv[argv.index("--pipeline-model-parallel-layout") + 1].strip("'")
    assert parse_stages(given) == parse_stages(GKE_LAYOUT)


@pytest.mark.parametrize("name", params())
def test_layouts_count(name, capsys):
    case = CASES[name]
    pp = case.plan[case.plan.index("--pp") + 1]
    capsys.readouterr()
    assert main(["layouts", path_of(case), *case.flags, "--pp", pp, "--count"]) == 0
    assert capsys.readouterr().out.strip()


# gke's plan is test_gke_plan_lists_the_scripts_layout_as_current (about 8 s).
@pytest.mark.parametrize("name", [p for p in params() if p.id != "gke"])
def test_plan_from_flops(name, capsys):
    case = CASES[name]
    start = time.monotonic()
    report = run_json(capsys, "plan", path_of(case), *case.flags, *case.plan, "--costs", "flops")
    assert report["candidates"]
    assert time.monotonic() - start < 60


def test_gke_plan_lists_the_scripts_layout_as_current(capsys):
    case = CASES["gke"]
    start = time.monotonic()
    report = run_json(capsys, "plan", path_of(case), *case.flags, *case.plan, "--costs", "flops")
    assert time.monotonic() - start < 60  # about 9 s with --top 1 (PP 8, VPP 4, 61 layers)
    assert report["pp"] == 8 and report["vpp"] == 4
    current = {b["name"]: b for b in report["baselines"]}["current"]
    assert parse_stages(current["layout"]) == parse_stages(GKE_LAYOUT)  # the same 32 stages


# --------------------------------------------------------------------------------------------
# Failure modes, each a small script


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "run.sh"
    path.write_text(text)
    return str(path)


REST = "--hidden-size 256 --num-attention-heads 8 --seq-length 512 \\\n"
REST += "  --max-position-embeddings 512 --vocab-size 1024 --micro-batch-size 1 \\\n"
REST += "  --global-batch-size 8"
MODEL = f"--num-layers 4 {REST}"


def errors(capsys, argv: list[str]) -> str:
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, err
    return lines[0]


def test_unset_nnodes_names_the_line_and_the_env_flag(tmp_path, capsys):
    script = write(tmp_path, f"set -e\ntorchrun --nnodes $NNODES pretrain_gpt.py {MODEL}\n")
    line = errors(capsys, ["size", script])
    assert "run.sh:2" in line and "--env NNODES=VALUE" in line


def test_command_substitution_for_num_layers_names_the_variable(tmp_path, capsys):
    text = f"LAYERS=$(cat layers.txt)\ntorchrun pretrain_gpt.py --num-layers $LAYERS {REST}\n"
    line = errors(capsys, ["size", write(tmp_path, text)])
    assert "LAYERS" in line and "--env LAYERS=VALUE" in line


def test_if_on_unset_env_leaves_its_variable_unresolved(tmp_path, capsys):
    text = (
        'if [ "$USE_BIG" = 1 ]; then\n  LAYERS=4\nfi\n'
        f"torchrun pretrain_gpt.py --num-layers $LAYERS {REST}\n"
    )
    line = errors(capsys, ["size", write(tmp_path, text)])
    assert "run.sh:4" in line and "--num-layers" in line and "LAYERS" in line
    assert "and on $USE_BIG" in line  # bash takes it as empty: LAYERS is never set


def test_chmod_of_pretrain_gpt_is_not_the_launch(tmp_path, capsys):
    text = f"chmod +x /m/pretrain_gpt.py\ntorchrun /m/pretrain_gpt.py {MODEL}\n"
    report = run_json(capsys, "size", write(tmp_path, text))
    assert report["parameters"]["total"] > 0


def test_launch_inside_heredoc_is_not_taken(tmp_path, capsys):
    text = (
        f"cat > inner.sh <<EOF\ntorchrun pretrain_gpt.py --num-layers 99 {REST}\nEOF\n"
        f"torchrun pretrain_gpt.py {MODEL}\n"
    )
    argv, _ = megatron_command(capsys, Case(write(tmp_path, text), (), None, ()))
    assert argv[argv.index("--num-layers") + 1] == "4"


def test_omp_prefix_goes_into_the_ranks_env(tmp_path, capsys):
    script = write(tmp_path, f"OMP_NUM_THREADS=8 torchrun pretrain_gpt.py {MODEL}\n")
    report = run_json(capsys, "megatron-command", script)
    assert report["env"]["OMP_NUM_THREADS"] == "8"


def test_model_file_asks_for_seq_length(tmp_path, capsys):
    text = "MODEL_ARGS=(\n  --num-layers 4 --hidden-size 256 --num-attention-heads 8\n)\n"
    line = errors(capsys, ["size", write(tmp_path, text), "--vocab-size", "1024"])
    assert "--seq-length" in line


def test_single_quoted_dollar_stays_literal(tmp_path, capsys):
    text = f"torchrun pretrain_gpt.py {MODEL} \\\n  --data-path '$X'\n"
    # --keep-data: megatron-command otherwise swaps the user's data flags for mock data
    argv, _ = megatron_command(capsys, Case(write(tmp_path, text), (), None, ()), "--keep-data")
    assert argv[argv.index("--data-path") + 1] == "$X"


def test_unknown_flag_is_a_note_and_size_succeeds(tmp_path, capsys):
    text = f"torchrun pretrain_gpt.py {MODEL} --my-own-flag 3\n"
    capsys.readouterr()
    assert main(["size", write(tmp_path, text)]) == 0
    err = capsys.readouterr().err
    assert "note:" in err and "--my-own-flag" in err and "error:" not in err


SPLIT_WORDS = ("--pipeline-model-parallel-layout", "--pipeline-model-parallel-size",
               "--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers",
               "--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank",
               "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split",
               "# ray_layout plan: ")  # fmt: skip


@pytest.mark.parametrize("name", [n for n in CASES if CASES[n].path.endswith(".sh")])
def test_the_written_script_differs_only_in_its_split_and_reads_back_as_the_pick(
    name, capsys, tmp_path
):
    case = CASES[name]
    out = tmp_path / Path(case.path).name
    report = run_json(capsys, "plan", path_of(case), *case.flags, *case.plan, "--costs", "flops",
                      "--write-script", str(out))  # fmt: skip
    before = Path(path_of(case)).read_text().splitlines()
    after = out.read_text().splitlines()
    removed = [line for line in before if line not in after]
    added = [line for line in after if line not in before]
    assert added and all(any(word in line for word in SPLIT_WORDS) for line in added), added
    assert all(any(word in line for word in SPLIT_WORDS) for line in removed), removed
    assert len(after) - len(before) in (1, 2)  # the comment, and the layout's own line
    flags = [*case.flags, *case.plan[: case.plan.index("--pp") + 2]]
    back = run_json(capsys, "size", str(out), *flags)
    assert back["layout_source"].startswith("current")
    assert parse_stages(back["layout"]) == parse_stages(report["candidates"][0]["layout"])
    if BASH is not None:  # bash itself: the copy parses, and runs the pick as its layout
        assert subprocess.run([BASH, "-n", str(out)], check=False).returncode == 0
        ran = _layout_bash_runs(out, case)  # None: a model file, or a launch bash cannot reach
        assert ran in (None, report["candidates"][0]["layout"])


PAI_ENV = env("RANK=0", "KUBERNETES_CONTAINER_RESOURCE_GPU=8")
PAI_DATA = ("/mnt/data", "/mnt/data", "/mnt/ckpt")


def script_args(*words: str) -> tuple[str, ...]:
    """A script's own arguments, as ``-- WORDS`` gives them."""
    return tuple(f"--script-arg={word}" for word in words)


# Scripts the reader had never seen (the shared samples), read through `size` as a user would,
# with only the hints SOURCES.md and their READMEs name: (flags, published total in billions).
FIRST_CONTACT = {
    "mindspeed_pretrain_deepseek2_236b_8k_ptd.sh": ((), 236),
    "mindspeed_pretrain_mixtral_8x22b_32k_ptd.sh": ((), 141),
    "mds_ds_pretrain_gpt_1.3B_PR-MoE64or128.sh": (("--vocab-size", "50257"), 31),
    "mds_ds_pretrain_gpt_350M_PR-MoE32or64_MoS.sh": (("--vocab-size", "50257", "--ep", "32"), 3.5),
    "slime/scripts/run-glm4.7-30B-A3B.sh": (("--seq-length", "4096"), 30),
    "slime/scripts/run-glm5-744B-A40B.sh": (("--seq-length", "4096"), 744),
    "modelzoo_dnxie_launch_deepseek_v2_lite_direct.sh": (
        (*env("USER=u"), "--vocab-size", "102400"),
        15.7,
    ),
    "pai_qwen2_run_mcore_qwen2_moe.sh": (
        (
            *PAI_ENV,
            *env("WORLD_SIZE=4"),
            "--vocab-size",
            "151643",
            *script_args(
                "dlc",
                "A14B",
                "1",
                "8",
                "1e-5",
                "1e-6",
                "128",
                "128",
                "bf16",
                "4",
                "2",
                "1",
                "4",
                "4",
                "true",
                "true",
                "true",
                "false",
                "sel",
                "false",
                "100000",
                *PAI_DATA,
                "10000",
                "100",
                "/mnt/out",
            ),
        ),
        57.41,
    ),
    "pai_moonlight_run_mcore_moonlight.sh": (
        (
            *PAI_ENV,
            *env("WORLD_SIZE=1"),
            "--vocab-size",
            "163840",
            *script_args(
                "dlc",
                "A3B",
                "1",
                "8",
                "1e-5",
                "1e-6",
                "1024",
                "1024",
                "bf16",
                "1",
                "1",
                "1",
                "1",
                "8",
                "true",
                "true",
                "false",
                "none",
                "false",
                "100000",
                *PAI_DATA,
                "10000",
                "100",
                "/mnt/out",
            ),
        ),
        16,
    ),
}


@pytest.mark.parametrize("name", list(FIRST_CONTACT))
def test_a_script_never_seen_before_sizes_to_its_published_count(name, capsys):
    flags, published = FIRST_CONTACT[name]
    path = SCRIPTS / name
    if not path.exists():
        pytest.skip(f"{path} is not there (the shared data of the project)")
    report = run_json(capsys, "size", str(path), *flags)
    assert report["parameters"]["total"] / 1e9 == pytest.approx(published, rel=0.015)


@pytest.mark.parametrize(
    ("name", "hint"),
    [
        ("modelzoo_yanring_run_mixtral_8x22B.sh", r"runs another script \(bash \./sbatch_benchm"),
        ("slime/scripts/run-qwen3-next-80B-A3B.sh", r"give --env BASE_FOLDER=VALUE"),
        ("modelzoo_dnxie_launch_deepseek_v2_lite_direct.sh", r"give --env USER=VALUE"),
    ],
)
def test_a_script_that_cannot_be_read_as_given_names_what_settles_it(name, hint, capsys):
    path = SCRIPTS / name
    if not path.exists():
        pytest.skip(f"{path} is not there (the shared data of the project)")
    capsys.readouterr()
    assert main(["size", str(path), "--vocab-size", "32000", "--seq-length", "4096"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: ") and re.search(hint, err), err


def _layout_bash_runs(script: Path, case: Case) -> str | None:
    """The ``--pipeline-model-parallel-layout`` value of the launch real bash runs (every
    command stubbed), with the case's environment and arguments; None for a model file."""
    given = [case.flags[i + 1] for i, flag in enumerate(case.flags) if flag == "--env"]
    variables = dict(text.partition("=")[::2] for text in given)
    arguments = [variables.pop(str(n)) for n in range(1, 10) if str(n) in variables]
    entries = entry_commands(bash_commands(script, arguments, variables))
    if not entries:
        return None
    argv = entries[-1]
    flag = "--pipeline-model-parallel-layout"
    return argv[argv.index(flag) + 1] if flag in argv else None


def test_a_layout_written_into_an_evaled_command_is_the_one_bash_runs(capsys, tmp_path):
    """Pai builds its command in a string and runs ``eval ${run_cmd}``: the layout goes into the
    string quoted for that second reading, and real bash runs exactly the pick."""
    name = "pai_qwen2_run_mcore_qwen2_moe.sh"
    flags, _ = FIRST_CONTACT[name]
    path, out = SCRIPTS / name, tmp_path / name
    if not path.exists():
        pytest.skip(f"{path} is not there (the shared data of the project)")
    report = run_json(capsys, "plan", str(path), *flags, "--costs", "flops", "--top", "1",
                      "--write-script", str(out))  # fmt: skip
    pick = report["candidates"][0]["layout"]
    changed = [line for line in out.read_text().splitlines() if line not in path.read_text()]
    assert len(changed) == 2 and f"'{pick}'" in changed[1]  # the comment and the flag
    if BASH is None:
        pytest.skip("no bash on this machine to judge by")
    arguments = [word.removeprefix("--script-arg=") for word in flags if "--script-arg=" in word]
    variables = dict(text.partition("=")[::2] for text in flags if "=" in text and "--" not in text)
    argv = entry_commands(bash_commands(out, arguments, variables))[-1]
    assert argv[argv.index("--pipeline-model-parallel-layout") + 1] == pick
