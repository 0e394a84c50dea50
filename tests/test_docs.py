"""The docs name what exists: every file path and every module a page names is in the tree, so a
rename that forgets a page fails here rather than in a reader's hands."""

from __future__ import annotations

import importlib
import re

import pytest

from tests.helpers.paths import ROOT

PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
PACKAGES = ("ray_layout", "search", "launchers")
# `a/b.py` (or `a/b/`) in backticks, with an optional `:line` or `::test` tail.
TOP_FOLDERS = "ray_layout|search|launchers|tests|benchmarks|docs|configs|cluster_configs"
QUOTED_PATH = re.compile(rf"`((?:{TOP_FOLDERS})/[\w./-]*?)(?:[:`]|::)")
# ray_layout.model.layout, search.exact.exact_search: a dotted name under one of our packages.
DOTTED = re.compile(
    r"(?<![\w/.-])((?:ray_layout|search|launchers)(?:\.(?!md\b|py\b)[A-Za-z_]\w*)+)"
)
NOT_MODULES = {"ray_layout.costs"}  # the costs file's format tag, "ray_layout.costs/1"
EXAMPLES = {"configs/x.yaml"}  # a file named in a sample error message


def _quoted(pattern: re.Pattern[str]) -> list[tuple[str, str]]:
    return [
        (page.relative_to(ROOT).as_posix(), name)
        for page in PAGES
        for name in pattern.findall(page.read_text(encoding="utf-8"))
    ]


def _resolves(dotted: str) -> bool:
    """A module, or an attribute of the longest importable prefix."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            value = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attribute in parts[cut:]:
            if not hasattr(value, attribute):
                return False
            value = getattr(value, attribute)
        return True
    return False


@pytest.mark.parametrize(("page", "path"), _quoted(QUOTED_PATH))
def test_each_path_a_page_names_exists(page: str, path: str):
    if path in EXAMPLES:
        pytest.skip(f"{path} is an example in a sample message")
    assert (ROOT / path.rstrip("/")).exists(), f"{page} names {path}, which is not in the tree"


@pytest.mark.parametrize(("page", "name"), _quoted(DOTTED))
def test_each_module_a_page_names_imports(page: str, name: str):
    if name in NOT_MODULES:
        pytest.skip(f"{name} is a format tag, not a module")
    assert _resolves(name), f"{page} names {name}, which does not import"


def test_the_pages_name_files_at_all():
    """The patterns above find something, so the two checks cannot pass by matching nothing."""
    assert len(_quoted(QUOTED_PATH)) > 40
    assert len(_quoted(DOTTED)) > 10
