"""COSTS.json: round trip, one-line errors, the FLOP-based guess, compute per stage."""

from __future__ import annotations

import json
import os
from dataclasses import replace

import pytest

from ray_layout.errors import ConfigError, MeasurementError
from ray_layout.model.costs import (
    FORMAT,
    UnitCosts,
    costs_from_dict,
    costs_from_flops,
    costs_to_dict,
    costs_warnings,
    load_costs,
    provenance_mismatches,
    save_costs,
    stage_compute_ms,
    stage_units,
    step_tail_ms,
    within_bounds,
)
from ray_layout.model.sizing import layer_units, stage_sizes, unit_sizes
from ray_layout.model.spec import build_recipe, load_recipe_file

EXAMPLE = "configs/costs/handbook_h200_example.json"
HANDBOOK = load_recipe_file("configs/handbook_7b_a1b.yaml")
MIXED = build_recipe(
    {"name": "mixed", "num_layers": 4, "hidden_size": 256, "num_attention_heads": 4,
     "seq_length": 128, "vocab_size": 1000, "num_experts": 4, "moe_router_topk": 2,
     "moe_layer_freq": "[0]*2+[1]*2"},
    source="test",
).model  # fmt: skip


def example_dict() -> dict:
    with open(EXAMPLE) as f:
        return json.load(f)


def test_example_file_holds_the_documented_numbers():
    costs = load_costs(EXAMPLE)
    assert costs.forward_ms == {"E": 1.0, "t": 10.0, "m": 14.0, "L": 38.0}
    assert costs.backward_ms == {"E": 1.0, "t": 20.0, "m": 28.0, "L": 76.0}
    assert (costs.p2p_intra_node_ms, costs.p2p_inter_node_ms, costs.gpus_per_node) == (0.4, 2.0, 8)
    assert (costs.model, costs.micro_batch_size, costs.seq_length) == ("handbook_7b_a1b", 2, 4096)
    assert (costs.tp, costs.ep) == (HANDBOOK.parallel.tp, HANDBOOK.parallel.ep)


def test_save_then_load_round_trips(tmp_path):
    path = tmp_path / "costs.json"
    for costs in (load_costs(EXAMPLE), costs_from_flops(HANDBOOK.model, HANDBOOK.parallel)):
        save_costs(costs, path)
        assert load_costs(path) == costs
        assert json.loads(path.read_text())["format"] == FORMAT
    assert [p.name for p in tmp_path.iterdir()] == ["costs.json"]  # no temporary file left


def test_a_write_the_disk_refuses_is_one_line_and_leaves_nothing(tmp_path, monkeypatch):
    def full_disk(source, target):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("os.replace", full_disk)
    with pytest.raises(ConfigError, match=r"costs.json: cannot write \(No space left on device\)$"):
        save_costs(load_costs(EXAMPLE), tmp_path / "costs.json")
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ConfigError, match="cannot write"):
        save_costs(load_costs(EXAMPLE), tmp_path / "no" / "costs.json")


def test_saved_costs_take_the_umask_as_open_would(tmp_path):
    old = os.umask(0o022)
    try:
        save_costs(load_costs(EXAMPLE), tmp_path / "costs.json")
    finally:
        os.umask(old)
    assert (tmp_path / "costs.json").stat().st_mode & 0o777 == 0o644


def test_save_replaces_the_file_and_leaves_it_whole_on_failure(tmp_path):
    path = tmp_path / "costs.json"
    save_costs(load_costs(EXAMPLE), path)
    before = path.read_text()
    broken = replace(load_costs(EXAMPLE), model=object())  # not JSON-serialisable
    with pytest.raises(TypeError):
        save_costs(broken, path)
    assert path.read_text() == before
    assert [p.name for p in tmp_path.iterdir()] == ["costs.json"]


