"""``$((...))`` and ``printf`` without a shell: bash's own answers where the reader gives one, a
one-line ValueError where it does not, and bounded sizes whatever the script says."""

from __future__ import annotations

import re

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from ray_layout.shell.arithmetic import MAX_PRINTF_CHARS, evaluate_arithmetic, printf
from tests.helpers.shell_bash import bash_arithmetic, bash_printf, needs_bash

# A is plain, B negative, C an expression (bash evaluates a name's text as arithmetic), D unset.
VARIABLES = {"A": "5", "B": "-3", "C": "A*2+1"}


def lookup(name: str) -> str | None:
    return VARIABLES.get(name)


def nothing(_: str) -> None:
    return None


def test_truncated_division_reused_format_and_bounds():
    assert evaluate_arithmetic("-7 / 2", nothing) == -3  # truncated, as bash
    assert evaluate_arithmetic("-7 % 2", nothing) == -1
    assert printf("%s-", ["a", "b"]) == "a-b-"  # the format is reused
    with pytest.raises(ValueError, match="divides by zero"):
        evaluate_arithmetic("1/0", nothing)
    with pytest.raises(ValueError, match="exponent"):
        evaluate_arithmetic("2**-1", nothing)


# Expressions over bash's whole operator table (all but assignments), its integer constants
# (decimal, hex, octal, BASE#, some it refuses) and names, spaced or not: bash is the judge, 64-bit
# wraparound included.
_CONSTANTS = st.one_of(
    st.integers(0, 2**64).map(str),
    st.integers(0, 999).map(str),
    st.integers(0, 2**40).map(hex),
    st.integers(0, 4095).map(lambda n: f"0{n:o}"),
    st.tuples(st.integers(2, 64), st.integers(1, 99)).map(lambda p: f"{p[0]}#{p[1] % p[0]}"),
    st.sampled_from(["0", "0x", "08", "1a", "2#2", "1#1", "64#@_", "36#Zz"]),
)
_ATOMS = st.one_of(_CONSTANTS, st.sampled_from(["A", "B", "C", "D", "$A", "${B}"]))
_SPACE = st.sampled_from(["", " "])
_BINARY = st.sampled_from(
    [
        *("+", "-", "*", "/", "%", "**", "<<", ">>", "<", "<=", ">", ">=", "==", "!="),
        *("&", "^", "|", "&&", "||", ","),
    ]
)


