"""Every real launch script of ../shared/data/real_launch_scripts (read in place, never copied
into the project) against real bash (tests/helpers/bash_oracle.py), with the environment and the
positional arguments a user would give (SOURCES.md, the scripts' headers):

- a script that runs a command: ``read_launch(...).argv`` is the argv bash passes to the command
  that runs the ``.py`` entry point (words the reader marks unknown, a value only the running job
  has, are not compared; the known words around them are);
- a model file (no command at all): its arguments are the words of the variable bash builds
  (``"${MODEL_ARGS[@]}"``, or ``${MODEL_ARGS}`` split as modelopt splits it), printed by a copy of
  the file in a temporary folder;
- a refusal is one line naming a hint (``--env NAME``, an argument after ``--``).

``EXPECTED`` says which scripts read and which are refused, so that a regression fails."""

from __future__ import annotations

import re
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.helpers.bash_oracle import (
    compare_known,
    entry_commands,
    is_known,
    launch_words,
    launcher_problems,
    needs_bash,
    run_bash,
)
from tests.helpers.paths import SHARED_DATA

pytestmark = needs_bash

SCRIPTS = SHARED_DATA / "real_launch_scripts"
MODEL_WORDS = "__model_words__"  # a command no one has: bash records the words it is given

# Pai-Megatron-Patch's positional parameters (examples/*/README*.md): ENV=dlc takes the nodes
# from the job's environment (dsw runs `python -c` and `shuf` for them).
PAI_ENV = {
    "WORLD_SIZE": "1",
    "RANK": "0",
    "KUBERNETES_CONTAINER_RESOURCE_GPU": "8",
    "MASTER_ADDR": "localhost",
    "MASTER_PORT": "29500",
}
PAI_TAIL = ("sel", "false", "100000", "/mnt/data/mmap_text_document", "/mnt/data/valid")
PAI_TAIL += ("/mnt/ckpt", "10000000000", "100000000", "/mnt/output")
PAI_DEEPSEEK_V2 = ("dlc", "A2.4B", "1", "8", "1e-5", "1e-6", "1024", "1024", "bf16")
PAI_DEEPSEEK_V2 += ("1", "1", "1", "4", "true", "true", "true", "false", *PAI_TAIL)
PAI_MOONLIGHT = ("dlc", "A3B", "1", "8", "1e-5", "1e-6", "1024", "1024", "bf16")
PAI_MOONLIGHT += ("1", "2", "1", "1", "8", "true", "true", "false", *PAI_TAIL)
PAI_QWEN2 = ("dlc", "A14B", "1", "8", "1e-5", "1e-6", "1024", "1024", "bf16")
PAI_QWEN2 += ("4", "2", "1", "1", "8", "true", "true", "true", "false", *PAI_TAIL)
GKE_ENV = {
    "NNODES": "8",
    "NODE_RANK": "0",
    "MASTER_ADDR": "h",
    "MASTER_PORT": "1",
    "FP8_RECIPE": "blockwise",
    "JOB_IDENTIFIER": "job",
}
GKE_NCCL = "/usr/local/gib/scripts/set_nccl_env.sh"  # on the GKE node only
SLIME_ENV = {"MASTER_ADDR": "10.0.0.1", "BASE_DIR": "/data", "no_proxy": "localhost"}


@dataclass(frozen=True)
class Real:
    environment: Mapping[str, str] = field(default_factory=dict)
    arguments: tuple[str, ...] = ()
    # True: read as bash reads it.  False: refused in one line with a hint.  None: either
    # refused, or read with what bash would do otherwise marked unknown (never a different reading)
    reads: bool | None = True
    hint: str = r"--env [A-Za-z_]\w*|after --|--env NAME"  # what a refusal must name
    model_words: str | None = None  # a model file: the expansion bash builds its arguments with
    # absolute paths the script sources that only the user's machine has: empty stand-ins, for
    # bash (in a copy of the script) and for the reader (through read_file)
    stand_ins: tuple[str, ...] = ()
    home: bool = False  # give `--home=FOLDER` with a FOLDER/Megatron-LM the script cd's into


ARRAY = '"${MODEL_ARGS[@]}"'
SPLIT = "${MODEL_ARGS}"

