"""The layout language against megatron-core's own PipelineParallelLayerLayout."""

from __future__ import annotations

import itertools
import re
import time

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ray_layout.errors import LayoutError
from ray_layout.model.layout import (
    MAX_LAYOUT_TEXT,
    Layout,
    build_problem,
    expand,
    first_mtp_stage,
    format_stages,
    parse_stages,
    placement_problems,
    pretty,
    validate,
    validate_buildable,
)
from tests.helpers.megatron_layout_oracle import megatron_verdict

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

PipelineParallelLayerLayout = pytest.importorskip(
    "megatron.core.transformer.pipeline_parallel_layer_layout"
).PipelineParallelLayerLayout


def our_verdict(text: str, pp: int, layers: int, mtp: int):
    try:
        return True, validate(Layout.parse(text, pp), layers, mtp)
    except LayoutError:
        return False, None


# Tokens keep repeat counts small (Megatron unrolls without a cap) while covering the grammar:
# groups, stars after any symbol (including '|' and ')'), commas, spaces and foreign letters.
TOKENS = ["E", "t", "t", "t", "m", "L", "|", "|", ",", "(", ")", "*", "*0", "*1", "*2", "*3",
          "*10", " ", "x", "T", "tt", "(tt|)*2", "(t|)*3"]  # fmt: skip
layout_text = st.lists(st.sampled_from(TOKENS), max_size=24).map("".join)
sizes = st.tuples(st.integers(1, 4), st.integers(0, 8), st.integers(0, 2))


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=layout_text, shape=sizes)
@example(text="Et*3|(tt|)*2,m|L", shape=(4, 7, 1))
@example(text="E||t|L", shape=(4, 1, 0))
@example(text="Et|tm|L", shape=(3, 2, 1))
@example(text="Etm|tL", shape=(2, 2, 1))
@example(text="", shape=(1, 0, 0))
def test_random_strings_accepted_exactly_when_megatron_accepts(text, shape):
    pp, layers, mtp = shape
    assert our_verdict(text, pp, layers, mtp) == megatron_verdict(text, pp, layers, mtp)


def _stages_strategy():
    """Structured layouts near validity: the canonical sequence cut at random, then perturbed."""

    @st.composite
    def build(draw):
        pp = draw(st.integers(1, 4))
        vpp = draw(st.integers(1, 3))
        layers = draw(st.integers(0, 7))
        mtp = draw(st.integers(0, 2))
        symbols = list("E" + "t" * layers + "m" * mtp + "L")
        if draw(st.booleans()):  # perturb: drop, duplicate or swap a symbol
            index = draw(st.integers(0, len(symbols) - 1))
            action = draw(st.sampled_from(["drop", "dup", "swap"]))
            if action == "drop":
                symbols.pop(index)
            elif action == "dup":
                symbols.insert(index, symbols[index])
            elif index + 1 < len(symbols):
                symbols[index], symbols[index + 1] = symbols[index + 1], symbols[index]
        stages = pp * vpp
        cuts = sorted(draw(st.lists(st.integers(0, len(symbols)), min_size=stages - 1,
                                    max_size=stages - 1)))  # fmt: skip
        bounds = [0, *cuts, len(symbols)]
        parts = tuple("".join(symbols[a:b]) for a, b in itertools.pairwise(bounds))
        return parts, pp, layers, mtp

    return build()


@settings(max_examples=800, deadline=None)
@given(case=_stages_strategy())
def test_structured_layouts_agree_with_megatron(case):
    stages, pp, layers, mtp = case
    text = "|".join(stages)
    assert our_verdict(text, pp, layers, mtp) == megatron_verdict(text, pp, layers, mtp)
    as_lists = [[_layer_type(c) for c in stage] for stage in stages]
    assert megatron_verdict(as_lists, pp, layers, mtp) == megatron_verdict(text, pp, layers, mtp)


@settings(max_examples=800, deadline=None)
@given(case=_stages_strategy())
def test_compact_format_parses_back_to_the_same_layout(case):
    stages = case[0]
    text = format_stages(stages)
    assert parse_stages(text) == stages
    assert len(text) <= len("|".join(stages)) + len(stages)  # a pair costs one char: t*2m
    assert PipelineParallelLayerLayout.parse_str_to_list(text) == [
        [_layer_type(c) for c in stage] for stage in stages
    ]


def _layer_type(symbol: str):
    from megatron.core.transformer.enums import LayerType

    return {"E": LayerType.embedding, "t": LayerType.decoder, "m": LayerType.mtp,
            "L": LayerType.loss}[symbol]  # fmt: skip