def test_defaults_fill_optional_fields(tmp_path):
    raw = example_dict()
    for key in ("gpus_per_node", "jitter_cv", "memory_calibration", "memory_overhead_gib",
                "mtp_standalone_factor"):  # fmt: skip
        del raw[key]
    path = tmp_path / "costs.json"
    path.write_text(json.dumps(raw))
    costs = load_costs(path)
    assert costs.gpus_per_node == 8
    assert costs.jitter_cv == {} and costs.memory_calibration == {}
    assert costs.memory_overhead_gib == 3.0 and costs.mtp_standalone_factor == 1.12


def test_costs_are_immutable():
    costs = load_costs(EXAMPLE)
    with pytest.raises(TypeError):
        costs.forward_ms["t"] = 0.0  # type: ignore[index]


def _without(key):
    def edit(raw):
        del raw[key]

    return edit


def _set(key, value):
    def edit(raw):
        raw[key] = value

    return edit


def _set_unit(key, unit, value):
    def edit(raw):
        raw[key][unit] = value

    return edit


def _drop_unit(key, unit):
    def edit(raw):
        del raw[key][unit]

    return edit


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (_set("speed", 1), "unknown key(s) speed"),
        (_without("format"), "format must be 'ray_layout.costs/1', got none"),
        (_without("backward_ms"), "missing required key backward_ms"),
        (_without("ep"), "missing required key ep"),
        (_set("format", "ray_layout.costs/2"), "format must be 'ray_layout.costs/1', got 'ray_"),
        (_set("source", "guess"), "source must be one of fit, flops, manual, got 'guess'"),
        (_set("model", ""), "model must be a non-empty string, got ''"),
        (_set("model", 7), "model must be a non-empty string, got 7"),
        (_set("tp", 0), "tp must be >= 1, got 0"),
        (_set("micro_batch_size", 2.0), "micro_batch_size must be an integer, got 2.0"),
        (_set("gpus_per_node", True), "gpus_per_node must be an integer, got True"),
        (_set("p2p_inter_node_ms", -1), "p2p_inter_node_ms must be 0 or at least 1e-06 ms (1 ns)"),
        (_set("p2p_intra_node_ms", "0.4"), "p2p_intra_node_ms must be a finite number, got '0.4'"),
        (_set("optimizer_ms_per_gparam", None), "optimizer_ms_per_gparam must be a finite number"),
        (_set("memory_overhead_gib", float("nan")), "memory_overhead_gib must be a finite number"),
        (_set("mtp_standalone_factor", 0), "mtp_standalone_factor must be at least 0.5, got 0"),
        (_set("mtp_standalone_factor", 1e-300), "mtp_standalone_factor must be at least 0.5"),
        (_set("mtp_standalone_factor", 40.0), "mtp_standalone_factor must be at most 4, got 40.0"),
        (_set("memory_overhead_gib", -1), "memory_overhead_gib must be at least 0 GiB, got -1"),
        (_set("memory_overhead_gib", 1e6), "memory_overhead_gib must be at most 1024 GiB"),
        (_set("grad_sync_ms_per_gparam", float("inf")), "grad_sync_ms_per_gparam must be a finite"),
        (_set("tail_fixed_ms", 1e300), "tail_fixed_ms must be at most 1e+07 ms, got 1e+300"),
        # a number too large for a float: one line, never an OverflowError
        (_set("p2p_intra_node_ms", int("9" * 400)), "p2p_intra_node_ms must be at most 600000 ms"),
        (_set_unit("forward_ms", "t", -int("9" * 400)), "forward_ms.t must be 0 or at least 1e-06"),
        (_set("mtp_standalone_factor", int("9" * 400)), "must be at most 4, got a 1329-bit number"),
        (_set("p2p_inter_node_ms", 1e7), "p2p_inter_node_ms must be at most 600000 ms (Megatron's"),
        (_set("tp", 10**6), "tp must be <= 65,536, got 1000000"),
        (_set("seq_length", 10**30), "seq_length must be <= 16,777,216, got a 100-bit number"),
        (_set("forward_ms", [10.0]), "forward_ms must be an object of unit name to number"),
        (_set_unit("forward_ms", "x", 1.0), "forward_ms has unknown unit(s) x; units are E, t,"),
        (_set_unit("forward_ms", "t", -10.0), "forward_ms.t must be 0 or at least 1e-06 ms (1 ns)"),
        (_set_unit("forward_ms", "t", 5e-324), "forward_ms.t must be 0 or at least 1e-06 ms"),
        (_set_unit("backward_ms", "t", 1e308), "backward_ms.t must be at most 1e+07 ms"),
        (_set_unit("forward_ms", "t", float("nan")), "forward_ms.t must be a finite number"),
        (_set_unit("backward_ms", "L", False), "backward_ms.L must be a finite number, got False"),
        (_set_unit("jitter_cv", "t", -0.1), "jitter_cv.t must be at least 0, got -0.1"),
        (_set_unit("jitter_cv", "t", 9e6), "jitter_cv.t must be at most 1, got 9000000.0"),
        (_set_unit("memory_calibration", "m", 0.0), "memory_calibration.m must be at least 0.05"),
        (_set_unit("memory_calibration", "m", 1e9), "memory_calibration.m must be at most 20"),
        (_drop_unit("forward_ms", "L"), "forward_ms lacks unit(s) L"),
        (_drop_unit("forward_ms", "t"), "forward_ms lacks unit(s) t_dense, t_moe"),
        (_drop_unit("backward_ms", "m"), "backward_ms must list the units of forward_ms (E, L, m,"),
    ],
)
def test_every_error_is_one_line_naming_file_and_key(tmp_path, edit, message):
    raw = example_dict()
    edit(raw)
    path = tmp_path / "costs.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(ConfigError) as info:
        load_costs(path)
    text = str(info.value)
    assert text.startswith(f"{path}: ") and message in text and "\n" not in text


