"""Hostile launch scripts: each ends read or refused in one line, within 30 s and
2 GiB, without a traceback, through the command a user runs (``python -m ray_layout size``, in a
child with a memory limit and an alarm: tests/helpers/isolated_command.py); and none is read
differently from bash without an error: where bash can run it (every script that ends and forks
no bomb), real bash with stubbed commands (tests/helpers/bash_oracle.py) is the judge of the
reader's commands and of the model the command sizes."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers.bash_oracle import (
    differences_from_bash,
    entry_commands,
    launch_words,
    launcher_problems,
    needs_bash,
    read_existing,
    run_bash,
    write_script,
)
from tests.helpers.isolated_command import run_isolated

LAUNCH = "torchrun --nproc_per_node 8 pretrain_gpt.py"
MODEL = "--hidden-size 1024 --num-attention-heads 16 --micro-batch-size 1 --global-batch-size 8"
SIZE_FLAGS = ("--vocab-size", "32000", "--seq-length", "4096")


def launch(layers: str = "$NUM_LAYERS", extra: str = "") -> str:
    return f"{LAUNCH} --num-layers {layers} {MODEL}{extra}"


@dataclass(frozen=True)
class Hostile:
    text: Callable[[], str]  # built on demand: some are megabytes
    outcome: str  # "read": must be read (as bash reads it); "refuse"; "either"
    bash: bool = True  # bash can judge it (it ends, and forks no bomb)
    lines: tuple[int, ...] = ()  # a refusal names these lines


def text(s: str) -> Callable[[], str]:
    return lambda: s


def fan_out(depth: int) -> str:
    names = "".join(f"a{i}='a{i - 1}+a{i - 1}'\n" for i in range(1, depth + 1))
    return f"a0=1\n{names}N=$((a{depth}))\nNUM_LAYERS=$(( N > 0 ? 24 : 12 ))\n{launch()}\n"


def nested(opening: str, inner: str, closing: str, depth: int) -> str:
    return opening * depth + inner + closing * depth


HOSTILE: dict[str, Hostile] = {
    # constructs that change the model: read as bash reads them
    "for_loop_appends_num_layers": Hostile(
        text(
            "ARGS=(--num-layers 12)\n"
            "for x in a; do ARGS+=(--num-layers 24); done\n"
            f'{LAUNCH} "${{ARGS[@]}}" {MODEL}\n'
        ),
        "read",
    ),
    "arithmetic_compound_assignment": Hostile(
        text(f"NUM_LAYERS=16\n(( NUM_LAYERS += 8 ))\n{launch()}\n"), "read"
    ),
    "array_element_assignment": Hostile(
        text(f"LS=(12 12)\nLS[0]=16\n{launch('${LS[0]}')}\n"), "read"
    ),
    "eval_of_a_known_assignment": Hostile(
        text(f"NUM_LAYERS=12\neval NUM_LAYERS=24\n{launch()}\n"), "read"
    ),
    "set_positional_parameters": Hostile(text(f"set -- 24\n{launch('$1')}\n"), "read"),
    "function_keyword_form": Hostile(
        text(f"NUM_LAYERS=12\nfunction f {{ NUM_LAYERS=24; }}\nf\n{launch()}\n"), "read"
    ),
    "nested_groups": Hostile(
        text(f"NUM_LAYERS=12\n{{ {{ {{ NUM_LAYERS=24; }} }} }}\n{launch()}\n"), "read"
    ),
    "200k_lines": Hostile(
        lambda: "N=0\n" + "N=$((N + 1))\n" * 200_000 + f"{launch('$((N / 10000))')}\n", "read"
    ),
    "3MB_word": Hostile(
        lambda: f"NUM_LAYERS=8\nX={'a' * 3_000_000}\n{launch(extra=' --data-path $X')}\n",
        "either",
    ),
    "3MB_word_in_the_line": Hostile(
        lambda: launch("8", extra=" --data-path " + "b" * 3_000_000) + "\n", "either"
    ),
    "small_arithmetic_fan_out": Hostile(lambda: fan_out(20), "either"),
    "self_referent_arithmetic": Hostile(
        text(f"a='a+1'\nNUM_LAYERS=12\nNUM_LAYERS=$((a))\n{launch()}\n"), "either"
    ),
    "working_directory_in_the_launch_line": Hostile(
        text("NUM_LAYERS=12\n" + launch(extra=' --save "$(pwd)/ckpt" --load `pwd`/ckpt') + "\n"),
        "either",
    ),
    # what the reader does not evaluate: refused, naming the construct's line
    "second_different_launch_line": Hostile(
        text(f"NUM_LAYERS=12\n\n{launch()}\n\nNUM_LAYERS=24\n\n{launch()}\n"),
        "refuse",
        lines=(3, 7),
    ),
    "eval_of_unknown_text": Hostile(
        text(f'NUM_LAYERS=12\nEXTRA=$(cat /etc/model.env)\n\neval "$EXTRA"\n{launch()}\n'),
        "refuse",
        lines=(4,),
    ),
    "source_of_a_missing_file": Hostile(
        text(
            "NUM_LAYERS=12\n\nsource ./missing_model.sh\n"
            f"{LAUNCH} --num-layers $NUM_LAYERS --hidden-size $HIDDEN_SIZE "
            "--num-attention-heads 16 --micro-batch-size 1 --global-batch-size 8\n"
        ),
        "refuse",
        lines=(3,),
    ),
    # bounds: read or refused, in time and memory (bash is no judge: it would not end)
    "string_doubling_counted": Hostile(
        text(f"NUM_LAYERS=12\nX=a\nfor ((i=0; i<64; i++)); do X=$X$X; done\n{launch()} $X\n"),
        "either",
        bash=False,
    ),
    "string_doubling_over_seq": Hostile(
        text(
            "NUM_LAYERS=12\nX=a\nfor i in $(seq 1 64); do X=$X$X; done\n"
            f"{launch(extra=' --tokenizer-model $X')}\n"
        ),
        "either",
    ),
    "string_doubling_forever": Hostile(
        text(f"NUM_LAYERS=12\nX=a\nwhile true; do X=$X$X; done\n{launch()}\n"),
        "refuse",
        bash=False,
    ),
    "array_doubling": Hostile(
        text(
            "NUM_LAYERS=12\nA=(a)\n"
            'for ((i=0; i<64; i++)); do A=("${A[@]}" "${A[@]}"); done\n'
            f'{launch()} "${{A[@]}}"\n'
        ),
        "either",
        bash=False,
    ),
    "arithmetic_fan_out": Hostile(lambda: fan_out(60), "either", bash=False),
    "nested_subshells": Hostile(
        lambda: f"NUM_LAYERS=12\n{nested('( ', 'true', ' )', 3000)}\n{launch()}\n",
        "either",
        bash=False,
    ),
    "nested_parentheses": Hostile(
        lambda: f"NUM_LAYERS=12\n{nested('(', 'true', ')', 3000)}\n{launch()}\n",
        "either",
        bash=False,
    ),
    "nested_command_substitutions": Hostile(
        lambda: f"NUM_LAYERS=12\nX={nested('$(echo ', '1', ')', 3000)}\n{launch()}\n",
        "either",
        bash=False,
    ),
    "deep_groups": Hostile(
        lambda: f"NUM_LAYERS=12\n{nested('{ ', 'NUM_LAYERS=24;', ' }', 3000)}\n{launch()}\n",
        "either",
        bash=False,
    ),
    "infinite_loop": Hostile(
        text(f"NUM_LAYERS=12\nwhile :; do :; done\n{launch()}\n"), "refuse", bash=False
    ),
    "infinite_recursion": Hostile(
        text(f"NUM_LAYERS=12\nf() {{ f; }}\nf\n{launch()}\n"), "refuse", bash=False
    ),
    "fork_bomb": Hostile(
        text(f"NUM_LAYERS=12\n:(){{ :|:& }};:\n{launch()}\n"), "either", bash=False
    ),
}


def layers_of(argv: tuple[str, ...]) -> int:
    """What Megatron's parser keeps of ``--num-layers`` (the last one given)."""
    values = [argv[i + 1] for i, word in enumerate(argv[:-1]) if word == "--num-layers"]
    return int(values[-1])