@pytest.mark.parametrize(
    ("stages", "text"),
    [
        (("Ettttt", "tttttt", "ttttt", "mL"), "Et*5|t*6|t*5|mL"),
        (("Etttt", "ttttt", "ttttt", "ttmL"), "Et*4|t*5|t*5|t*2mL"),
        (("Ettt",) + ("tt",) * 29 + ("m", "L"), "Et*3|(tt|)*29m|L"),
        (("Etttt",) + ("tttt",) * 6 + ("ttttL",), "Et*4|(t*4|)*6t*4L"),
        (("Ett",) + ("tt",) * 6 + ("ttmL",), "Ett|(tt|)*6t*2mL"),
        (("E", "", "", "tL"), "E|||tL"),
    ],
)
def test_compact_format_examples(stages, text):
    assert format_stages(stages) == text
    assert parse_stages(text) == stages


def test_a_look_alike_letter_is_named_by_its_code_point():
    with pytest.raises(LayoutError, match=r"invalid symbol 'Е' \(U\+0415, not a Latin letter\)"):
        parse_stages("EtЕ|L")


def test_megatron_doc_example_parses():
    layout = Layout.parse("Et*3|(tt|)*29,m|L", 16)
    assert layout.vpp == 2
    assert layout.rank_chunks(0) == ("Ettt", "tt")
    assert layout.rank_chunks(15) == ("tt", "L")
    assert validate(layout, 61, 1) is True  # m on rank 14, chunk 1: standalone
    assert expand("(ab|)*2,c") == "ab|ab|c"


@pytest.mark.parametrize(
    ("text", "pp", "layers", "mtp", "message"),
    [
        ("Et*4|t*4|t*4|t*4mL", 3, 16, 1, "not divisible by PP=3"),
        ("tE|L", 2, 1, 0, "first layer must be the embedding"),
        ("E|tLt", 2, 2, 0, "last layer must be the loss"),
        ("Et|tL", 2, 3, 0, "2 decoder layers t, the model has 3"),
        ("Et|tL", 2, 2, 1, "0 MTP layers m, the model has 1"),
        ("Etm|tL", 2, 2, 1, "must all come before the first MTP layer"),
        ("Et|tm||L", 2, 2, 1, "last virtual chunk"),
        ("Et|m|t|mL", 2, 2, 2, "before the first MTP"),
        ("Ett|tmx|L", 3, 3, 1, "invalid symbol 'x'"),
        ("EtE|tL", 2, 2, 0, "E must appear exactly once"),
    ],
)
def test_rejections_name_the_problem(text, pp, layers, mtp, message):
    with pytest.raises(LayoutError, match=message):
        validate(Layout.parse(text, pp), layers, mtp)
    assert megatron_verdict(text, pp, layers, mtp)[0] is False


def test_huge_repeat_is_refused_not_expanded():
    with pytest.raises(LayoutError, match="expands to more than"):
        parse_stages("Et*999999999|L")


def _megatrons_unrolling(text: str) -> str:
    """PipelineParallelLayerLayout.parse_str_to_list's unrolling, pattern for pattern."""
    text = text.replace(",", "")
    for pattern in (r"\(([^)]+)\)\*(\d+)", r"(.)\*(\d+)"):
        text = re.sub(pattern, lambda x: x.group(1) * int(x.group(2)), text)
    return text


GROUPS = ["(", "(", ")", ")*", "*", "*0", "*1", "*2", "*12", "t", "E", "|", ",", "x", "٣"]


@settings(max_examples=400, deadline=None)
@given(text=st.lists(st.sampled_from(GROUPS), max_size=30).map("".join))
@example(text="((*0t)*2")  # nested: Megatron's group holds '(' and '*0' removes it
@example(text="((t)*2)*3")
def test_groups_unroll_as_megatrons_regex_does(text):
    """The linear-time unrolling is Megatron's regex substitution, nested and stray parentheses
    and other scripts' digits included (where a group's copies spell a count past the cap,
    Megatron would unroll it for hours: refused)."""
    try:
        unrolled = expand(text)
    except LayoutError as exc:
        assert "expands to more than" in str(exc)
        return
    assert unrolled == _megatrons_unrolling(text)


LAYOUT_PARTS = st.one_of(
    st.text(alphabet="EtmL|()*,0123456789x ٣\n", max_size=30),
    st.integers(0, 10**30).map(lambda n: f"*{n}"),
    st.sampled_from(["(", ")*", "t*999999", "(t|)*", "*" + "9" * 5000, "*" + "0" * 5000 + "1"]),
    st.tuples(st.sampled_from(["(", "((t)*2", "(t)*1", "t|", ")*2"]), st.integers(1, 60_000)).map(
        lambda part: part[0] * part[1]
    ),
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.lists(LAYOUT_PARTS, max_size=8).map("".join), pp=st.integers(1, 8))
@example(text="(" * 100_000 + "t", pp=1)  # the regex took 108 s: it scans from every '('
@example(text="(" * 50_000 + "t)*2" * 50_000, pp=1)
@example(text="t" * (MAX_LAYOUT_TEXT + 1), pp=1)
def test_any_string_is_a_layout_or_one_layout_error_in_time(text, pp):
    """Long repeats, deep groups, runs of parentheses: a Layout or a LayoutError, in linear time,
    never another exception."""
    started = time.monotonic()
    try:
        layout = Layout.parse(text, pp)
        validate(layout, 4, 1)
        str(layout)
    except LayoutError as exc:
        assert "\n" not in str(exc)
    assert time.monotonic() - started < 5.0