@pytest.mark.parametrize(
    "edit",
    [_set("model", ["x" * 50_000] * 10), _set("source", "y" * 900_000), _set("cp", "9" * 4000)],
)
def test_a_huge_value_is_quoted_in_at_most_80_characters(tmp_path, edit):
    raw = example_dict()
    edit(raw)
    path = tmp_path / "c.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(ConfigError) as info:
        load_costs(path)
    assert (
        len(str(info.value)) <= len(f"{path}: source must be one of fit, flops, manual, got ") + 80
    )


def test_a_key_given_twice_is_refused_by_name(tmp_path):
    path = tmp_path / "c.json"
    text = json.dumps(example_dict())
    path.write_text(text.replace('"tp": 1,', '"tp": 1, "tp": 8,'))
    with pytest.raises(ConfigError, match=r"c\.json: duplicate key 'tp'$"):
        load_costs(path)


@pytest.mark.parametrize(
    ("content", "message"),
    [("{", "not valid JSON"), ("[1, 2]", "expected a JSON object at the top level")],
)
def test_unreadable_files(tmp_path, content, message):
    path = tmp_path / "costs.json"
    path.write_text(content)
    with pytest.raises(ConfigError, match=message):
        load_costs(path)
    with pytest.raises(ConfigError, match="cannot read"):
        load_costs(tmp_path / "absent.json")


def test_split_decoder_units_are_accepted(tmp_path):
    raw = example_dict()
    for key in ("forward_ms", "backward_ms"):
        raw[key]["t_dense"] = raw[key]["t_moe"] = raw[key].pop("t")
    path = tmp_path / "costs.json"
    path.write_text(json.dumps(raw))
    assert set(load_costs(path).forward_ms) == {"E", "t_dense", "t_moe", "m", "L"}


