"""Ranking: Jensen pruning changes no top, ties go to fewer critical ranks then headroom, and
shard tops merge into one candidate per prediction with the counts and bound of them all."""

from __future__ import annotations

import itertools

import numpy as np

from ray_layout.model.layout import Layout
from search.evaluate import monte_carlo, standard_normals
from search.ranking import Candidate, ShardResult, candidates_of, merge, rank_key
from search.shards import evaluate_shard
from tests.helpers.search_shard_setup import plain_classes, shard_setup


def candidate(layout: str, mean_ms: float, near: int = 1, peak_gib: float = 50.0) -> Candidate:
    """A scored layout of PP 4 without noise: its mean is its noise-free step."""
    return Candidate(
        layout=Layout.parse(layout, 4),
        mean_ms=mean_ms,
        p90_ms=mean_ms,
        noise_free_ms=mean_ms,
        bottleneck_rank=3,
        near_bottleneck=near,
        memory_gib=(peak_gib, 1.0, 1.0, 1.0),
        fits=True,
        mtp_standalone=False,
    )


def shard(*found: tuple[Candidate, int], grid_ms: float = 1.0, **fields) -> ShardResult:
    """A shard's result ranked as ``best_of`` ranks it."""
    ranked = sorted(found, key=lambda pair: rank_key(pair[0], grid_ms, None))
    return ShardResult(
        candidates=tuple(c for c, _ in ranked),
        scored=sum(n for _, n in ranked),
        sampled=len(ranked),
        rejected_memory=0,
        keys=tuple(rank_key(c, grid_ms, None) for c, _ in ranked),
        ties=tuple(n for _, n in ranked),
        **fields,
    )


def test_top_equals_monte_carlo_of_every_distinct_prediction():
    """Jensen pruning changes nothing: the top is what sampling every class would give."""
    space, program, model, options, grid = shard_setup()
    pruned = merge([evaluate_shard(space, program, model, options, grid)], options.top)
    classes, _, _ = plain_classes(space, program, model)
    assert pruned.sampled < len(classes)  # the pruning did skip classes
    cuts = np.array([tie.cuts for tie in classes])
    counts = space.unit_counts(cuts, model.units, model.moe_pattern)
    steps = monte_carlo(program, model, counts, standard_normals(program, 64, 0))
    everything = candidates_of(space, program, model, cuts, steps, None)
    ranked = sorted(zip(everything, classes, strict=True), key=lambda p: rank_key(p[0], grid, None))
    assert [c.layout for c in pruned.candidates] == [c.layout for c, _ in ranked[:6]]
    assert [c.mean_ms for c in pruned.candidates] == [c.mean_ms for c, _ in ranked[:6]]
    assert list(pruned.ties) == [tie.count for _, tie in ranked[:6]]


def test_ties_go_to_fewer_near_bottleneck_ranks_then_headroom():
    space, program, model, options, grid = shard_setup(jitter=0.0)
    top = evaluate_shard(space, program, model, options, grid).candidates
    for better, worse in itertools.pairwise(top):
        if int(better.mean_ms // grid) == int(worse.mean_ms // grid):
            assert (better.near_bottleneck, better.peak_memory_gib) <= (
                worse.near_bottleneck,
                worse.peak_memory_gib,
            )


def test_the_tie_grid_ranks_critical_ranks_and_headroom_before_a_faster_mean():
    """Within one grid cell fewer critical ranks win, then a lower peak; across cells the mean."""
    slow_single = candidate("Et*4|t*4|t*4|t*4mL", 100.4, near=1)
    fast_double = candidate("Et*5|t*4|t*4|t*3mL", 100.1, near=2)
    assert rank_key(slow_single, 1.0, None) < rank_key(fast_double, 1.0, None)
    assert rank_key(fast_double, 0.25, None) < rank_key(slow_single, 0.25, None)
    roomy = candidate("Et*5|t*5|t*3|t*3mL", 100.3, peak_gib=40.0)
    assert rank_key(roomy, 1.0, 131.0) < rank_key(slow_single, 1.0, 131.0)


def test_merge_keeps_one_candidate_per_prediction_with_the_counts_added():
    """The same prediction from two shards is one candidate: the tie-break's representative
    (fewer critical ranks first), with both shards' layouts counted."""
    a = candidate("Et*4|t*4|t*4|t*4mL", 100.0, near=2)
    b = candidate("Et*5|t*4|t*4|t*3mL", 100.0, near=1)
    c = candidate("Et*5|t*5|t*3|t*3mL", 105.0)
    merged = merge([shard((a, 3), (c, 1)), shard((b, 2))], top=5)
    assert [str(x.layout) for x in merged.candidates] == [str(b.layout), str(c.layout)]
    assert merged.ties == (5, 1)
    assert (merged.scored, merged.sampled, merged.bound_ms) == (6, 3, None)


def test_merged_exact_shards_bound_what_the_top_leaves_out():
    """Exact shards: the plan's bound is the lowest shard bound or the best prediction that fell
    out of the top, whichever is lower; the reason is the binding shard's."""
    best, second = candidate("Et*5|t*4|t*4|t*3mL", 100.0), candidate("Et*4|t*4|t*4|t*4mL", 102.0)
    first = shard((best, 1), bound_ms=110.0, bound_reason="subtrees left unexplored")
    other = shard((second, 1), bound_ms=108.0, bound_reason="LP relaxation binds")
    merged = merge([first, other], top=1)
    assert [str(x.layout) for x in merged.candidates] == [str(best.layout)]
    assert merged.bound_ms == 102.0
    assert merged.bound_reason == "LP relaxation binds"
    assert merge([first, other], top=2).bound_ms == 108.0


def test_candidates_carry_the_sampled_mean_and_p90_or_the_noise_free_step():
    space, program, model, _, _ = shard_setup()
    cuts = np.array([[5, 9, 13], [4, 8, 12]])
    plain = candidates_of(space, program, model, cuts, None, hbm_gib=40.0)
    assert [str(c.layout) for c in plain] == ["Et*4|t*4|t*4|t*4mL", "Et*3|t*4|t*4|t*5mL"]
    assert all(c.mean_ms == c.p90_ms == c.noise_free_ms for c in plain)
    assert [c.fits for c in plain] == [c.peak_memory_gib <= 40.0 for c in plain]
    counts = space.unit_counts(cuts, model.units, model.moe_pattern)
    steps = monte_carlo(program, model, counts, standard_normals(program, 64, 0))
    sampled = candidates_of(space, program, model, cuts, steps, None)
    assert [c.mean_ms for c in sampled] == list(steps.mean(axis=1))
    assert [c.p90_ms for c in sampled] == list(np.quantile(steps, 0.9, axis=1))
    assert all(c.fits is None for c in sampled)  # no HBM limit: memory not checked