def test_placement_problems_flag_what_megatron_ignores():
    assert placement_problems(Layout.parse("Et|tL", 2)) == []
    problems = placement_problems(Layout.parse("|Et|t|L", 4))
    assert problems and "E is not in stage 0" in problems[0]
    assert "L is not in the last stage" in placement_problems(Layout.parse("Et|tL|", 3))[0]


def test_pretty_shows_each_rank_and_chunk():
    text = pretty(Layout.parse("Ett|tt|tt|ttmL", 2))
    assert text.splitlines() == ["PP rank  0: Ett    tt", "PP rank  1: tt     t*2mL"]


def embedding_all_reduces_while_building(layout: Layout, tied: bool) -> dict[int, object]:
    """How often each PP rank of the embedding group all-reduces the shared embedding while its
    chunks are built ("fails" where it would on a chunk that holds no embedding), read from
    megatron-core 0.16.1 with MTP present: the group is ``pretrain_gpt.get_embedding_ranks``'s
    (rank 0, the last rank if tied, the MTP ranks); in ``_is_in_embd_group`` an MTP chunk always
    calls, the group's first rank on its first chunk, the group's last rank on the pipeline's
    last chunk, a rank inside the group on every chunk, and a chunk that calls takes its weight
    from ``GPTModel.shared_embedding_or_output_weight`` (None on a chunk that is neither the
    first, the last nor MTP's)."""
    last = layout.pp - 1
    mtp_ranks = {r for r in range(layout.pp) if any("m" in c for c in layout.rank_chunks(r))}
    group = sorted({0} | ({last} if tied else set()) | mtp_ranks)
    counts: dict[int, object] = {}
    for rank in group:
        calls = 0
        for chunk, stage in enumerate(layout.rank_chunks(rank)):
            if "m" in stage:
                calls_here = True
            elif rank == group[0]:
                calls_here = chunk == 0 and rank == 0
            elif rank == group[-1]:
                calls_here = chunk == layout.vpp - 1 and rank == last
            else:
                calls_here = True
            # Megatron builds E on rank 0's first and L on the last rank's last chunk, whatever
            # the string says (placement_problems)
            edge = (rank, chunk) in ((0, 0), (last, layout.vpp - 1))
            if calls_here and not ("m" in stage or edge):
                counts[rank] = "fails"
                break
            calls += calls_here
        else:
            counts[rank] = calls
    return counts if len(group) > 1 else {}


@settings(max_examples=800, deadline=None)
@given(case=_stages_strategy(), tied=st.booleans())
def test_a_layout_is_refused_to_build_exactly_when_the_embedding_all_reduces_do_not_pair(
    case, tied
):
    """Among the layouts Megatron accepts, ``build_problem`` names exactly those whose
    embedding-group ranks would call the all-reduce unequally or on a chunk without the weight."""
    stages, pp, layers, mtp = case
    layout = Layout(stages, pp)
    try:
        validate(layout, layers, mtp)
    except LayoutError:
        return
    counts = embedding_all_reduces_while_building(layout, tied)
    broken = (pp > 1 and mtp > 0 and len(set(counts.values())) > 1) or "fails" in counts.values()
    assert (build_problem(layout, tied_embeddings=tied) is not None) == broken
    if broken:
        with pytest.raises(LayoutError, match=r"does not build in megatron-core 0\.16\.1"):
            validate_buildable(layout, layers, mtp, tied_embeddings=tied)
        mtp_stage = next(s for s, stage in enumerate(stages) if "m" in stage)
        assert mtp_stage < first_mtp_stage(pp, layout.vpp, tied_embeddings=tied)


def test_mtp_off_the_last_rank_with_vpp_and_tied_embeddings_does_not_build():
    problem = build_problem(Layout.parse("Ett|tt|m|L", 2), tied_embeddings=True)
    assert "MTP on PP rank 0" in problem and "--untie-embeddings-and-output-weights" in problem
    assert build_problem(Layout.parse("Ett|tt|m|L", 2), tied_embeddings=False) is None
    for text, pp in [("Et|tt|t|mL", 2), ("Ett|ttm|L", 3), ("Et*3|t*3mL", 2), ("Ett|mL", 1)]:
        assert build_problem(Layout.parse(text, pp), tied_embeddings=True) is None
    stages = [(pp, vpp, tied) for pp, vpp in [(1, 3), (4, 1), (4, 2), (2, 3)] for tied in (1, 0)]
    assert [first_mtp_stage(pp, vpp, tied_embeddings=tied) for pp, vpp, tied in stages] == [
        2, 2, 0, 0, 7, 4, 5, 4,
    ]  # fmt: skip
