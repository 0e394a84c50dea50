"""A setting declared once: a dataclass field whose metadata is its flag, checked when the
dataclass is built, in any layer, with or without a command line."""

from __future__ import annotations

from dataclasses import dataclass, fields

import pytest

from ray_layout.errors import ConfigError
from ray_layout.options.checks import at_least, between, each
from ray_layout.options.flag_fields import (
    argument,
    check_options,
    flag_name,
    flag_spec,
    option,
    spellings,
)


@dataclass(frozen=True)
class Knobs:
    """Settings of a lower layer: a plain dataclass that checks itself as a command's would."""

    path: str = argument(help="where", default=".")
    warmup: int = option(3, names=["--knob-warmup"], help="dropped first", checks=[at_least(0)])
    depth: int | None = option(None, group="knobs", checks=[between(1, 8)])
    sizes: tuple[int, ...] = option((1,), checks=[each(at_least(1))])
    internal: float = 2.0  # no flag

    def __post_init__(self) -> None:
        check_options(self)


FIELDS = {item.name: item for item in fields(Knobs)}


def test_a_field_carries_its_flag_and_a_plain_field_none():
    spec = flag_spec(FIELDS["warmup"])
    assert (spec.help, spec.positional, spec.checks[0](-1)) == (
        "dropped first",
        False,
        "must be >= 0, got -1",
    )
    assert flag_spec(FIELDS["depth"]).group == "knobs"
    assert flag_spec(FIELDS["internal"]) is None
    assert Knobs() == Knobs(".", 3, None, (1,), 2.0)  # the defaults are the fields' own


def test_a_flag_is_spelled_from_its_field_unless_named():
    assert spellings(FIELDS["depth"]) == ("--depth",)
    assert spellings(FIELDS["warmup"]) == ("--knob-warmup",)
    assert spellings(FIELDS["path"]) == ("path",)  # a positional: its name
    assert flag_name(FIELDS["warmup"]) == "--knob-warmup"


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"warmup": -1}, "--knob-warmup must be >= 0, got -1"),
        ({"depth": 9}, "--depth must be <= 8, got 9"),
        ({"sizes": (2, 0)}, "--sizes must be >= 1, got 0"),
    ],
)
def test_a_bad_value_built_in_code_is_one_line_naming_the_flag(given, message):
    with pytest.raises(ConfigError) as refused:
        Knobs(**given)
    assert str(refused.value) == message


def test_an_unset_value_and_a_field_without_a_flag_are_not_checked():
    assert Knobs(depth=None, internal=-1.0).internal == -1.0
