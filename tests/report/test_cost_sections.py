"""The report's sections on what the model costs: the pick's memory per PP rank (predicted,
allocated, measured, headroom) and the fitted unit costs, each with what it says when the data
is not there."""

from __future__ import annotations

import math
from dataclasses import replace

from ray_layout.model.costs import UnitCosts
from ray_layout.report.cost_sections import memory_section, unit_costs_section
from ray_layout.report.document import Code, Para, Table


def table_of(blocks) -> Table:
    (table,) = [block for block in blocks if isinstance(block, Table)]
    return table


def paras(blocks) -> list[str]:
    return ["".join(map(str, block.parts)) for block in blocks if isinstance(block, Para)]


def test_the_picks_memory_per_rank_against_what_was_measured(summary):
    """Megatron's max allocated leaves out the fixed overhead: the error compares it with the
    prediction less that overhead; headroom is HBM less the larger of the two."""
    pick = replace(
        summary.arms[0],
        predicted_memory_gib=(40.0, 50.0, 45.0, 30.0),
        measured_memory_gib=(37.0, 53.0),
    )
    costs = replace(summary.unit_costs, memory_overhead_gib=3.0)
    tuned = replace(summary, arms=(pick, *summary.arms[1:]), unit_costs=costs)
    assert table_of(memory_section(tuned, {}, {})).rows == (
        ("0", Code("Et*5"), "40.0", "37.0", "37.0", "+0.0%", "131.0", "91.0"),
        ("1", Code("t*6"), "50.0", "47.0", "53.0", "-11.3%", "131.0", "78.0"),
        ("2", Code("t*5"), "45.0", "42.0", "—", "—", "131.0", "86.0"),
        ("3", Code("mL"), "30.0", "27.0", "—", "—", "131.0", "101.0"),
    )


def test_without_arms_the_picks_simulated_memory_is_shown_and_unknowns_are_dashes(summary):
    bare = replace(summary, arms=(), hbm_gib=None, unit_costs=None)
    rows = table_of(memory_section(bare, {}, {})).rows
    simulated = summary.timelines["pick"].candidate.memory_gib
    assert [row[2] for row in rows] == [f"{gib:,.1f}" for gib in simulated]
    assert {row[3:] for row in rows} == {("—",) * 5}  # no overhead, no measurement, no HBM


def test_an_interleaved_picks_ranks_list_their_chunks(summary):
    interleaved = "Et*2|t*2|t*2|t*2|t*2|t*2|t*2|t*2mL"
    arm = replace(summary.arms[0], layout=interleaved, predicted_memory_gib=(10.0,) * 4)
    tuned = replace(summary, pick=interleaved, arms=(arm,))
    units = [row[1] for row in table_of(memory_section(tuned, {}, {})).rows]
    assert units == [Code("Ett, tt"), Code("tt, tt"), Code("tt, tt"), Code("tt, t*2mL")]
    unknown_pp = replace(tuned, parallel={**tuned.parallel, "pp": None})
    rows = table_of(memory_section(unknown_pp, {}, {})).rows
    assert {row[1].text for row in rows} == {"—"}  # no PP, no chunks


def test_without_any_memory_per_stage_the_section_says_so(summary):
    blocks = memory_section(replace(summary, arms=(), timelines={}), {}, {})
    assert not [block for block in blocks if isinstance(block, Table)]
    assert paras(blocks) == [
        "No memory per stage was given for the pick.",
        "Plot memory skipped: no data.",
    ]


COSTS = UnitCosts(
    forward_ms={"t": 2.5, "L": 38.0},
    backward_ms={"t": 5.0},
    p2p_intra_node_ms=0.05,
    p2p_inter_node_ms=0.4,
    grad_sync_ms_per_gparam=1.5,
    optimizer_ms_per_gparam=2.0,
    source="fit of study s",
    model="m",
    micro_batch_size=2,
    seq_length=4096,
    tp=1,
    ep=2,
    jitter_cv={"t": 0.0123},
)


def test_unit_costs_with_a_unit_missing_its_backward(summary):
    blocks = unit_costs_section(replace(summary, unit_costs=COSTS))
    assert table_of(blocks).rows == (
        (Code("t"), "decoder layer", "2.50", "5.00", "7.50", "0.012"),
        (Code("L"), "output layer + loss", "38.00", "—", "—", "0"),
    )
    assert paras(blocks) == [
        "Times per micro-batch of 2 × 4096 tokens. p2p per transfer 0.05 ms within a node, "
        "0.4 ms across nodes; step tail per billion parameters on a GPU: gradient sync 1.5 ms + "
        "optimizer 2 ms; source fit of study s."
    ]
    unknown = replace(COSTS, p2p_inter_node_ms=math.nan, optimizer_ms_per_gparam=math.inf)
    (text,) = paras(unit_costs_section(replace(summary, unit_costs=unknown)))
    assert text == "Times per micro-batch of 2 × 4096 tokens. source fit of study s."


def test_without_unit_costs_the_section_says_so(summary):
    for costs in (None, replace(COSTS, forward_ms={})):
        assert paras(unit_costs_section(replace(summary, unit_costs=costs))) == [
            "No unit costs were given."
        ]
