"""Settings as typed frozen dataclasses, and the command line built from them.

A command's settings class lists its flags as fields (torchtitan's ``JobConfig`` is the model):
the field's type gives argparse's type (``bool``: a switch, ``Literal``: choices, ``tuple``: a
repeated flag), its default the flag's default, and :func:`option`/:func:`argument` the help,
the spelling and the checks the value must pass. A field whose type is itself a settings class
adds that class's flags (the parallel sizes, the search). :func:`add_flags` builds the parser;
:func:`from_args` builds the settings, and constructing settings checks every value, so a
command only ever sees settings that are valid.
"""

from __future__ import annotations

import argparse
import types
from collections.abc import Callable, Sequence
from dataclasses import MISSING, Field, dataclass, field, fields, is_dataclass
from typing import Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

from ray_layout.commands.checks import Check
from ray_layout.errors import ConfigError

_FLAG = "flag"
S = TypeVar("S", bound="Settings")


@dataclass(frozen=True)
class FlagSpec:
    """How one settings field appears on the command line."""

    help: str | None = None
    names: tuple[str, ...] = ()  # default: --field-name
    positional: bool = False
    metavar: str | None = None
    group: str | None = None  # an argparse argument group's title
    checks: tuple[Check, ...] = ()
    parse: Callable[[str], Any] | None = None  # text -> value; a ValueError names the problem


def option(
    default: Any = MISSING,
    *,
    help: str | None = None,
    names: Sequence[str] = (),
    metavar: str | None = None,
    group: str | None = None,
    checks: Sequence[Check] = (),
    parse: Callable[[str], Any] | None = None,
) -> Any:
    """A ``--flag`` field; without a default the flag is required."""
    spec = FlagSpec(help, tuple(names), False, metavar, group, tuple(checks), parse)
    return field(default=default, metadata={_FLAG: spec})


def argument(*, help: str, checks: Sequence[Check] = (), default: Any = MISSING) -> Any:
    """A positional field; with a default it may be left out."""
    spec = FlagSpec(help, positional=True, checks=tuple(checks))
    return field(default=default, metadata={_FLAG: spec})


def _spellings(item: Field) -> tuple[str, ...]:
    spec: FlagSpec = item.metadata[_FLAG]
    if spec.positional:
        return (item.name,)
    return spec.names or ("--" + item.name.replace("_", "-"),)


def _flag_name(item: Field) -> str:
    """How messages name a field: its first spelling on the command line."""
    return _spellings(item)[0]


@dataclass(frozen=True, kw_only=True)
class Settings:
    """Base of every command's settings: constructing one checks each field's value."""

    def __post_init__(self) -> None:
        for item in fields(self):
            value = getattr(self, item.name)
            spec = item.metadata.get(_FLAG)
            if spec is None or value is None:
                continue
            for check in spec.checks:
                if (problem := check(value)) is not None:
                    raise ConfigError(f"{_flag_name(item)} {problem}")


def _unwrapped(kind: Any) -> Any:
    """``int | None`` -> ``int``."""
    if get_origin(kind) in (Union, types.UnionType):
        return next(arg for arg in get_args(kind) if arg is not type(None))
    return kind


def _argparse_options(item: Field, kind: Any) -> dict[str, Any]:
    spec: FlagSpec = item.metadata[_FLAG]
    options: dict[str, Any] = {"help": spec.help}
    if spec.metavar:
        options["metavar"] = spec.metavar
    repeated = get_origin(kind) is tuple and spec.parse is None
    if kind is bool:
        options["action"] = "store_true"
    elif get_origin(kind) is Literal:
        options["choices"] = get_args(kind)
    elif repeated:
        options["action"] = "append"
        options["type"] = get_args(kind)[0]
    elif spec.parse is None and kind is not str:
        options["type"] = kind
    if spec.positional:
        if item.default is not MISSING:
            options |= {"nargs": "?", "default": item.default}
        return options
    if item.default is MISSING and item.default_factory is MISSING:
        options["required"] = True
    elif not (repeated or spec.parse):  # those keep None: from_args puts the field's default
        options["default"] = item.default
    return options


def add_flags(parser: argparse.ArgumentParser, kind: type[Settings]) -> None:
    """Add a flag (or positional) to ``parser`` for every field of ``kind``, sections included."""
    groups: dict[str, Any] = {}  # title -> argparse's argument group

    def add(kind: type[Settings]) -> None:
        hints = get_type_hints(kind)
        for item in fields(kind):
            field_type = _unwrapped(hints[item.name])
            if is_dataclass(field_type):
                add(field_type)
                continue
            spec: FlagSpec = item.metadata[_FLAG]
            target: Any = parser
            if spec.group is not None:
                if spec.group not in groups:
                    groups[spec.group] = parser.add_argument_group(spec.group)
                target = groups[spec.group]
            options = _argparse_options(item, field_type)
            if not spec.positional:
                options["dest"] = item.name
            target.add_argument(*_spellings(item), **options)

    add(kind)


def from_args(kind: type[S], args: argparse.Namespace) -> S:
    """The settings ``args`` describe, every value checked (``ConfigError`` names the flag)."""
    hints = get_type_hints(kind)
    values: dict[str, Any] = {}
    for item in fields(kind):
        field_type = _unwrapped(hints[item.name])
        if is_dataclass(field_type):
            values[item.name] = from_args(field_type, args)
            continue
        value = getattr(args, item.name)
        spec: FlagSpec = item.metadata[_FLAG]
        if value is None and item.default is not MISSING:
            value = item.default
        elif spec.parse is not None and isinstance(value, str):
            try:
                value = spec.parse(value)
            except ValueError as exc:
                raise ConfigError(f"{_flag_name(item)} {exc}") from None
        elif isinstance(value, list):
            value = tuple(value)
        values[item.name] = value
    return kind(**values)
