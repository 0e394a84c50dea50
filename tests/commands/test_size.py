"""``size``: parameters, FLOPs and static memory per unit and per stage, printed and as JSON."""

from __future__ import annotations

from pathlib import Path

import pytest

from ray_layout.commands.main import main
from tests.helpers.commands_cli import DEEPSEEK, HANDBOOK, run_json


def test_size_prints_the_handbook_counts(capsys):
    assert main(["size", HANDBOOK, "--pp", "4"]) == 0
    out = capsys.readouterr().out
    assert "6.86B total, 1.22B active" in out
    assert "MTP layers 0.42B" in out
    assert "Et*4|t*4|t*4|t*4mL" in out and "Megatron default" in out


def test_size_json_has_units_and_default_stages(capsys):
    report = run_json(capsys, "size", HANDBOOK, "--pp", "4", "--ep", "4", "--dp", "4")
    assert report["parallel"]["ep"] == 4 and report["parallel"]["dp"] == 4
    assert [u["unit"] for u in report["units"]] == ["E", "t", "m", "L"]
    assert [s["units"] for s in report["stages"]] == ["Etttt", "tttt", "tttt", "ttttmL"]
    last, middle = report["stages"][3], report["stages"][1]
    assert last["forward_gflops_per_microbatch"] > 3 * middle["forward_gflops_per_microbatch"]


def test_size_of_a_given_layout_and_of_a_model_without_default(capsys):
    report = run_json(capsys, "size", HANDBOOK, "--pp", "4", "--layout", "Et*5|t*6|t*5|mL")
    assert report["layout"] == "Et*5|t*6|t*5|mL" and report["layout_source"] == "given"
    report = run_json(capsys, "size", DEEPSEEK, "--pp", "16", "--ep", "8", "--dp", "8")
    assert report["layout_source"].startswith("count-based rule")
    assert round(report["parameters"]["total"] / 1e9) == 671


def test_seq_length_override_scales_attention_flops(capsys):
    short = run_json(capsys, "size", HANDBOOK, "--seq-length", "1024")
    long = run_json(capsys, "size", HANDBOOK, "--seq-length", "2048")
    assert long["units"][1]["forward_gflops_per_microbatch"] > (
        2 * short["units"][1]["forward_gflops_per_microbatch"]
    )


def test_stage_memory_is_its_weights_gradients_and_optimizer_and_the_units_add_up(capsys):
    report = run_json(capsys, "size", HANDBOOK, "--pp", "4", "--layout", "Et*5|t*6|t*5|mL")
    units = {row["unit"]: row for row in report["units"]}
    for stage in report["stages"]:
        parts = stage["weights_gib"] + stage["gradients_gib"] + stage["optimizer_gib"]
        assert stage["static_memory_gib"] == pytest.approx(parts)
        units_params = sum(units[unit]["params"] for unit in stage["units"])
        assert stage["params"] == pytest.approx(units_params, rel=1e-5)  # a final norm at most
    assert units["t"]["flops_vs_decoder_layer"] == 1.0  # the yardstick is one decoder layer


def test_a_fallback_layout_is_named_with_why_the_default_was_passed_over(capsys):
    assert main(["size", DEEPSEEK, "--pp", "16", "--ep", "8", "--dp", "8"]) == 0
    out = capsys.readouterr().out
    assert "(count-based rule)" in out  # the table's title names the source alone
    assert "Megatron has no default split: 61 decoder layers" in out  # why: the caption


def test_size_names_both_active_conventions_in_text_and_json(capsys):
    assert main(["size", DEEPSEEK, "--pp", "1"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "37.55B active parameters" in out  # with embedding and output layer
    assert "active without embedding and output layer 35.70B (as GLM and MiniMax count)" in out
    assert "without the input embedding 36.63B (as gpt-oss counts)" in out
    counts = run_json(capsys, "size", DEEPSEEK, "--pp", "1")["parameters"]
    assert counts["active"] - counts["active_without_embedding_and_output"] == (
        counts["embedding"] + counts["output_layer"]
    )
    assert counts["active"] - counts["active_without_input_embedding"] == counts["embedding"]


def test_static_memory_follows_the_jobs_optimizer_flags(capsys, tmp_path):
    """bf16 Adam moments under the precision-aware optimizer: 2 + 2 bytes, and the main copy
    only the 2-byte remainder of bf16 parameters (distrib_optimizer.py's
    store_param_remainders): 6 of the 12 optimizer bytes per parameter, as plan counts them."""
    plain = run_json(capsys, "size", HANDBOOK)
    config = tmp_path / "bf16_moments.yaml"
    config.write_text(
        Path(HANDBOOK).read_text() + "\nmegatron_args: [--use-precision-aware-optimizer, "
        "--exp-avg-dtype, bf16, --exp-avg-sq-dtype, bf16]\n"
    )
    lean = run_json(capsys, "size", str(config))
    for before, after in zip(plain["stages"], lean["stages"], strict=True):
        assert after["optimizer_gib"] == pytest.approx(before["optimizer_gib"] * 6 / 12)
        assert after["weights_gib"] == before["weights_gib"]
