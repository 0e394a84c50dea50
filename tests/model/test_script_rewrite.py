"""--write-script: the user's script back with only its split changed, read back as the pick."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ray_layout.model.layout import Layout
from ray_layout.model.megatron_recipe import load_megatron_command_line
from ray_layout.model.script_rewrite import rewrite_split
from ray_layout.shell.refusal import ShellError

MODEL = ("--num-layers 8 --hidden-size 64 --num-attention-heads 4 --seq-length 128 "
         "--vocab-size 1000")  # fmt: skip
PICK = Layout.parse("Et*3|t*3|t*2L", 3)


def changed_lines(before: str, after: str) -> list[str]:
    old = before.splitlines()
    return [line for line in after.splitlines() if line not in old]


@pytest.mark.parametrize(
    "script",
    [
        f"#!/bin/bash\nARGS=(\n  {MODEL}\n  --pipeline-model-parallel-size 3\n)\n"
        "torchrun pretrain_gpt.py ${ARGS[@]}\n",
        f'L="Et*2|t*3|t*3L"\npython pretrain_gpt.py {MODEL} --pipeline-model-parallel-size 3 \\\n'
        "  --pipeline-model-parallel-layout $L\n",
        f"python pretrain_gpt.py {MODEL} --pipeline-model-parallel-size 3 \\\n"
        "  --decoder-first-pipeline-num-layers 2 \\\n  --decoder-last-pipeline-num-layers 2\n",
        f'CMD="python pretrain_gpt.py {MODEL} --pipeline-model-parallel-size 3"\nbash -c "$CMD"\n',
    ],
    ids=["array", "variable", "first-last", "bash-c"],
)
def test_only_the_split_changes_and_the_script_reads_back_as_the_pick(script):
    written = rewrite_split(script, "s.sh", PICK, "ray_layout plan: test")
    recipe = load_megatron_command_line(written, "s.sh")
    assert Layout.parse(recipe.split.layout, 3).stages == PICK.stages
    assert recipe.split.first_stage_layers is None and recipe.split.last_stage_layers is None
    added = changed_lines(script, written)
    assert added[0] == "# ray_layout plan: test"
    assert all("layout" in line or line.startswith(("#", "L=")) or not line.strip(" \\")
               for line in added[1:]), added  # fmt: skip
    kept = [line for line in script.splitlines() if "pipeline-num-layers" not in line
            and "-layout" not in line and not line.startswith("L=")]  # fmt: skip
    assert all(line in written.splitlines() or "--pipeline-model-parallel-size" in line
               or line.startswith("CMD=") for line in kept)  # fmt: skip


def test_a_computed_split_value_is_refused_not_guessed():
    script = f"L=$(cat layout)\npython pretrain_gpt.py {MODEL} --pipeline-model-parallel-layout $L"
    with pytest.raises(ShellError, match="computed, not written"):
        rewrite_split(script, "s.sh", PICK, "c", {"L": "Et*2|t*3|t*3L"})


def test_plan_writes_the_script_and_nothing_on_bad_input(tmp_path: Path):
    script = tmp_path / "train.sh"
    script.write_text(f"#!/bin/bash\npython pretrain_gpt.py {MODEL} "
                      "--pipeline-model-parallel-size 2 --pipeline-model-parallel-layout "
                      "'Et*6|t*2L'\n")  # fmt: skip
    out = tmp_path / "tuned.sh"
    command = [sys.executable, "-m", "ray_layout", "plan", str(script), "--costs", "flops",
               "--micro-batches", "4", "--write-script", str(out)]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    text = out.read_text()
    assert "# ray_layout plan: --pipeline-model-parallel-layout" in text.splitlines()[1]
    assert "over current" in text.splitlines()[1]
    recipe = load_megatron_command_line(text, str(out))
    assert recipe.split.layout and recipe.split.layout != "Et*6|t*2L"
    yaml_config = [*command[:4], "configs/handbook_7b_a1b.yaml", *command[5:-1]]
    bad = subprocess.run([*yaml_config, str(tmp_path / "no.sh")], capture_output=True, text=True,
                         check=False)  # fmt: skip
    assert bad.returncode == 2 and bad.stderr.count("error:") == 1
    assert not (tmp_path / "no.sh").exists()


def test_a_layout_inside_a_string_expanded_unquoted_has_no_glob_character(tmp_path):
    """MindSpeed keeps its flags in a string the launch line expands unquoted: the layout goes
    in unrolled, so that a file named like it cannot replace it (Megatron reads both alike)."""
    script = f'ARGS="{MODEL} --pipeline-model-parallel-size 3"\ntorchrun pretrain_gpt.py $ARGS\n'
    written = rewrite_split(script, "s.sh", PICK, "ray_layout plan: test")
    (line,) = [line for line in changed_lines(script, written) if "--pipeline" in line]
    assert "--pipeline-model-parallel-layout Ettt|ttt|ttL" in line
    (tmp_path / "Et*3|t*3|t*2L").touch()  # bash would have globbed the compact form onto it
    assert Layout.parse(load_megatron_command_line(written).split.layout, 3) == PICK