@pytest.mark.parametrize("tp", [1, 2])
def test_costs_from_flops_keep_the_flop_ratios(tp):
    parallel = replace(HANDBOOK.parallel, tp=tp)
    costs = costs_from_flops(HANDBOOK.model, parallel, tflops_per_gpu=500.0)
    flops = {u: s.forward_flops for u, s in unit_sizes(HANDBOOK.model, 2, tp).items()}
    assert set(costs.forward_ms) == set(flops) == {"E", "t", "m", "L"}
    exposed = {u: 2 * costs.a2a_ms * moe for u, moe in layer_units(HANDBOOK.model).items()}
    compute = {u: ms - exposed.get(u, 0.0) for u, ms in costs.forward_ms.items()}
    for unit in ("m", "L"):
        assert compute[unit] / compute["t"] == pytest.approx(flops[unit] / flops["t"])
    assert compute["t"] == pytest.approx(flops["t"] / tp / 500e12 * 1e3)
    for unit in ("t", "m"):  # two GEMMs per forward GEMM; the all-to-alls the same both ways
        assert costs.backward_ms[unit] - exposed[unit] == pytest.approx(2 * compute[unit])
    # the output layer measured 1.16-1.30x its forward: the softmax's gradient comes cheap
    assert costs.backward_ms["L"] == pytest.approx(1.23 * costs.forward_ms["L"])
    assert (costs.source, costs.model, costs.micro_batch_size, costs.seq_length) == (
        "flops", "handbook_7b_a1b", 2, 4096,
    )  # fmt: skip
    assert (costs.tp, costs.ep) == (tp, 2)


@pytest.mark.parametrize("tp", [1, 2])
def test_the_embedding_costs_the_bytes_it_moves(tp):
    """Handbook: b=2, s=4096, h=2048, 128256 words (divisible by 128 x TP: no padding), CP 1."""
    parallel = replace(HANDBOOK.parallel, tp=tp)
    costs = costs_from_flops(HANDBOOK.model, parallel, hbm_gb_per_s=2000.0)
    rows = 2 * 4096 * 2048 * 2  # bf16 row of every token
    forward = rows * (1 + 1 / tp)  # its shard's rows read, every output row written
    # the tokens' gradient rows read and added, the dense bf16 table gradient zero-filled and
    # read, the fp32 main gradient read and written: 12 bytes per element of the shard
    backward = 2 * rows + 128256 * 2048 / tp * 12
    assert costs.forward_ms["E"] == pytest.approx(forward / 2000e9 * 1e3)
    assert costs.backward_ms["E"] == pytest.approx(backward / 2000e9 * 1e3)
    assert 0.05 < costs.backward_ms["E"] / (costs.forward_ms["t"] + costs.backward_ms["t"]) < 1
    # CP halves the tokens a GPU looks up, not its vocabulary shard
    cp2 = costs_from_flops(HANDBOOK.model, replace(parallel, cp=2), hbm_gb_per_s=2000.0)
    assert cp2.forward_ms["E"] == pytest.approx(costs.forward_ms["E"] / 2)
    assert cp2.backward_ms["E"] == pytest.approx((backward - rows) / 2000e9 * 1e3)


def test_costs_from_flops_transfers_and_tail():
    costs = costs_from_flops(
        HANDBOOK.model, HANDBOOK.parallel, intra_node_gb_per_s=100.0, inter_node_gb_per_s=10.0,
        hbm_gb_per_s=3000.0,
    )  # fmt: skip
    activation = 2 * 4096 * 2 * 2048  # bf16 [s, b, h]
    assert costs.p2p_intra_node_ms == pytest.approx(activation / 100e9 * 1e3)
    assert costs.p2p_inter_node_ms == pytest.approx(activation / 10e9 * 1e3)
    # DP=2 inside one node: fp32 reduce-scatter + bf16 all-gather, half of each crosses the link.
    assert costs.grad_sync_ms_per_gparam == pytest.approx(6 * 0.5 / 100.0 * 1e3)
    assert costs.optimizer_ms_per_gparam == pytest.approx(30 / 2 / 3000.0 * 1e3)
    wide = replace(HANDBOOK.parallel, dp=16, global_batch_size=256)
    across = costs_from_flops(HANDBOOK.model, wide, inter_node_gb_per_s=10.0)
    assert across.grad_sync_ms_per_gparam == pytest.approx(6 * 15 / 16 / 10.0 * 1e3)


