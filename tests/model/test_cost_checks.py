"""What a COSTS.json's values may be: impossible ones refused at load in one line, implausible
ones named in one warning each; the example costs raise neither."""

from __future__ import annotations

import json

import pytest

from ray_layout.errors import ConfigError
from ray_layout.model.cost_checks import DISTRIBUTED_TIMEOUT_MS, field_value, implausible
from tests.helpers.paths import ROOT

EXAMPLE = json.loads((ROOT / "configs/costs/handbook_h200_example.json").read_text())


def _checked(**changes: object) -> dict:
    return {key: field_value(key, value, "c.json") for key, value in (EXAMPLE | changes).items()}


def test_the_example_and_its_scaled_copies_are_plausible():
    assert implausible(_checked()) == ()
    slower = {
        key: {u: ms * 50 for u, ms in EXAMPLE[key].items()} for key in ("forward_ms", "backward_ms")
    }
    assert implausible(_checked(**slower)) == ()
    # the embedding's backward writes the whole table's gradient: no ratio is asked of it
    assert implausible(_checked(forward_ms=EXAMPLE["forward_ms"] | {"E": 0.01})) == ()


@pytest.mark.parametrize(
    ("changes", "warning"),
    [
        ({"backward_ms": EXAMPLE["backward_ms"] | {"t": 100_000.0}},
         "backward_ms.t is 10,000x forward_ms.t (100,000 against 10 ms), where a layer's "
         "backward takes 0.5-10x its forward"),
        ({"backward_ms": EXAMPLE["backward_ms"] | {"m": 1.0}}, "backward_ms.m is 0.071x"),
        ({"backward_ms": EXAMPLE["backward_ms"] | {"L": 0}}, "backward_ms.L is 0x"),
        ({"forward_ms": EXAMPLE["forward_ms"] | {"L": 90_000.0}},
         "forward_ms.L is 90,000 ms, over a minute for one micro-batch"),
        ({"p2p_inter_node_ms": 5e4},
         "p2p_inter_node_ms is 50,000 ms, 5,000x a decoder layer's forward (10 ms)"),
        ({"a2a_ms": 2000.0}, "a2a_ms is 2,000 ms, 200x a decoder layer's forward"),
        ({"tail_fixed_ms": 7.2e6}, "tail_fixed_ms is 7.2e+06 ms, over a minute of every step"),
        ({"grad_sync_ms_per_gparam": 1e6},
         "grad_sync_ms_per_gparam + optimizer_ms_per_gparam is 1e+06 ms, a step tail of over a "
         "minute per billion parameters"),
    ],
)  # fmt: skip
def test_what_no_real_run_measures_is_one_warning_naming_it(changes, warning):
    found = implausible(_checked(**changes))
    assert any(line.startswith(warning) for line in found), found
    assert all("\n" not in line for line in found)


@pytest.mark.parametrize("key", ["p2p_intra_node_ms", "p2p_inter_node_ms", "a2a_ms"])
def test_a_transfer_past_megatrons_distributed_timeout_is_refused(key):
    assert field_value(key, DISTRIBUTED_TIMEOUT_MS, "c.json") == DISTRIBUTED_TIMEOUT_MS
    with pytest.raises(ConfigError) as info:
        field_value(key, 1e7, "c.json")
    assert str(info.value) == (
        f"c.json: {key} must be at most 600000 ms (Megatron's default distributed timeout, 10 "
        "minutes, ends a job whose one transfer takes longer), got 10000000.0"
    )


def test_a_name_is_kept_printable_and_a_count_of_any_size_is_one_line():
    assert field_value("model", "a\x1b[31mb\rc", "c.json") == "a\\x1b[31mb\\rc"
    with pytest.raises(ConfigError, match=r"^c.json: tp must be <= 65,536, got a 1329-bit number$"):
        field_value("tp", int("9" * 400), "c.json")
