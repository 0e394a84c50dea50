"""The import contract: the packages are layers in the order data flows, and a layer imports only
the layers below it (or itself). Read from the source with ``ast``, so an import inside a
function counts as much as one at the top of a module.

    ray_layout.errors      the exception hierarchy every layer raises
    ray_layout.model       model spec, loaders, sizing, the layout language, baselines, unit costs
    search                 the layout space, the schedule simulator, memory, the planner
    ray_layout.measure     Megatron's logs, the cost store, ingest, the fit, the profile design
    launchers              what runs on one rank: Megatron's command line, the emulated Megatron
    ray_layout.runtime     Ray placement, rank actors, runs on the cluster
    ray_layout.ab          A/B statistics and the live A/B
    ray_layout.report      the tune's report
    ray_layout.driver      the tune loop
    ray_layout.commands    the command line (and the entry modules above it)
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("ray_layout", "search", "launchers")

LAYERS = (
    "ray_layout.errors",
    "ray_layout.model",
    "search",
    "ray_layout.measure",
    "launchers",
    "ray_layout.runtime",
    "ray_layout.ab",
    "ray_layout.report",
    "ray_layout.driver",
    "ray_layout.commands",
    "ray_layout.tune",
    "ray_layout.__main__",
)
# Ray is the imperative shell: the pure core (sizing, layouts, fitting, simulation, statistics)
# must run and be tested without it.
RAY_FREE = ("ray_layout.errors", "ray_layout.model", "search", "ray_layout.measure", "launchers")
MAX_LINES = 450


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {
        _module_name(path): path
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
    }


def _imports(path: Path, module: str) -> set[str]:
    """Every absolute module name ``path`` imports, relative imports resolved."""
    found: set[str] = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def _layer(name: str) -> int | None:
    for index, prefix in enumerate(LAYERS):
        if name == prefix or name.startswith(prefix + "."):
            return index
    return None


MODULES = _modules()


def test_every_module_belongs_to_a_layer():
    orphans = [name for name in MODULES if name not in PACKAGES and _layer(name) is None]
    assert not orphans, f"modules outside every layer: {orphans}"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_imports_a_higher_layer(module):
    own = _layer(module)
    if own is None:  # a package's own __init__ (ray_layout, search, launchers)
        own = len(LAYERS)
    upward = sorted(
        name
        for name in _imports(MODULES[module], module)
        if (layer := _layer(name)) is not None and layer > own
    )
    assert not upward, f"{module} (layer {LAYERS[own]}) imports higher layers: {upward}"


@pytest.mark.parametrize("module", sorted(m for m in MODULES if _layer(m) is not None))
def test_the_pure_core_never_imports_ray(module):
    if not any(module == p or module.startswith(p + ".") for p in RAY_FREE):
        pytest.skip("shell layer: may use Ray")
    ray = sorted(n for n in _imports(MODULES[module], module) if n.split(".")[0] == "ray")
    assert not ray, f"{module} is in the Ray-free core but imports {ray}"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_over_the_line_limit(module):
    lines = len(MODULES[module].read_text().splitlines())
    assert lines <= MAX_LINES, f"{module} has {lines} lines (limit {MAX_LINES})"


def test_the_contract_catches_an_upward_import(tmp_path):
    """The checker itself can fail: a model module importing the driver is found."""
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from ray_layout.driver.tune import main\n")
    names = _imports(bad, "ray_layout.model.bad")
    assert _layer("ray_layout.driver.tune") > _layer("ray_layout.model.bad")
    assert "ray_layout.driver.tune" in names
