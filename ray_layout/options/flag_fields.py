"""A setting declared once: a dataclass field that carries its own command-line flag.

torchtitan builds its command line from its job config's dataclasses; so do we. Any frozen
dataclass, in any layer, makes a field a flag with :func:`option` (or :func:`argument`): the
field's default, plus the flag's help, spelling, help group and checks in the field's metadata.
``ray_layout.commands.flags`` builds argparse from that metadata, and :func:`check_options`, run
when the dataclass is built, refuses a bad value in one ``ConfigError`` naming the flag, whether
the command line or code built it. A field without the metadata is no flag: it keeps its default.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import MISSING, Field, dataclass, field, fields
from typing import Any

from ray_layout.errors import ConfigError
from ray_layout.options.checks import Check

_FLAG = "flag"


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


def flag_spec(item: Field) -> FlagSpec | None:
    """The field's flag; ``None`` for a field that is no flag."""
    return item.metadata.get(_FLAG)


def spellings(item: Field) -> tuple[str, ...]:
    """The flag's spellings on the command line (a positional's: its name)."""
    spec: FlagSpec = item.metadata[_FLAG]
    if spec.positional:
        return (item.name,)
    return spec.names or ("--" + item.name.replace("_", "-"),)


def flag_name(item: Field) -> str:
    """How messages name a field: its first spelling on the command line."""
    return spellings(item)[0]


def check_options(settings: Any) -> None:
    """Run the checks of every flag field of the dataclass ``settings`` on its value: a problem
    is a ``ConfigError`` naming the flag. ``None`` (a flag left unset) is not checked."""
    for item in fields(settings):
        spec = flag_spec(item)
        value = getattr(settings, item.name)
        if spec is None or value is None:
            continue
        for check in spec.checks:
            if (problem := check(value)) is not None:
                raise ConfigError(f"{flag_name(item)} {problem}")