def _combine(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.one_of(
        st.tuples(inner, _SPACE, _BINARY, _SPACE, inner).map("".join),
        st.tuples(st.sampled_from(["-", "+", "!", "~"]), _SPACE, inner).map("".join),
        st.tuples(inner, inner, inner).map(lambda t: f"{t[0]} ? {t[1]} : {t[2]}"),
        inner.map(lambda text: f"({text})"),
    )


expressions = st.recursive(_ATOMS, _combine, max_leaves=8)
_INCREMENT = re.compile(r"(\+\+|--)\s*[A-Za-z_]|[A-Za-z_]\w*\s*(\+\+|--)")


@needs_bash
@settings(max_examples=300, deadline=None)
@given(expressions)
def test_arithmetic_is_what_bash_computes(expression):
    assume(not _INCREMENT.search(expression))  # ++/-- next to a name: an assignment, refused
    expected = bash_arithmetic(expression, VARIABLES)
    # $A and ${B} are the expansion's job (bash_expand): their text, before any evaluation
    plain = expression.replace("${B}", VARIABLES["B"]).replace("$A", VARIABLES["A"])
    if expected is None:
        with pytest.raises(ValueError):
            evaluate_arithmetic(plain, lookup)
    else:
        assert evaluate_arithmetic(plain, lookup) == expected


@pytest.mark.parametrize(
    ("expression", "expected"),  # each bash's own answer
    [
        ("!0", 1),
        ("(!1 + 1)", 1),  # ! binds tighter than +
        ("-2**2", 4),  # unary minus binds tighter than **
        ("2 ** 3 ** 2", 512),  # ** is right-associative
        ("1 < 2 < 3", 1),  # (1 < 2) < 3, not Python's chain
        ("--1", 1),  # two signs, not a decrement, before a number
        ("0 && 1 / 0", 0),  # the skipped side is never computed
        ("1 ? 2 : 1 / 0", 2),
        ("0 ? 1 : 2, 7", 7),
        ("1 << 2 | 8", 12),
        ("010 + 0x1f + 2#101 + 64#@", 8 + 31 + 5 + 62),
        ("2**63", -(2**63)),  # 64 bits, wrapping around as bash's do
        ("3000000000 * 3000000000 * 3", 8553255926290448384),
        ("9223372036854775807 + 1", -(2**63)),
        ("-9223372036854775808 / -1", -(2**63)),
        ("2**99", 0),
        ("3 ** 40", -6289078614652622815),
        ("1 << 70", 64),  # the count modulo 64
        ("1+" * 3000 + "1", 3001),  # a long chain is a loop, not a recursion
    ],
)
def test_bashs_precedence_constants_and_64_bit_integers(expression, expected):
    assert evaluate_arithmetic(expression, nothing) == expected


def test_a_name_holding_an_expression_is_evaluated_and_a_loop_is_refused():
    assert evaluate_arithmetic("C - 1", lookup) == 10
    assert evaluate_arithmetic("D + 1", lookup) == 1  # unset: 0, as in bash
    assert evaluate_arithmetic("0 && D", lambda _: "x y") == 0  # a skipped name is not read
    loop = {"X": "Y", "Y": "X"}
    with pytest.raises(ValueError, match=r"^variables refer to each other too deeply$"):
        evaluate_arithmetic("X", loop.get)


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("2 ** -1", "exponent out of range"),
        ("x = 3", "assigns x, which only a running shell does here"),  # no assign given
        ("A += 1", "assigns A"),
        ("A++", "'A++' assigns A"),
        ("--A", "assigns A"),
        ("A[1]", "is not arithmetic this reader evaluates"),
        ("1.5 + 1", "is not arithmetic this reader evaluates"),
        ("1 +", "is not arithmetic this reader evaluates"),
        ("(1", "is not arithmetic this reader evaluates"),
        ("1 ? 2", "is not arithmetic this reader evaluates"),
        ("__import__('os')", "is not arithmetic this reader evaluates"),
        ("08", "'08': '08' is not a number bash reads"),
        ("1#1", "is not a number bash reads"),
        ("- " * 500 + "1", "nested too deeply"),
        ("(" * 3000 + "1" + ")" * 3000, "nested too deeply"),
        ("1 ? " * 3000 + "1" + " : 1" * 3000, "nested too deeply"),
    ],
)
def test_what_is_not_plain_arithmetic_is_a_one_line_value_error(expression, message):
    with pytest.raises(ValueError, match=re.escape(message)) as info:
        evaluate_arithmetic(expression, nothing)
    assert "\n" not in str(info.value)


def test_an_empty_expression_is_zero_as_in_bash():
    assert evaluate_arithmetic("  ", nothing) == 0


# printf: templates of the conversions the reader knows, with C's flags, widths and precisions,
# literal text, %% and escapes; arguments in bash's notations, some it refuses.
_PIECES = st.one_of(
    st.text(st.sampled_from("ab-=[]:, "), min_size=1, max_size=4),
    st.sampled_from(["%%", "\\t", "\\n", "\\\\", "\\x41", "\\101", "\\q"]),
    st.tuples(
        st.text(st.sampled_from("-+ 0"), max_size=2),
        st.sampled_from(["", "3", "5"]),
        st.sampled_from(["", ".", ".0", ".2"]),
        st.sampled_from("sdiuxX"),
    ).map(lambda p: "%" + "".join(p)),
)
templates = st.lists(_PIECES, min_size=1, max_size=5).map("".join)
arguments = st.lists(
    st.one_of(
        st.integers(-999, 999).map(str),
        st.integers(-(2**65), 2**65).map(str),
        st.sampled_from(["", "x", "a b", "0x1f", "010", "08", "'A", " 12", "12 ", "+5", "1_000"]),
    ),
    max_size=6,
)


