"""The layout space: counts against enumeration, enumeration against megatron-core."""

from __future__ import annotations

import itertools

import pytest

from ray_layout.errors import LayoutError
from ray_layout.model.layout import Layout, build_problem, placement_problems, validate
from ray_layout.model.spec import with_parallel
from search.space import LayoutSpace
from tests.helpers.megatron_layout_oracle import megatron_verdict
from tests.helpers.tuning_small import HANDBOOK

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.mark.parametrize(
    ("kwargs", "total", "standalone"),
    [
        ({}, 680, 136),
        ({"allow_standalone_mtp": True}, 816, 136),
        ({"allow_empty_stages": True, "allow_standalone_mtp": True}, 1140, 171),
        (
            {"allow_empty_stages": True, "allow_standalone_mtp": True, "require_placement": False},
            1540,
            400,
        ),
    ],
)
def test_handbook_counts_match_megatron_measurements(kwargs, total, standalone):
    """816 (136 standalone) non-empty, 1540 (400) with empty stages, 1140 with E and L placed:
    the numbers counted with megatron-core's validator over ~9 million strings."""
    space = LayoutSpace(16, 1, 4, **kwargs)
    assert space.count().total == total
    assert space.count().standalone == standalone
    assert sum(1 for _ in space) == total


def megatron_accepted_layouts(layers: int, mtp: int, pp: int, vpp: int) -> set[tuple[str, ...]]:
    """Every way to cut E t^N m^K L into PP x VPP stages that megatron-core accepts. Any valid
    layout flattens to exactly that sequence, so this is every layout Megatron accepts."""
    symbols = "E" + "t" * layers + "m" * mtp + "L"
    accepted = set()
    for cuts in itertools.combinations_with_replacement(range(len(symbols) + 1), pp * vpp - 1):
        bounds = (0, *cuts, len(symbols))
        stages = tuple(symbols[a:b] for a, b in itertools.pairwise(bounds))
        if megatron_verdict("|".join(stages), pp, layers, mtp)[0]:
            accepted.add(stages)
    return accepted


@pytest.mark.parametrize(
    ("layers", "mtp", "pp", "vpp"),
    [(3, 1, 2, 1), (4, 2, 3, 1), (3, 1, 2, 2), (2, 1, 3, 2), (5, 0, 3, 1), (3, 2, 2, 3)],
)
@pytest.mark.parametrize("tied", [True, False])
def test_enumeration_is_exactly_what_megatron_accepts_and_builds(layers, mtp, pp, vpp, tied):
    """megatron-core's validator judges what is accepted; of that, what megatron-core 0.16.1
    builds is ``build_problem``'s (tested against the build's all-reduces in test_layout)."""
    accepted = megatron_accepted_layouts(layers, mtp, pp, vpp)
    oracle = {s for s in accepted if build_problem(Layout(s, pp), tied_embeddings=tied) is None}
    assert (len(oracle) < len(accepted)) == (tied and mtp > 0 and pp > 1 and vpp > 1)
    widest = LayoutSpace(layers, mtp, pp, vpp, allow_empty_stages=True, allow_standalone_mtp=True,
                         require_placement=False, tied_embeddings=tied)  # fmt: skip
    ours = [layout.stages for layout in widest]
    assert len(ours) == len(set(ours)) == widest.count().total
    assert set(ours) == oracle
    standalone = {s for s in oracle if megatron_verdict("|".join(s), pp, layers, mtp)[1]}
    assert widest.count().standalone == len(standalone)

    default = LayoutSpace(layers, mtp, pp, vpp, tied_embeddings=tied)
    expected = {s for s in oracle - standalone if all(s) and not placement_problems(Layout(s, pp))}
    assert {layout.stages for layout in default} == expected
    assert default.count().total == len(expected)


@pytest.mark.parametrize("layers", range(0, 9))
@pytest.mark.parametrize("mtp", [0, 1, 2])
@pytest.mark.parametrize(("pp", "vpp"), [(1, 1), (2, 1), (3, 1), (4, 1), (2, 2), (3, 2), (2, 3)])
@pytest.mark.parametrize("empty", [False, True])
@pytest.mark.parametrize("standalone", [False, True])
def test_count_agrees_with_enumeration(layers, mtp, pp, vpp, empty, standalone):
    space = LayoutSpace(layers, mtp, pp, vpp, allow_empty_stages=empty,
                        allow_standalone_mtp=standalone)  # fmt: skip
    layouts = list(space)
    assert space.count().total == len(layouts)
    for layout in layouts[:50]:
        assert validate(layout, layers, mtp) == layout.mtp_standalone
        assert standalone or not layout.mtp_standalone


def test_closed_form_for_non_empty_stages():
    """With every stage non-empty and MTP kept as one block: C(N + 2, S - 1) layouts."""
    from math import comb

    for layers, pp in [(16, 4), (30, 8), (61, 16)]:
        assert LayoutSpace(layers, 1, pp, allow_standalone_mtp=True).count().total == comb(
            layers + 2, pp - 1
        )


def test_huge_spaces_count_without_enumerating():
    deepseek = LayoutSpace(61, 1, 16, 2).count()
    assert deepseek.total > 10**17
    first = next(iter(LayoutSpace(61, 1, 16, 2)))
    assert validate(first, 61, 1) is False


def test_bad_sizes_are_refused():
    with pytest.raises(LayoutError, match="PP and VPP must be >= 1"):
        LayoutSpace(4, 0, 0)


@pytest.mark.parametrize(
    "text", ["Et*5|t*6|t*5|mL", "Et*5|t*6|t*5m|L", "E||t|tmmL", "Ett|tt|tt|ttmL", "Et*4|t*4L"]
)
def test_holding_gives_back_the_layout(text):
    layout = Layout.parse(text, 2)
    space, cuts = LayoutSpace.holding(layout)
    assert space.stages_from_cuts(tuple(cuts)) == layout.stages


def test_the_space_of_a_recipe_is_its_model_on_its_pp_and_vpp():
    recipe = with_parallel(HANDBOOK, pp=4, vpp=2)
    space = LayoutSpace.of(recipe.model, recipe.parallel, allow_standalone_mtp=True)
    assert space == LayoutSpace(
        recipe.model.num_layers, recipe.model.mtp_num_layers, 4, 2, allow_standalone_mtp=True
    )
