"""``validate``: one layout string checked with Megatron's rules, and where it places MTP."""

from __future__ import annotations

import json

import pytest

from ray_layout.commands.main import main
from tests.helpers.commands_cli import run_json
from tests.helpers.megatron_layout_oracle import megatron_verdict

# DeepSeek-V3's shape on PP 16 x VPP 2 with MTP on PP rank 14's last chunk
DEEPSEEK_STANDALONE = ["validate", "Et*3|(tt|)*29,m|L", "--pp", "16", "--num-layers", "61",
                       "--mtp-layers", "1"]  # fmt: skip


def test_validate_reports_standalone_and_placement(capsys):
    untied = "--untie-embeddings-and-output-weights"  # as DeepSeek-V3 trains
    report = run_json(capsys, *DEEPSEEK_STANDALONE, untied)
    assert report["vpp"] == 2 and report["mtp_standalone"] is True
    assert report["layout"] == "Et*3|(tt|)*29m|L"
    report = run_json(capsys, "validate", "|Et|t|L", "--pp", "4", "--num-layers", "2")
    assert report["warnings"] and "E is not in stage 0" in report["warnings"][0]


@pytest.mark.parametrize(
    ("layout", "pp", "layers", "mtp"),
    [
        ("Et*5|t*6|t*5|mL", 4, 16, 1),
        ("Et*5|t*6|t*5m|L", 4, 16, 1),
        ("Et*4|t*4|t*4|t*4L", 4, 16, 1),
        ("Ett|tt|tt|ttL", 4, 8, 0),
        ("Et|t|t|t|t|tL", 3, 6, 0),
        ("Et*2|t*3|t*3|mL", 4, 9, 1),
        ("Et*2|t*3|t*3|mL", 4, 8, 1),
    ],
)
def test_the_verdict_is_megatron_cores(capsys, layout, pp, layers, mtp):
    accepted, standalone = megatron_verdict(layout, pp, layers, mtp)
    argv = ["validate", layout, "--pp", str(pp), "--num-layers", str(layers), "--mtp-layers"]
    code = main([*argv, str(mtp), "--json"])
    out, err = capsys.readouterr()
    assert code == (0 if accepted else 2), err
    if accepted:
        assert json.loads(out)["mtp_standalone"] == standalone
    else:
        assert err.startswith("error: ") and err.count("\n") == 1


def test_the_printed_verdict_shows_the_compact_form_and_the_standalone_cost(capsys):
    argv = ["validate", "Et,t,t,t,t|t*6|t*5m|L", "--pp", "4", "--num-layers", "16"]
    assert main([*argv, "--mtp-layers", "1"]) == 0
    out = capsys.readouterr().out
    assert "valid: Megatron accepts 'Et,t,t,t,t|t*6|t*5m|L' for 16 decoder + 1 MTP" in out
    assert "compact form: Et*5|t*6|t*5m|L" in out
    assert "MTP standalone: MTP sits on a rank before the last" in out


def test_interleaving_on_two_stages_needs_overlapping_p2p_as_megatrons_arguments_say(capsys):
    """Megatron's ``validate_args``, not its layout class (which takes it): PP 2 with VPP 2."""
    argv = ["validate", "Ett|tt|tt|ttL", "--pp", "2", "--num-layers", "8"]
    assert megatron_verdict("Ett|tt|tt|ttL", 2, 8, 0) == (True, False)
    assert run_json(capsys, *argv)["vpp"] == 2  # Megatron's default overlaps p2p
    assert main([*argv, "--no-overlap-p2p-communication"]) == 2
    err = capsys.readouterr().err
    assert "interleaved schedule (VPP=2) needs PP > 2" in err and err.count("\n") == 1


def test_a_layout_megatron_core_cannot_build_is_one_line(capsys):
    """Tied embeddings (Megatron's default), VPP 2 and MTP off the last rank: the build hangs."""
    assert main(DEEPSEEK_STANDALONE) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "does not build in megatron-core 0.16.1" in error
    assert "MTP on PP rank 14" in error