@needs_bash
@settings(max_examples=300, deadline=None)
@given(templates, arguments)
def test_printf_is_what_bash_prints(template, values):
    expected = bash_printf(template, values)
    if expected is None:  # a word given to %d: bash reports it, the reader refuses
        with pytest.raises(ValueError, match="not an integer"):
            printf(template, values)
    else:
        assert printf(template, values) == expected


@pytest.mark.parametrize(
    ("template", "values", "expected"),  # each bash's own answer
    [
        ("100%%", [], "100%"),
        ("%%x", [], "%x"),
        ("%05d", ["42"], "00042"),
        ("%-05d|", ["5"], "5    |"),
        ("%05.3d", ["5"], "  005"),  # the 0 flag yields to a precision
        ("%.0d|", ["0"], "|"),
        ("%u", ["-1"], "18446744073709551615"),
        ("%x", ["255"], "ff"),
        ("%d %d %d", ["0x1f", "010", "'A"], "31 8 65"),
        ("%s", [r"a\tb"], r"a\tb"),  # an argument's backslashes are its own
        ("a\\tb\\x41\\101", [], "a\tbAA"),
    ],
)
def test_printf_prints_as_bash(template, values, expected):
    assert printf(template, values) == expected


@pytest.mark.parametrize(
    ("template", "values", "message"),
    [
        ("%o", ["1"], "printf format '%o' uses a specifier this reader does not know"),
        ("%d", ["1.5"], "printf %d got '1.5', not an integer"),
        ("%d", ["1_000"], "printf %d got '1_000', not an integer"),
        ("%d", ["08"], "printf %d got '08', not an integer"),
        ("%i", ["\u0661"], "not an integer"),  # an Arabic-Indic digit is no digit to bash
        ("%d", [str(2**63)], "not an integer of 64 bits"),
        ("%999999s", ["a"], "printf width is too large"),
        ("%s%s", ["a" * 60_000] * 2, "printf output is too long"),
    ],
)
def test_printf_refuses_in_one_line(template, values, message):
    with pytest.raises(ValueError, match=message) as info:
        printf(template, values)
    assert "\n" not in str(info.value)


def test_printf_output_stays_bounded_while_it_reuses_the_format():
    assert len(printf("%s", ["x"] * 1000)) == 1000
    with pytest.raises(ValueError, match="too long"):
        printf("%s", ["y" * 1000] * (MAX_PRINTF_CHARS // 1000 + 1))


def test_printf_without_specifiers_prints_once_and_missing_arguments_are_empty():
    assert printf("abc", ["x", "y"]) == "abc"
    assert printf("<%s|%d>", []) == "<|0>"
    assert printf(r"a\tb\n", []) == "a\tb\n"


@needs_bash
@pytest.mark.parametrize(
    "expression",
    [
        "A += 8",
        "A++ + A",
        "++A * 2",
        "A--, A",
        "B = A = 3",
        "A <<= 2",
        "A ^= 5, A |= 8",
        "C = A ? 1 : 2",
    ],
)
def test_assignments_go_to_the_caller_and_give_what_bash_gives(expression):
    variables = {"A": "5"}

    def assign(name: str, value: int) -> None:
        variables[name] = str(value)

    value = evaluate_arithmetic(expression, variables.get, assign)
    done = bash_arithmetic(f"({expression}), A", {"A": "5"})
    assert value == bash_arithmetic(expression, {"A": "5"})
    assert int(variables["A"]) == done
