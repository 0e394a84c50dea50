"""Scripts inside a script: ``bash -c`` (sees only exported variables), here-documents run by
``sbatch``, command substitutions of builtins."""

from __future__ import annotations

from ray_layout.shell.interpreter import run_script
from tests.helpers.shell_bash import bash_words, needs_bash


@needs_bash
def test_bash_c_sees_only_the_exported_variables_as_bash_does():
    script = 'export E=exported\nL=local\nbash -c \'cmd "$E" "$L" "$0" "$1"\' name arg\n'
    inner = run_script(script, "t.sh").commands[-1].argv
    assert list(inner) == bash_words("export E=exported; L=local", '"$E" "" name arg')


def test_a_slurm_here_document_is_expanded_then_run():
    script = (
        'ARGS=(--num-layers 4 --hidden-size 8)\nCMD="python pretrain_gpt.py ${ARGS[@]}"\n'
        "sbatch <<EOF\n#!/bin/bash\n"
        'srun bash -x -c "${CMD}" 2>&1 | tee \\${SLURM_JOB_ID}.log\nEOF\n'
    )
    argvs = [c.argv for c in run_script(script, "t.sh").commands]
    assert ("python", "pretrain_gpt.py", "--num-layers", "4", "--hidden-size", "8") in argvs
    assert ("tee", ".log") in argvs  # \${SLURM_JOB_ID} is the batch job's own, empty here


def test_a_substitution_that_runs_a_program_is_unresolved_and_says_which():
    run = run_script("N=$(nvidia-smi -L | wc -l)\n", "t.sh")
    assert "runs nvidia-smi (line 1)" in run.variables["N"].unresolved
