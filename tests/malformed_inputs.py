"""What the bad-input tests hand to the commands: the project's good files by absolute path
(the commands run in an empty folder), and the malformed files the issue's reproducers name."""

from __future__ import annotations

import json
from pathlib import Path

from ray_layout.model.costs import load_costs
from ray_layout.model.layout import Layout
from ray_layout.model.spec import load_recipe_file
from tests.synthetic_runs import synthetic_log

ROOT = Path(__file__).resolve().parents[1]
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
    (folder / "a_folder").mkdir()
    paths = {name.split(".")[0]: str(folder / name) for name in files}
    return paths | {"log": paths["run"], "folder": str(folder / "a_folder")}