def test_stage_compute_ms_on_the_handbook():
    costs = load_costs(EXAMPLE)
    stages = ("Ettttt", "tttttt", "ttttt", "mL")
    forward, backward = stage_compute_ms(costs, HANDBOOK.model, stages)
    assert forward == [51.0, 60.0, 50.0, 52.0]
    assert backward == [101.0, 120.0, 100.0, 104.0]


def test_stage_compute_ms_maps_decoder_layers_in_order():
    assert stage_units(MIXED, ("Et", "t", "", "ttmL")) == [
        ["E", "t_dense"], ["t_dense"], [], ["t_moe", "t_moe", "m", "L"],
    ]  # fmt: skip
    costs = UnitCosts(
        forward_ms={"E": 0.5, "t_dense": 1.0, "t_moe": 3.0, "L": 4.0},
        backward_ms={"E": 0.5, "t_dense": 2.0, "t_moe": 6.0, "L": 8.0},
        p2p_intra_node_ms=0.0, p2p_inter_node_ms=0.0, grad_sync_ms_per_gparam=0.0,
        optimizer_ms_per_gparam=0.0, source="manual", model="mixed", micro_batch_size=1,
        seq_length=128, tp=1, ep=1,
    )  # fmt: skip
    forward, backward = stage_compute_ms(costs, MIXED, ("Ett", "t", "tL", ""))
    assert forward == [2.5, 3.0, 7.0, 0.0]
    assert backward == [4.5, 6.0, 14.0, 0.0]


def test_stage_compute_ms_names_missing_units():
    costs = load_costs(EXAMPLE)
    with pytest.raises(ConfigError, match=r"lack unit\(s\) t_dense, t_moe, which mixed needs"):
        stage_compute_ms(costs, MIXED, ("Ett", "ttL"))
    units = {"E": 1.0, "t": 10.0, "L": 38.0}
    no_mtp = replace(costs, forward_ms=units, backward_ms=units)
    with pytest.raises(ConfigError, match=r"lack unit\(s\) m, which handbook_7b_a1b needs"):
        stage_compute_ms(no_mtp, HANDBOOK.model, ("E" + "t" * 16, "mL"))


def test_step_tail_scales_with_the_parameters_one_gpu_holds():
    costs = load_costs(EXAMPLE)
    stages = stage_sizes(HANDBOOK.model, HANDBOOK.parallel, ("Ettttt", "tttttt", "ttttt", "mL"))
    for stage in stages:
        assert step_tail_ms(costs, stage) == pytest.approx(25.0 * stage.gpu_gigaparams)
    # TP splits the dense weights, so the same stage's tail shrinks.
    tp2 = replace(HANDBOOK.parallel, tp=2)
    first_tp2 = stage_sizes(HANDBOOK.model, tp2, ("Ettttt", "tttttt", "ttttt", "mL"))[0]
    assert step_tail_ms(costs, first_tp2) < step_tail_ms(costs, stages[0])


def test_costs_to_dict_is_plain_json():
    data = costs_to_dict(load_costs(EXAMPLE))
    assert next(iter(data)) == "format"
    # the example predates the fixed step tail: it loads as 0 and is written out
    assert "tail_fixed_ms" not in example_dict()
    assert data == {**example_dict(), "tail_fixed_ms": 0.0, "a2a_ms": 0.0}


def test_the_fixed_step_tail_is_added_to_every_rank():
    costs = replace(load_costs(EXAMPLE), tail_fixed_ms=7.5)
    assert costs_from_dict(costs_to_dict(costs), source="x") == costs
    with pytest.raises(ConfigError, match="tail_fixed_ms must be 0 or at least 1e-06 ms"):
        costs_from_dict({**costs_to_dict(costs), "tail_fixed_ms": -1.0}, source="x")
    stages = stage_sizes(HANDBOOK.model, HANDBOOK.parallel, ("Ettttt", "tttttt", "ttttt", "mL"))
    without = replace(costs, tail_fixed_ms=0.0)
    for stage in stages:
        assert step_tail_ms(costs, stage) == pytest.approx(step_tail_ms(without, stage) + 7.5)


