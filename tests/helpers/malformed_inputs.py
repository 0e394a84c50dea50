"""What the bad-input tests hand to the commands: the project's good files by absolute path
(the commands run in an empty folder), and the malformed files users have met."""

from __future__ import annotations

import json
import os
from pathlib import Path

from ray_layout.model.costs import load_costs
from ray_layout.model.layout import Layout
from ray_layout.model.spec import load_recipe_file
from tests.helpers.paths import HF_CONFIGS, ROOT
from tests.helpers.synthetic_runs import synthetic_log

HANDBOOK = str(ROOT / "configs/handbook_7b_a1b.yaml")
COSTS = str(ROOT / "configs/costs/handbook_h200_example.json")
HARDWARE = str(ROOT / "cluster_configs/hardware/h200_emulated.yaml")
LAYOUT = "Et*5|t*6|t*5|mL"


def write_inputs(folder: Path) -> dict[str, str]:
    """Write the malformed files and one good log into ``folder``; their paths by name
    (``{billion}`` in a test's argument), with ``{folder}`` an empty folder beside them."""
    handbook = Path(HANDBOOK).read_text()
    costs = json.loads(Path(COSTS).read_text())
    recipe = load_recipe_file(HANDBOOK)
    deepseek = json.loads((HF_CONFIGS / "DeepSeek-V3" / "config.json").read_text())
    qwen = json.loads((HF_CONFIGS / "Qwen3-30B-A3B" / "config.json").read_text())
    files = {
        "billion.yaml": handbook.replace("num_layers: 16", "num_layers: 1000000000"),
        "digits.yaml": handbook.replace("num_layers: 16", "num_layers: " + "9" * 5000),
        "deep.yaml": handbook.replace("num_layers: 16", "num_layers: 1024"),
        "zero_divisor.yaml": handbook.replace("divisible_by: 128", "divisible_by: 0"),
        "huge_costs.json": json.dumps(
            costs | {"forward_ms": dict.fromkeys(costs["forward_ms"], 1e308)}
        ),
        "zero_costs.json": json.dumps(
            costs
            | {
                "forward_ms": dict.fromkeys(costs["forward_ms"], 0),
                "backward_ms": dict.fromkeys(costs["backward_ms"], 0),
            }
        ),
        "broken_hardware.yaml": "name: [unclosed\n",
        # files that hung, ballooned, raised a traceback or were silently misread
        "laughs.yaml": handbook.replace("name: handbook_7b_a1b\n", _billion_laughs()),
        "twice.yaml": handbook + "num_layers: 24\n",
        "int_key.yaml": handbook + "1: 2\n",
        "int_key_parallel.yaml": handbook.replace("parallel:\n", "parallel:\n  1: 2\n"),
        "no_parallel.yaml": handbook.replace("parallel:\n", "parallel: false\nold_parallel:\n"),
        "freq.yaml": handbook.replace("moe_layer_freq: 1", "moe_layer_freq: '[1]*24'"),
        "tiny_costs.json": json.dumps(costs | {"mtp_standalone_factor": 1e-300}),
        "subnormal_costs.json": json.dumps(
            costs | {"forward_ms": costs["forward_ms"] | {"t": 5e-324}}
        ),
        "jitter_costs.json": json.dumps(costs | {"jitter_cv": {"t": 9e6}}),
        "twice_costs.json": json.dumps(costs).replace('"tp": 1,', '"tp": 1, "tp": 2,'),
        "layers_hf.json": json.dumps(deepseek | {"num_hidden_layers": 10**9}),
        "QWEN.JSON": json.dumps(qwen, indent="\t"),
        "run.log": synthetic_log(
            recipe.model,
            recipe.parallel,
            Layout.parse(LAYOUT, 4),
            load_costs(COSTS),
            32,
            iterations=6,
            seed=0,
        ),
    }
    for name, text in files.items():
        (folder / name).write_text(text)
    (folder / "latin1.yaml").write_bytes(handbook.encode() + b"name: caf\xe9\n")
    (folder / "latin1_costs.json").write_bytes(
        Path(COSTS).read_bytes().replace(b"manual", b"m\xe4")
    )
    with (folder / "sparse.yaml").open("wb") as sparse:
        sparse.truncate(9 * 10**9)
    os.mkfifo(folder / "fifo.yaml")
    (folder / "a_folder").mkdir()
    paths = {name.split(".")[0]: str(folder / name) for name in files}
    for name in ("latin1.yaml", "latin1_costs.json", "sparse.yaml", "fifo.yaml"):
        paths[name.split(".")[0]] = str(folder / name)
    return paths | {"log": paths["run"], "folder": str(folder / "a_folder")}


def _billion_laughs() -> str:
    """Nine levels of nine aliases: a few hundred bytes, 9**9 strings once walked."""
    lines = ["l0: &l0 [" + ", ".join(["lol"] * 9) + "]"]
    lines += [f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]" for i in range(1, 9)]
    return "laughs:\n" + "".join(f"  {line}\n" for line in lines) + "name: *l8\n"
