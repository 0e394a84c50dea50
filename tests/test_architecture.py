"""The import contract: the packages are layers in the order data flows, and a layer imports only
the layers below it (or itself). Read from the source with ``ast``, so an import inside a
function counts as much as one at the top of a module.

    ray_layout.errors      the exception hierarchy every layer raises
    ray_layout.options     settings fields that carry their flag, and the checks of their values
    ray_layout.shell       a bash launch script read as bash would run it
    ray_layout.model       model spec, loaders, sizing, the layout language, baselines, unit costs
    search                 the layout space, the schedule simulator, memory, the planner
    ray_layout.measure     Megatron's logs, the cost store, ingest, the fit, the profile design
    launchers              what runs on one rank: Megatron's command line, the emulated Megatron
    ray_layout.runtime     Ray placement, rank actors, runs on the cluster
    ray_layout.ab          A/B statistics and the live A/B
    ray_layout.report      the tune's report
    ray_layout.tuning      the tune loop
    ray_layout.commands    the command line (and the entry modules above it)
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.helpers.paths import ROOT

PACKAGES = ("ray_layout", "search", "launchers")

LAYERS = (
    "ray_layout.errors",
    "ray_layout.options",
    "ray_layout.shell",
    "ray_layout.model",
    "search",
    "ray_layout.measure",
    "launchers",
    "ray_layout.runtime",
    "ray_layout.ab",
    "ray_layout.report",
    "ray_layout.tuning",
    "ray_layout.commands",
    "ray_layout.tune",
    "ray_layout.__main__",
)
# Ray is the imperative shell: the pure core (sizing, layouts, fitting, simulation, statistics)
# must run and be tested without it.
RAY_FREE = (
    "ray_layout.errors",
    "ray_layout.options",
    "ray_layout.shell",
    "ray_layout.model",
    "search",
    "ray_layout.measure",
    "launchers",
)
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
    bad.write_text("def f():\n    from ray_layout.tuning.loop import main\n")
    names = _imports(bad, "ray_layout.model.bad")
    assert _layer("ray_layout.tuning.loop") > _layer("ray_layout.model.bad")
    assert "ray_layout.tuning.loop" in names


# Modules without a test file of their own, each with the test that covers it instead.
UNTESTED_ALONE: dict[str, str] = {
    "ray_layout.__main__": "the two-line `python -m ray_layout` entry; tests/commands/test_main.py",
}
# Two entry points keep their names: `python -m ray_layout.tune` is the documented tune command.
SHARED_BASENAMES = {"tune.py": {"ray_layout/tune.py", "ray_layout/commands/tune.py"}}


def _test_file(module: str) -> Path:
    """ray_layout.model.layout -> tests/model/test_layout.py; search.exact ->
    tests/search/test_exact.py: the test tree mirrors the package tree."""
    parts = module.split(".")
    if parts[0] == "ray_layout":
        parts = parts[1:]
    return ROOT / "tests" / Path(*parts[:-1]) / f"test_{parts[-1]}.py"


@pytest.mark.parametrize(
    "module", sorted(m for m, path in _modules().items() if path.name != "__init__.py")
)
def test_each_module_has_its_test_file(module):
    if module in UNTESTED_ALONE:
        assert not _test_file(module).exists(), f"{module} has a test file: drop its exemption"
        return
    expected = _test_file(module).relative_to(ROOT)
    assert (ROOT / expected).exists(), f"{module} has no {expected} (or an UNTESTED_ALONE reason)"


def test_each_test_file_mirrors_a_module_or_says_what_it_covers():
    """A test file in a package folder is named after a module of it, or opens with a docstring
    naming what it checks across modules (real logs, the fuzz harness, megatron-core)."""
    strays = []
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        module = ast.parse(path.read_text(encoding="utf-8"))
        if not ast.get_docstring(module):
            strays.append(str(path.relative_to(ROOT)))
    assert strays == []


def test_no_two_modules_share_a_name():
    """One name, one meaning: a module's file name is unique across the product."""
    seen: dict[str, list[str]] = {}
    for path in _modules().values():
        if path.name != "__init__.py":
            seen.setdefault(path.name, []).append(path.relative_to(ROOT).as_posix())
    shared = {name: set(paths) for name, paths in seen.items() if len(paths) > 1}
    assert shared == SHARED_BASENAMES


# The megatron-core backend patches megatron-core's CUDA-only calls for the CPU: only its own
# rank program may apply that, never a module of the tuner's process.
CPU_ADAPTATIONS = "launchers.megatron_core.cpu_adaptations"
CORE_RANK = ("launchers.megatron_core", "launchers.megatron_core_rank")


def test_no_product_module_imports_the_cpu_adaptations():
    importers = sorted(
        name
        for name, path in MODULES.items()
        if not any(name == own or name.startswith(own + ".") for own in CORE_RANK)
        and any(
            found == CPU_ADAPTATIONS or found.startswith(CPU_ADAPTATIONS + ".")
            for found in _imports(path, name)
        )
    )
    assert importers == []


def test_the_backend_imports_its_adaptations_only_inside_the_rank_program():
    """Not at module level anywhere: importing the rank's modules (as tests do) patches nothing."""
    for name, path in MODULES.items():
        if not name.startswith("launchers.megatron_core"):
            continue
        tree = ast.parse(path.read_text(), str(path))
        top = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
        names = {getattr(node, "module", None) for node in top}
        names |= {alias.name for node in top for alias in node.names}
        assert CPU_ADAPTATIONS not in names, f"{name} imports the adaptations at module level"


def _circles() -> list[list[str]]:
    """The product's import circles (strongly connected groups of modules, any import counted:
    inside functions and under ``TYPE_CHECKING`` too), each sorted."""
    graph = {m: {n for n in _imports(p, m) if n in MODULES and n != m} for m, p in MODULES.items()}
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(module: str) -> None:  # Tarjan's algorithm
        order[module] = low[module] = len(order)
        stack.append(module)
        for imported in sorted(graph[module]):
            if imported not in order:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in stack:
                low[module] = min(low[module], order[imported])
        if low[module] == order[module]:
            group = []
            while (member := stack.pop()) != module:
                group.append(member)
            if group:
                circles.append(sorted([module, *group]))

    for module in sorted(graph):
        if module not in order:
            visit(module)
    return circles


def test_no_import_circle_anywhere():
    assert _circles() == []


# The job's Megatron flags are parsed once, into Recipe.flags (docs/design.md): above the
# loaders nothing reads them as words again.
FLAG_READERS = {
    f"ray_layout.model.megatron_args.{name}"
    for name in (
        "parse_flags",
        "walk_flags",
        "check_arguments",
        "typed_value",
        "megatron_flag_table",
    )
} | {"ray_layout.model.job_flags.job_flags", "ray_layout.model.memory_settings.memory_settings"}
NO_RAW_FLAGS = ("search", "ray_layout.tuning", "ray_layout.commands")


@pytest.mark.parametrize(
    "module", sorted(m for m in MODULES if any(m.startswith(p + ".") for p in NO_RAW_FLAGS))
)
def test_no_module_above_the_loaders_reads_megatron_flags_as_words(module):
    readers = sorted(_imports(MODULES[module], module) & FLAG_READERS)
    assert not readers, f"{module} parses Megatron flags itself: {readers}; use Recipe.flags"
