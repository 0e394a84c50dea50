"""Megatron's ``--moe-layer-freq``: which decoder layers are MoE, from an int or a list given
as a Python expression, read over its syntax tree and never with eval."""

from __future__ import annotations

import ast

from ray_layout.errors import ConfigError, quoted


def parse_moe_layer_freq(
    value: int | str | list[int], num_layers: int, *, source: str
) -> tuple[bool, ...]:
    """Megatron's ``--moe-layer-freq``: an int N (every N-th layer is MoE, starting at layer 0)
    or a list, given directly or as a Python expression such as ``([0]*3+[1]*58)``.

    The expression is evaluated over its syntax tree (lists of 0/1, ``+`` and ``*``), never eval.
    """
    where = f"{source}: moe_layer_freq"
    if isinstance(value, bool) or not isinstance(value, int | str | list | tuple):
        raise ConfigError(f"{where} must be an int or a list, got {quoted(value)}")
    if isinstance(value, int):
        if value < 1:
            raise ConfigError(f"{where} must be >= 1, got {quoted(value)}")
        return tuple(i % value == 0 for i in range(num_layers))
    pattern = _list_expression(value, where) if isinstance(value, str) else list(value)
    if isinstance(pattern, int):
        return parse_moe_layer_freq(pattern, num_layers, source=source)
    if len(pattern) != num_layers:
        raise ConfigError(f"{where} has {len(pattern)} entries but num_layers is {num_layers}")
    if any(x not in (0, 1) or isinstance(x, float) for x in pattern):
        raise ConfigError(f"{where} entries must be 0 or 1, got {quoted(pattern)}")
    return tuple(bool(x) for x in pattern)


_MAX_PATTERN_LENGTH = 100_000


def _list_expression(text: str, where: str) -> list[int] | int:
    shown = quoted(text)

    def value(node: ast.AST) -> list[int] | int:
        result = operation(node)
        # Bounding every intermediate keeps hostile input from allocating (or printing) huge values.
        if (len(result) if isinstance(result, list) else result) > _MAX_PATTERN_LENGTH:
            raise ConfigError(f"{where} {shown} is too large")
        return result

    def operation(node: ast.AST) -> list[int] | int:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.List):
            items = [value(x) for x in node.elts]
            if not all(isinstance(x, int) for x in items):
                raise ConfigError(f"{where} {shown}: nested lists are not allowed")
            return items
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Mult):
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, ast.Add) and type(left) is type(right):
                return left + right
            if isinstance(node.op, ast.Mult):
                times, items = (right, left) if isinstance(left, list) else (left, right)
                if isinstance(items, list) and isinstance(times, int):
                    if len(items) * max(times, 0) > _MAX_PATTERN_LENGTH:
                        raise ConfigError(f"{where} {shown} is too long")
                    return items * times
                if isinstance(items, int) and isinstance(times, int):
                    return items * times
        raise ConfigError(f"{where} {shown}: only integers, lists, '+' and '*' are allowed")

    try:
        return value(ast.parse(text.strip(), mode="eval").body)
    except SyntaxError:
        raise ConfigError(f"{where} {shown} is not an int or a list expression") from None
    except RecursionError:
        raise ConfigError(f"{where} {shown} is nested too deeply") from None
