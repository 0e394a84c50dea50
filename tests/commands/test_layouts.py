"""``layouts``: count, or list, the layouts Megatron accepts for the config's layers and PP."""

from __future__ import annotations

from ray_layout.commands.main import main
from tests.helpers.commands_cli import HANDBOOK, run_json
from tests.helpers.megatron_layout_oracle import megatron_verdict


def test_layouts_count_and_list(capsys):
    counted = run_json(capsys, "layouts", HANDBOOK, "--pp", "4", "--count")
    assert counted == {"valid": 816, "mtp_standalone": 136, "in_space": 680, "layouts": []}
    listed = run_json(capsys, "layouts", HANDBOOK, "--pp", "4", "--limit", "1000")
    assert len(listed["layouts"]) == 680 and "Et*5|t*6|t*5|mL" in listed["layouts"]
    wide = run_json(
        capsys,
        "layouts",
        HANDBOOK,
        "--pp",
        "4",
        "--allow-empty-stages",
        "--allow-standalone-mtp",
        "--count",
    )
    assert wide["in_space"] == 1140


def test_every_listed_layout_is_one_megatron_core_accepts(capsys):
    """The oracle: megatron-core's own layout parser takes each, and agrees on MTP standalone."""
    kept = run_json(
        capsys, "layouts", HANDBOOK, "--pp", "4", "--allow-standalone-mtp", "--limit", "1000"
    )
    assert len(kept["layouts"]) == kept["in_space"] == kept["valid"] == 816
    verdicts = [megatron_verdict(text, 4, 16, 1) for text in kept["layouts"]]
    assert all(accepted for accepted, _ in verdicts)
    assert sum(bool(standalone) for _, standalone in verdicts) == kept["mtp_standalone"]
    plain = run_json(capsys, "layouts", HANDBOOK, "--pp", "4", "--limit", "1000")
    assert not any(megatron_verdict(text, 4, 16, 1)[1] for text in plain["layouts"])


def test_the_listing_says_what_it_counted_and_how_many_it_left_out(capsys):
    assert main(["layouts", HANDBOOK, "--pp", "4", "--limit", "3"]) == 0
    out = capsys.readouterr().out
    *_, first, second, third, more = out.splitlines()
    assert " ".join(out.split()).startswith(  # the summary wraps at the terminal's width
        "816 valid layouts for 16 decoder + 1 MTP layers on PP=4 VPP=1, every stage non-empty; "
        "136 of them MTP-standalone (left out, 680 remain; --allow-standalone-mtp keeps them)"
    )
    assert [first, second, third] == ["E|t|t|t*14mL", "E|t|tt|t*13mL", "E|t|t*3|t*12mL"]
    assert more == "... 677 more (--limit N)"


def test_count_and_a_zero_limit_list_nothing(capsys):
    for flag in ("--count", "--limit=0"):
        assert main(["layouts", HANDBOOK, "--pp", "4", "--allow-standalone-mtp", flag]) == 0
        out = capsys.readouterr().out
        assert out.count("\n") == 1 and "(kept)" in out
