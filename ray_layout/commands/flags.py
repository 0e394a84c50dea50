"""The command line built from settings dataclasses, and the base class of every command's.

A command's settings class lists its flags as fields (torchtitan's ``JobConfig`` is the model):
the field's type gives argparse's type (``bool``: a switch, ``Literal``: choices, ``tuple``: a
repeated flag), its default the flag's default, and its metadata
(:func:`ray_layout.options.flag_fields.option`) the help, the spelling and the checks the value
must pass. A field whose type is itself a dataclass adds that class's flags (the parallel sizes,
the A/B test's, the run policy's), wherever that class is defined; a field without the metadata
is no flag. :func:`add_flags` builds the
parser; :func:`from_args` builds the settings, and constructing settings checks every value, so
a command only ever sees settings that are valid.
"""

from __future__ import annotations

import argparse
import types
from dataclasses import MISSING, Field, dataclass, fields, is_dataclass
from typing import Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

from ray_layout.errors import ConfigError
from ray_layout.options.checks import flag_type
from ray_layout.options.flag_fields import check_options, flag_name, flag_spec, spellings

S = TypeVar("S")


@dataclass(frozen=True, kw_only=True)
class Settings:
    """Base of every command's settings: constructing one checks each field's value."""

    def __post_init__(self) -> None:
        check_options(self)


def _unwrapped(kind: Any) -> Any:
    """``int | None`` -> ``int``."""
    if get_origin(kind) in (Union, types.UnionType):
        return next(arg for arg in get_args(kind) if arg is not type(None))
    return kind


def _argparse_options(item: Field, kind: Any) -> dict[str, Any]:
    spec = flag_spec(item)
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
        options["type"] = flag_type(get_args(kind)[0])
    elif spec.parse is None and kind is not str:
        options["type"] = flag_type(kind)
    if spec.positional:
        if item.default is not MISSING:
            options |= {"nargs": "?", "default": item.default}
        return options
    if item.default is MISSING and item.default_factory is MISSING:
        options["required"] = True
    elif not (repeated or spec.parse):  # those keep None: from_args puts the field's default
        options["default"] = item.default
    return options


def _dest(item: Field) -> str:
    """Where argparse keeps a flag's value: the name argparse itself would pick (the first long
    spelling; a positional's name), so the help's metavar reads as the flag whatever the field is
    called."""
    spelled = next((name for name in spellings(item) if name.startswith("--")), flag_name(item))
    return spelled.lstrip("-").replace("-", "_")


def add_flags(parser: argparse.ArgumentParser, kind: type) -> None:
    """Add a flag (or positional) to ``parser`` for every flag field of the dataclass ``kind``,
    sections included."""
    groups: dict[str, Any] = {}  # title -> argparse's argument group

    def add(kind: type) -> None:
        hints = get_type_hints(kind)
        for item in fields(kind):
            field_type = _unwrapped(hints[item.name])
            if is_dataclass(field_type):
                add(field_type)
                continue
            spec = flag_spec(item)
            if spec is None:
                continue
            target: Any = parser
            if spec.group is not None:
                if spec.group not in groups:
                    groups[spec.group] = parser.add_argument_group(spec.group)
                target = groups[spec.group]
            options = _argparse_options(item, field_type)
            if not spec.positional:
                options["dest"] = _dest(item)
            target.add_argument(*spellings(item), **options)

    add(kind)


def from_args(kind: type[S], args: argparse.Namespace) -> S:
    """The settings ``args`` describe, every value checked (``ConfigError`` names the flag); a
    field that is no flag keeps its default."""
    hints = get_type_hints(kind)
    values: dict[str, Any] = {}
    for item in fields(kind):
        field_type = _unwrapped(hints[item.name])
        if is_dataclass(field_type):
            values[item.name] = from_args(field_type, args)
            continue
        spec = flag_spec(item)
        if spec is None:
            continue
        value = getattr(args, _dest(item))
        if value is None and item.default is not MISSING:
            value = item.default
        elif spec.parse is not None and isinstance(value, str):
            try:
                value = spec.parse(value)
            except ValueError as exc:
                raise ConfigError(f"{flag_name(item)} {exc}") from None
        elif isinstance(value, list):
            value = tuple(value)
        values[item.name] = value
    return kind(**values)