EXPECTED: dict[str, Real] = {
    "llm-on-gke_run-train.sh": Real(GKE_ENV, stand_ins=(GKE_NCCL,)),
    "mds_ds_pretrain_gpt_1.3B_PR-MoE64or128.sh": Real(),
    "mds_ds_pretrain_gpt_350M_PR-MoE32or64_MoS.sh": Real(),
    "mindspeed_pretrain_deepseek2_236b_8k_ptd.sh": Real(),
    "mindspeed_pretrain_mixtral_8x22b_32k_ptd.sh": Real(),
    "mlm_modelopt_NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.sh": Real(model_words=SPLIT),
    "modelopt_DeepSeek-V2-Lite.sh": Real(model_words=SPLIT),
    "modelopt_Qwen3-30B-A3B.sh": Real(model_words=SPLIT),
    "modelzoo_dnxie_launch_deepseek_v2_lite_direct.sh": Real({"USER": "me"}, home=True),
    # no Megatron flag at all: three `bash ./sbatch_benchmarking.sh` lines; the hint is that script
    "modelzoo_yanring_run_mixtral_8x22B.sh": Real(reads=False, hint="sbatch_benchmarking.sh"),
    "pai_deepseek_v2_run_mcore_deepseek.sh": Real(PAI_ENV, PAI_DEEPSEEK_V2),
    "pai_moonlight_run_mcore_moonlight.sh": Real(PAI_ENV, PAI_MOONLIGHT),
    "pai_qwen2_run_mcore_qwen2_moe.sh": Real(PAI_ENV, PAI_QWEN2),
    "sbatch_mfsdp_deepseek_v3.sh": Real(),
    "slime_deepseek-v3.sh": Real(model_words=ARRAY),
    "slime_glm4.5-355B-A32B.sh": Real(model_words=ARRAY),
    "slime_qwen3-30B-A3B.sh": Real(model_words=ARRAY),
    "train_mixtral_8x7b_distributed.sh": Real({"SLURM_NNODES": "4"}, ("/ckpt", "/tok", "/data")),
    "slime/scripts/run-glm4.7-30B-A3B.sh": Real(SLIME_ENV),
    "slime/scripts/run-glm5-744B-A40B.sh": Real(SLIME_ENV),
    "slime/scripts/run-qwen3-next-80B-A3B.sh": Real({**SLIME_ENV, "BASE_FOLDER": "/data"}),
    "slime/scripts/models/glm4.7-30B-A3B.sh": Real(model_words=ARRAY),
    "slime/scripts/models/glm5-744B-A40B.sh": Real(model_words=ARRAY),
    "slime/scripts/models/qwen3-next-80B-A3B.sh": Real(model_words=ARRAY),
}
# The same scripts as a user who follows the README literally runs them: refused, or read with
# what the reader cannot know marked unknown; never read wrong.  Pai's dsw asks `python -c` for
# the GPUs and `shuf` for the port; the GKE node's NCCL file is not on the user's machine (bash,
# under `set -e`, stops at its `source`).
VARIANTS: dict[str, tuple[str, Real]] = {
    "pai_deepseek_v2_dsw": (
        "pai_deepseek_v2_run_mcore_deepseek.sh",
        Real(arguments=("dsw", *PAI_DEEPSEEK_V2[1:]), reads=None),
    ),
    "gke_without_its_nccl_file": ("llm-on-gke_run-train.sh", Real(GKE_ENV, reads=None)),
}


def all_scripts() -> list[str]:
    if not SCRIPTS.is_dir():
        return []
    return sorted(
        str(path.relative_to(SCRIPTS))
        for pattern in ("*.sh", "slime/scripts/*.sh", "slime/scripts/models/*.sh")
        for path in SCRIPTS.glob(pattern)
    )


def test_every_shared_script_has_an_expectation():
    if not SCRIPTS.is_dir():
        pytest.skip(f"{SCRIPTS} is not there (the shared data of the project)")
    assert set(all_scripts()) == set(EXPECTED)


def reader_file(stand_ins: Sequence[str]):
    def read(path: str) -> str | None:
        if path in stand_ins:
            return ""
        try:
            return Path(path).read_text()
        except OSError:
            return None

    return read