def test_provenance_mismatches_name_each_difference():
    example = load_costs(EXAMPLE)  # records no CP or vocabulary: those are not checked
    assert provenance_mismatches(example, HANDBOOK.model, HANDBOOK.parallel) == []
    other = replace(example, model="llama-70b", micro_batch_size=8, seq_length=128, tp=8)
    assert provenance_mismatches(other, HANDBOOK.model, HANDBOOK.parallel) == [
        "model llama-70b (costs) vs handbook_7b_a1b (recipe)",
        "micro_batch_size 8 (costs) vs 2 (recipe)",
        "seq_length 128 (costs) vs 4096 (recipe)",
        "tp 8 (costs) vs 1 (recipe)",
    ]
    flops = costs_from_flops(HANDBOOK.model, HANDBOOK.parallel)
    assert (flops.cp, flops.vocab_size) == (1, 128256)
    small_vocab = replace(HANDBOOK.model, vocab_size=32000)
    cp2 = replace(HANDBOOK.parallel, cp=2)
    assert provenance_mismatches(flops, small_vocab, cp2) == [
        "cp 1 (costs) vs 2 (recipe)",
        "vocab_size 128256 (costs) vs 32000 (recipe)",
    ]
    round_trip = costs_from_dict(costs_to_dict(flops), source="test")
    assert round_trip == flops and "cp" not in costs_to_dict(example)


def test_a_fits_costs_are_moved_into_the_ranges_load_costs_accepts(tmp_path):
    """What ``fit -o`` writes always loads: a spread past the time is clipped (and said), a
    time under a nanosecond is none."""
    example = load_costs(EXAMPLE)
    unit = next(iter(example.forward_ms))
    wild = replace(
        example,
        jitter_cv={unit: 3.5},
        forward_ms={**example.forward_ms, unit: 1e-9},
        tail_fixed_ms=1e-12,
    )
    moved, warnings = within_bounds(wild)
    assert moved.jitter_cv == {unit: 1.0} and moved.forward_ms[unit] == 0.0
    assert moved.tail_fixed_ms == 0.0
    assert warnings == (
        f"jitter of {unit} clipped to 1 (a spread past the time itself: too few "
        "or too noisy intervals)",
    )
    save_costs(moved, tmp_path / "costs.json")
    assert load_costs(tmp_path / "costs.json") == moved
    assert within_bounds(example) == (example, ())


def test_a_fit_no_move_can_mend_is_a_measurement_error_not_a_file_that_will_not_load():
    example = load_costs(EXAMPLE)
    with pytest.raises(MeasurementError) as info:
        within_bounds(replace(example, p2p_inter_node_ms=2e6))
    assert str(info.value).startswith(
        "the fitted costs: p2p_inter_node_ms must be at most 600000 ms (Megatron's default"
    )
    assert str(info.value).endswith("got 2000000.0: the runs' timers cannot give that")


def test_implausible_costs_are_named_for_the_commands_to_warn_of():
    example = load_costs(EXAMPLE)
    assert costs_warnings(example) == ()
    absurd = replace(example, backward_ms={**example.backward_ms, "t": 1e5}, tail_fixed_ms=7.2e6)
    assert [line.split(" is ")[0] for line in costs_warnings(absurd)] == [
        "backward_ms.t",
        "backward_ms.t",
        "tail_fixed_ms",
    ]


def test_the_model_name_a_costs_file_gives_is_kept_printable(tmp_path):
    path = tmp_path / "costs.json"
    path.write_text(json.dumps(example_dict() | {"model": "evil\x1b[31m\rname"}))
    assert load_costs(path).model == "evil\\x1b[31m\\rname"
