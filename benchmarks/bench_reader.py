"""How long does reading a launch script take?  Every real script in
``../shared/data/real_launch_scripts/`` read as ``size`` reads it (``read_launch`` with the files
beside it), and the hostile scripts that must end in bounded time: 200,000 lines, a 3 MB word,
string doubling, a function that calls itself, an endless loop.

    python benchmarks/bench_reader.py            # about 40 s on 2 cores
    python benchmarks/bench_reader.py --repeat 5 # the best of five per script

Targets: a real script in well under a second; any hostile script read or refused within 30 s
(the bound a user waits), as one line.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

from ray_layout.model.megatron_recipe import sourced_file
from ray_layout.shell.launch import read_launch
from ray_layout.shell.refusal import ShellError

SCRIPTS = Path(__file__).resolve().parents[2] / "shared" / "data" / "real_launch_scripts"
LAUNCH = "torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers {} --hidden-size 64\n"
HOSTILE: dict[str, Callable[[], str]] = {
    "200,000 lines": lambda: "N=0\n" + "N=$((N + 1))\n" * 200_000 + LAUNCH.format("$N"),
    "a 3 MB word": lambda: f"X={'a' * 3_000_000}\n" + LAUNCH.format("4 --data-path $X"),
    "string doubling": lambda: "X=ab\nwhile :; do X=$X$X; done\n" + LAUNCH.format("4"),
    "a function calling itself": lambda: "f() { f; }\nf\n" + LAUNCH.format("4"),
    "an endless loop": lambda: "while :; do :; done\n" + LAUNCH.format("4"),
    "3,000 nested groups": lambda: "{ " * 3000 + "X=1;" + " }" * 3000 + "\n" + LAUNCH.format("4"),
}


def read(text: str, source: str) -> str:
    try:
        launch = read_launch(text, source, read_file=sourced_file)
    except ShellError as exc:
        return f"refused: {str(exc)[:70]}"
    return "read" + (" (model file)" if launch.is_model_file else "")


def timed(text: str, source: str, repeat: int) -> tuple[float, str]:
    best, outcome = float("inf"), ""
    for _ in range(repeat):
        start = time.perf_counter()
        outcome = read(text, source)
        best = min(best, time.perf_counter() - start)
    return best, outcome


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=1, help="best of N reads per script")
    args = parser.parse_args()
    if not SCRIPTS.is_dir():
        print(f"{SCRIPTS} is not there: the real scripts are the project's shared data")
        return 1
    paths = sorted(SCRIPTS.rglob("*.sh"))
    print(f"{'script':58} {'ms':>8}  outcome")
    for path in paths:
        seconds, outcome = timed(path.read_text(), str(path), args.repeat)
        print(f"{path.relative_to(SCRIPTS)!s:58} {seconds * 1000:8.1f}  {outcome}")
    for name, build in HOSTILE.items():
        seconds, outcome = timed(build(), name, 1)
        print(f"{name:58} {seconds * 1000:8.1f}  {outcome}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
