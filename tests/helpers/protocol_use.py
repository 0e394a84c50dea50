"""What a module uses of a Protocol it is typed against, read from its source: the test that
keeps a Protocol exactly as wide as its users need (tests/shell/test_runner.py, test_scanner.py)."""

from __future__ import annotations

import ast
import inspect
from types import ModuleType


def attributes_used(module: ModuleType, protocol: str) -> set[str]:
    """The attributes ``module`` reads or sets of each parameter annotated ``protocol``."""
    tree = ast.parse(inspect.getsource(module))
    names = {
        arg.arg
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef)
        for arg in node.args.args
        if isinstance(arg.annotation, ast.Name) and arg.annotation.id == protocol
    }
    return {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id in names
    }