def bash_launches(path: Path) -> list[tuple[str, ...]]:
    run = run_bash(path)
    assert run.status is not None, "bash did not end"
    return [argv for argv in run.commands if "pretrain_gpt.py" in argv]


def without_path(message: str, path: Path) -> str:
    return message.replace(str(path), "SCRIPT")


@pytest.mark.parametrize("name", list(HOSTILE))
def test_the_command_ends_read_or_refused_in_one_line(name, tmp_path):
    case = HOSTILE[name]
    path = write_script(tmp_path, case.text())
    started = time.monotonic()
    outcome = run_isolated(["size", str(path), *SIZE_FLAGS, "--json"])
    seconds = time.monotonic() - started
    everything = outcome.stdout + outcome.stderr
    assert outcome.exit_code is not None, f"killed after {seconds:.0f} s: {outcome.stderr[-500:]}"
    assert seconds < 30
    assert "Traceback" not in everything, outcome.stderr[-3000:]
    if outcome.exit_code == 0:
        assert case.outcome != "refuse", f"read what must be refused: {outcome.stdout[:500]}"
        layout = json.loads(outcome.stdout)["layout"]
        if case.bash:  # the model sized is the one bash launches
            launches = bash_launches(path)
            assert len(launches) == 1
            assert layout == f"Et*{layers_of(launches[0])}L"
        return
    assert case.outcome != "read", f"refused: {outcome.stderr}"
    assert outcome.exit_code == 2, outcome.stderr
    assert len(outcome.stderr_lines) == 1, outcome.stderr
    message = without_path(outcome.stderr_lines[0], path)
    for line in case.lines:
        assert re.search(rf"(?<![0-9]){line}(?![0-9])", message), message


@needs_bash
@pytest.mark.parametrize("name", [name for name, case in HOSTILE.items() if case.bash])
def test_the_reader_never_differs_from_bash_without_an_error(name, tmp_path):
    from ray_layout.shell.interpreter import run_script
    from ray_layout.shell.launch import read_launch
    from ray_layout.shell.refusal import ShellError

    case = HOSTILE[name]
    script = case.text()
    path = write_script(tmp_path, script)
    bash = run_bash(path)
    assert bash.status is not None
    try:
        run = run_script(script, str(path), read_file=read_existing)
    except ShellError as error:
        assert "\n" not in str(error)
        assert case.outcome != "read", f"refused: {error}"
    else:
        assert differences_from_bash(run.commands, bash.commands, complete=False) == []
        if case.outcome == "read":
            assert differences_from_bash(run.commands, bash.commands, complete=True) == []
    try:
        reading = read_launch(script, str(path), read_file=read_existing)
    except ShellError as error:
        assert "\n" not in str(error)
        assert case.outcome != "read", f"refused: {error}"
        for line in case.lines:
            message = without_path(str(error), path)
            assert re.search(rf"(?<![0-9]){line}(?![0-9])", message), message
        return
    # read: the words it knows are bash's (what it does not know is the loader's to refuse,
    # which the command's test checks)
    launches = entry_commands(bash.commands)
    assert len(launches) == 1
    assert launcher_problems(launch_words(reading), launches[0]) == []
    if case.outcome == "read":
        assert reading.argv == launches[0]