def bash_run_of(name: str, real: Real, folder: Path, arguments: Sequence[str]):
    """Bash on the script in place, or on a copy in ``folder`` where it needs a stand-in or an
    added line (a model file's words)."""
    path = SCRIPTS / name
    text = path.read_text()
    if real.stand_ins or real.model_words:
        for absolute in real.stand_ins:
            stand_in = folder / "stand_ins" / absolute.lstrip("/")
            stand_in.parent.mkdir(parents=True, exist_ok=True)
            stand_in.write_text("")
            text = text.replace(absolute, str(stand_in))
        if real.model_words:
            text += f"\n{MODEL_WORDS} {real.model_words}\n"
        path = folder / "copy" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    run = run_bash(path, arguments, real.environment)
    assert run.status is not None, f"bash did not end on {name}"
    return run


def check(name: str, real: Real, tmp_path: Path) -> None:
    from ray_layout.shell.launch import read_launch
    from ray_layout.shell.refusal import ShellError

    path = SCRIPTS / name
    if not path.exists():
        pytest.skip(f"{path} is not there (the shared data of the project)")
    arguments = list(real.arguments)
    if real.home:
        (tmp_path / "home" / "Megatron-LM").mkdir(parents=True)
        arguments.append(f"--home={tmp_path / 'home'}")
    bash = bash_run_of(name, real, tmp_path, arguments)
    text = path.read_text()
    try:
        launch = read_launch(
            text,
            str(path),
            environment=dict(real.environment),
            arguments=arguments,
            read_file=reader_file(real.stand_ins),
        )
    except ShellError as error:
        message = str(error)
        assert "\n" not in message
        assert real.reads is not True, f"refused: {message}"
        assert re.search(real.hint, message), f"no hint a user can give: {message}"
        return
    assert real.reads is not False, f"read what must be refused: {launch.argv}"
    if real.model_words:
        assert launch.is_model_file
        words = [argv for argv in bash.commands if argv[0] == MODEL_WORDS]
        assert len(words) == 1, bash.stderr[-2000:]
        assert compare_known(launch_words(launch), words[0][1:]) == []
        assert list(launch.argv) == list(words[0][1:]) or any(
            not is_known(w) for w in launch_words(launch)
        )
        return
    assert not launch.is_model_file
    entries = entry_commands(bash.commands)
    if real.reads is None and not entries:  # bash never launches: the reader must not be sure
        unsure = [w.text for w in launch_words(launch) if not is_known(w)]
        said = [n for n in launch.notes if "not read" in n]  # a file only the job has
        assert unsure or said, (
            f"read a launch bash never runs ({bash.stderr[-300:]}): {launch.argv}"
        )
        return
    assert len(entries) == 1, f"bash ran {len(entries)} entry commands: {bash.stderr[-2000:]}"
    assert launcher_problems(launch_words(launch), entries[0]) == []


@pytest.mark.parametrize("name", list(EXPECTED))
def test_the_reader_reads_the_launch_bash_runs(name, tmp_path):
    check(name, EXPECTED[name], tmp_path)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_read_as_the_readme_says_never_wrong(variant, tmp_path):
    name, real = VARIANTS[variant]
    check(name, real, tmp_path)


def test_bash_itself_reaches_each_launch(tmp_path):
    """The oracle's own sanity: with the environment and arguments above, bash runs exactly one
    entry command (or, for a model file, builds its words) for each script expected to read."""
    if not SCRIPTS.is_dir():
        pytest.skip(f"{SCRIPTS} is not there (the shared data of the project)")
    for name, real in EXPECTED.items():
        if not real.reads:
            continue
        folder = tmp_path / name.replace("/", "_")
        folder.mkdir()
        arguments = list(real.arguments)
        if real.home:
            (folder / "home" / "Megatron-LM").mkdir(parents=True)
            arguments.append(f"--home={folder / 'home'}")
        bash = bash_run_of(name, real, folder, arguments)
        if real.model_words:
            assert [a for a in bash.commands if a[0] == MODEL_WORDS], name
        else:
            assert len(entry_commands(bash.commands)) == 1, (name, bash.stderr[-1500:])
        shutil.rmtree(folder)
