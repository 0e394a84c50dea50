"""The straight-line recurrence equals the plain simulator, for any schedule (blocking or
overlapped p2p) and durations."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from search.pipeline_ops import ScheduleShape
from search.recurrence import finish_times, step_ms
from search.schedule import compile_schedule
from search.simulator import simulate


@st.composite
def schedules(draw):
    vpp = draw(st.sampled_from((1, 1, 2, 3)))
    pp = draw(st.integers(2 if vpp > 1 else 1, 5))
    group = pp if vpp == 1 else draw(st.sampled_from((pp, pp + 1, 2 * pp)))
    if vpp == 1:
        microbatches = draw(st.integers(1, 12))
    else:
        microbatches = draw(st.sampled_from((group, 2 * group, 3 * group)))
    combined = (vpp > 1 or pp == 1) and draw(st.booleans())  # Megatron: PP > 1 needs VPP
    return compile_schedule(
        ScheduleShape(pp, vpp, microbatches, group, draw(st.booleans()), combined)
    )


@settings(max_examples=80, deadline=None)
@given(schedules(), st.integers(0, 2**32 - 1), st.booleans(), st.booleans(), st.booleans())
def test_recurrence_equals_the_simulator(program, seed, p2p, tails, jitter):
    """Any schedule, combined 1F1B's merged steps (with what they hide) too."""
    rng = np.random.default_rng(seed)
    batch = 5
    stages = program.shape.num_stages
    # small integers make exact ties and equal paths common, the hard case for a fast path
    forward = rng.integers(0, 6, (stages, batch)).astype(float)
    backward = rng.integers(0, 9, (stages, batch)).astype(float)
    links = (
        rng.integers(0, 3, program.shape.pp).astype(float) if p2p else np.zeros(program.shape.pp)
    )
    tail = rng.integers(0, 20, (program.shape.pp, batch)).astype(float) if tails else None
    noise = np.exp(rng.normal(0, 0.1, (program.num_compute, batch))) if jitter else None
    pairs = program.shape.pp * program.shape.vpp**2
    hidden = rng.integers(0, 3, (pairs, batch)).astype(float) if program.shape.combined else None
    plain = simulate(program, forward, backward, links, tail, noise=noise, hidden_ms=hidden)
    fast = step_ms(program, forward, backward, links,
                   np.zeros((program.shape.pp, batch)) if tail is None else tail, noise,
                   hidden_ms=hidden)  # fmt: skip
    assert np.array_equal(fast, plain.step)
    durations = program.evaluation_table(forward, backward, hidden)
    assert np.array_equal(finish_times(program, durations, links, noise), plain.finish)


def test_links_may_differ_per_column():
    program = compile_schedule(ScheduleShape(4, 2, 8))
    rng = np.random.default_rng(3)
    forward, backward = rng.random((8, 3)), rng.random((8, 3))
    links = rng.random((4, 3))
    tail = np.zeros((4, 3))
    plain = simulate(program, forward, backward, links, tail).step
    assert np.array_equal(step_ms(program, forward, backward, links, tail), plain)
