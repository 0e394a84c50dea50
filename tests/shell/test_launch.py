"""Which command of a script launches ``pretrain_gpt.py`` (through torchrun, srun, nsys, a
variable for ``bash -c``, or none: a model file), the words it hands Megatron, the environment of
every rank; a script file is read as every input file is (tests/model/test_files.py)."""

from __future__ import annotations

import pytest

from ray_layout.errors import ConfigError
from ray_layout.model.files import read_text
from ray_layout.shell.launch import read_launch
from ray_layout.shell.refusal import ShellError

ARGS = "--num-layers 4 --hidden-size 64"


def texts(words) -> list[str]:
    return [w.text for w in words]


@pytest.mark.parametrize(
    "line",
    [
        f"torchrun --nproc_per_node 8 /m/pretrain_gpt.py {ARGS}",
        f"srun --mpi=pmix nsys profile -o x python3 -u pretrain_gpt.py {ARGS}",
        f"python -m torch.distributed.run --nnodes 2 pretrain_gpt.py {ARGS}",
        f"/opt/conda/bin/python pretrain_gpt.py {ARGS} 2>&1 | tee log",
        f"exec numactl --cpunodebind=0 python pretrain_gpt.py {ARGS} &",
    ],
)
def test_the_launch_command_splits_into_launcher_and_arguments(line):
    script = (
        f"chmod +x pretrain_gpt.py\ncat <<EOF\npython pretrain_gpt.py --num-layers 9\nEOF\n{line}"
    )
    launch = read_launch(script, "t.sh")
    assert texts(launch.arguments) == ARGS.split()
    assert launch.launcher[0].text == line.split()[line.startswith("exec")]  # exec runs it
    assert not launch.is_model_file and not launch.reparsed
    assert {w.line for w in launch.arguments} == {5}


@pytest.mark.parametrize("tail", ["> train.log 2>&1", "|& tee train.log", "2>&1 | tee -a log"])
def test_a_number_then_a_spaced_redirection_is_an_argument(tail):
    launch = read_launch(f"python pretrain_gpt.py {ARGS} {tail}", "t.sh")
    assert texts(launch.arguments) == ARGS.split()  # bash: only '64>' redirects descriptor 64


def test_a_bare_argument_list_is_all_arguments():
    launch = read_launch(f"{ARGS}\n--seq-length 8", "cmd")
    assert launch.launcher == () and texts(launch.arguments) == [*ARGS.split(), "--seq-length", "8"]


def test_a_command_held_for_bash_c_is_read_through_its_variable():
    script = f'CMD="torchrun pretrain_gpt.py {ARGS}"\nsrun bash -c "$CMD"\n'
    launch = read_launch(script, "t.sh")
    assert texts(launch.arguments) == ARGS.split() and launch.reparsed
    assert "t.sh:2: the launch command is text run again (eval, bash -c)" in launch.notes
    first = launch.arguments[0]
    assert script[first.offsets[0] : first.offsets[-1] + 1] == "--num-layers"  # for the rewrite


def test_a_model_file_gives_the_variables_that_hold_num_layers():
    script = "MODEL_ARGS=(--num-layers 4\n  --hidden-size 64)\nOTHER=(--lr 1)\nX='--seq-length 8'\n"
    launch = read_launch(script, "model.sh")
    assert launch.is_model_file and texts(launch.arguments) == ARGS.split()
    assert launch.notes == (
        "model.sh: read as a model file: its arguments are $MODEL_ARGS (it runs no command)",
    )
    with pytest.raises(ShellError, match=r"no command runs a Python entry point and no variable"):
        read_launch("echo hi\n", "t.sh")  # echo is a builtin: no command runs
    with pytest.raises(
        ShellError, match=r"\(\$H, \$i may hold it: H is set in a for loop at line 1"
    ):
        read_launch("for i in $(ls); do H=(--num-layers $i); done\n", "t.sh")
    with pytest.raises(ShellError, match=r"^t\.sh: no command runs a Python entry point with "):
        read_launch("mkdir -p x\nMODEL_ARGS=(--num-layers 4)\n", "t.sh")  # runs: no model file


def test_a_conditional_launch_is_taken_with_a_note_and_two_different_ones_are_an_error():
    one = f'if [ -f "$CKPT" ]; then python pretrain_gpt.py {ARGS}; fi\n'
    launch = read_launch(one, "t.sh", {"CKPT": "/c"})
    assert texts(launch.arguments) == ARGS.split()
    assert launch.notes[0].startswith("t.sh:1: the launch command runs under line 1: a test on")
    only_if_set = f'if [ -n "$DEBUG" ]; then python pretrain_gpt.py {ARGS}; fi\n'
    with pytest.raises(ShellError, match=r"^t\.sh:1: this launch runs only with \$DEBUG set"):
        read_launch(only_if_set, "t.sh")  # bash takes $DEBUG as empty: the launch never runs
    two = (
        f'if [ "$M" = a ]; then python pretrain_gpt.py {ARGS}; '
        f"else python pretrain_gpt.py {ARGS} --x; fi"
    )
    with pytest.raises(ShellError, match=r"this launch runs only with \$M set .*line 1 runs as"):
        read_launch(two, "t.sh")
    assert texts(read_launch(two, "t.sh", {"M": "a"}).arguments) == ARGS.split()
    both = f"python pretrain_gpt.py {ARGS}\npython pretrain_gpt.py {ARGS} --y\n"
    with pytest.raises(
        ShellError, match=r"two different launch commands may both run, at line 1 and line 2$"
    ):
        read_launch(both, "t.sh")


def test_the_environment_is_the_exports_and_the_launch_lines_prefixes():
    script = (
        "export NCCL_DEBUG=INFO CUDA_DEVICE_MAX_CONNECTIONS=1\nexport HOST=$(hostname)\n"
        f"A=unexported\nOMP_NUM_THREADS=4 PORT=$P torchrun pretrain_gpt.py {ARGS}"
    )
    launch = read_launch(script, "t.sh")
    assert launch.environment == (
        ("CUDA_DEVICE_MAX_CONNECTIONS", "1"),
        ("NCCL_DEBUG", "INFO"),
        ("OMP_NUM_THREADS", "4"),
    )
    assert launch.unresolved_environment == ("HOST", "PORT")
    assert launch.prefixed == ("OMP_NUM_THREADS", "PORT")
    assert read_launch(script, "t.sh", {"P": "29500"}).environment[-1] == ("PORT", "29500")


def test_a_sourced_file_is_read_and_one_not_read_leaves_what_follows_unknown():
    files = {"/s/env.sh": "L=6\n"}
    read = read_launch(
        ". ./env.sh\npython pretrain_gpt.py --num-layers $L", "/s/t.sh", read_file=files.get
    )
    assert texts(read.arguments) == ["--num-layers", "6"]
    launch = read_launch(
        ". ./gone.sh\npython pretrain_gpt.py --num-layers $L", "/s/t.sh", read_file=files.get
    )
    assert launch.notes[0] == "/s/t.sh:1: not read: ./gone.sh"
    assert (
        "source ./gone.sh (line 1), a file this reader did not read"
        in launch.arguments[1].unresolved
    )


def test_a_script_file_is_read_as_every_input_file(tmp_path):
    path = tmp_path / "train.sh"
    path.write_bytes(b"echo \xff\n")
    with pytest.raises(ConfigError, match=r"^train\.sh: not UTF-8 text at byte 5 \(line 1\)$"):
        read_text(path, "train.sh")
