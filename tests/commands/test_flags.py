"""Settings as frozen dataclasses: the field's type, default and checks make its flag, and
constructing settings checks every value, however they were built."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ray_layout.commands.common import OneLineErrorParser
from ray_layout.commands.flags import Settings, add_flags, from_args
from ray_layout.errors import ConfigError
from ray_layout.options.checks import at_least, comma_integers, each
from ray_layout.options.flag_fields import argument, option


@dataclass(frozen=True, kw_only=True)
class Example(Settings):
    name: str = argument(help="a name")
    count: int = option(help="how many", checks=[at_least(1)])
    kind: Literal["a", "b"] = option("a")
    loud: bool = option(False)
    tags: tuple[str, ...] = option((), names=["--tag"])


def test_settings_classes_build_the_parser_and_check_their_values():
    parser = OneLineErrorParser(prog="example")
    add_flags(parser, Example)
    settings = from_args(
        Example, parser.parse_args(["x", "--count", "2", "--tag", "p", "--tag", "q", "--loud"])
    )
    assert settings == Example(name="x", count=2, kind="a", loud=True, tags=("p", "q"))
    assert "how many" in parser.format_help() and "{a,b}" in parser.format_help()
    with pytest.raises(ConfigError, match="--count must be >= 1, got 0"):
        from_args(Example, parser.parse_args(["x", "--count", "0"]))
    with pytest.raises(ConfigError, match="--count must be >= 1"):
        Example(name="x", count=-3)  # constructed in code, checked the same way
    with pytest.raises(SystemExit):
        parser.parse_args(["x"])  # --count has no default: required


@dataclass(frozen=True, kw_only=True)
class Inner(Settings):
    """A section: its flags join the parser of whatever holds it."""

    depth: int | None = option(None, group="inner section", checks=[at_least(2)])
    sizes: tuple[int, ...] = option((1,), parse=comma_integers("1,2"), checks=[each(at_least(1))])


@dataclass(frozen=True, kw_only=True)
class Outer(Settings):
    path: str = argument(help="optional", default="here")
    inner: Inner = field(default_factory=Inner)
    counts: tuple[int, ...] = option((), names=["--count"])


def parsed(*argv: str) -> Outer:
    parser = OneLineErrorParser(prog="outer")
    add_flags(parser, Outer)
    return from_args(Outer, parser.parse_args(list(argv)))


def test_unset_flags_take_the_fields_defaults_sections_included():
    assert parsed() == Outer(path="here", inner=Inner(depth=None, sizes=(1,)), counts=())


def test_a_sections_flags_fill_that_section_and_keep_their_help_group():
    settings = parsed("there", "--depth", "3", "--sizes", "4,5", "--count", "7", "--count", "8")
    assert settings == Outer(path="there", inner=Inner(depth=3, sizes=(4, 5)), counts=(7, 8))
    parser = OneLineErrorParser(prog="outer")
    add_flags(parser, Outer)
    assert "inner section:\n  --depth DEPTH" in parser.format_help()


def test_a_value_that_fails_a_check_or_a_parse_names_the_flag():
    with pytest.raises(ConfigError, match=r"^--depth must be >= 2, got 1$"):
        parsed("--depth", "1")
    with pytest.raises(ConfigError, match=r"^--sizes must be >= 1, got 0$"):
        parsed("--sizes", "3,0")
    with pytest.raises(ConfigError, match=r"^--sizes must be integers such as 1,2, got '3,x'$"):
        parsed("--sizes", "3,x")


def test_an_unset_optional_value_is_not_checked():
    """``None`` means "the config's": no check applies to what was not given."""
    assert Inner(depth=None).depth is None


def test_a_usage_mistake_is_one_line_with_exit_2(capsys):
    with pytest.raises(SystemExit) as exited:
        parsed("--count", "seven")
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err == (
        "error: outer: argument --count: must be an integer in digits (0-9), got 'seven' "
        "(see --help)\n"
    )


@given(st.lists(st.integers(-(10**6), 10**6), min_size=1, max_size=8))
def test_a_comma_list_reads_back_the_integers_it_was_written_from(numbers):
    flag = "--sizes=" + ",".join(map(str, numbers))  # "=": a leading "-1" is no option
    if all(n >= 1 for n in numbers):
        assert parsed(flag).inner.sizes == tuple(numbers)
    else:
        with pytest.raises(ConfigError, match=r"^--sizes must be >= 1, got "):
            parsed(flag)


@dataclass(frozen=True)
class Policy:
    """A section declared in a lower layer: a plain dataclass, one field of it no flag."""

    wait_s: float = option(5.0, names=["--policy-wait"], group="policy")
    grace_s: float = 1.0


@dataclass(frozen=True, kw_only=True)
class Holder(Settings):
    policy: Policy = field(default_factory=Policy)


def test_a_plain_dataclass_section_adds_its_flags_and_keeps_its_other_fields():
    parser = OneLineErrorParser(prog="holder")
    add_flags(parser, Holder)
    assert "policy:\n  --policy-wait POLICY_WAIT" in parser.format_help()  # as the flag reads
    assert "grace" not in parser.format_help()
    assert from_args(Holder, parser.parse_args([])) == Holder()
    assert from_args(Holder, parser.parse_args(["--policy-wait", "9"])).policy == Policy(9.0, 1.0)
