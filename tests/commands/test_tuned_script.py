"""``--write-script OUT``: the user's launch script back with only its split changed to the pick,
read back before it is written, written whole or not at all, with the original's mode.
(The rewrite itself: tests/model/test_script_rewrite.py.)"""

from __future__ import annotations

import os
import stat
from dataclasses import replace
from pathlib import Path

import pytest

from ray_layout.commands import tuned_script
from ray_layout.commands.common import ModelSettings
from ray_layout.commands.tuned_script import comment_line, write_tuned_script
from ray_layout.errors import ConfigError
from ray_layout.model.layout import Layout
from ray_layout.model.loading import load_recipe
from tests.helpers.commands_cli import HANDBOOK, SCRIPT

PICK = Layout.parse("Et*5|t*6|t*5|mL", 4)
COMMENT = comment_line("plan", PICK, 1.2, "default")


@pytest.fixture
def script(tmp_path: Path) -> Path:
    """The test launch script, copied with a mode of its own (executable, group-readable)."""
    copy = tmp_path / "train.sh"
    copy.write_text(Path(SCRIPT).read_text())
    copy.chmod(0o550)
    return copy


def test_the_comment_says_where_the_layout_came_from_and_what_it_buys():
    assert COMMENT == (
        "ray_layout plan: --pipeline-model-parallel-layout Et*5|t*6|t*5|mL, "
        "predicted 1.20x over default"
    )
    measured = comment_line("tune, study s", PICK, 1.07, "current", "measured")
    assert measured.endswith("Et*5|t*6|t*5|mL, measured 1.07x over current")
    assert comment_line("plan", PICK, None, "default").endswith("layout Et*5|t*6|t*5|mL")


def test_the_written_script_runs_the_pick_and_nothing_else_changes(script, tmp_path):
    out = tmp_path / "tuned.sh"
    write_tuned_script(ModelSettings(config=str(script)), str(out), PICK, COMMENT)
    original, written = load_recipe(str(script)), load_recipe(str(out))
    assert written.split.layout == str(PICK)
    assert written.model == replace(original.model, name="tuned")  # named after its file
    # the pick's VPP: the script's own --num-virtual-stages-per-pipeline-rank 2 is dropped
    assert written.parallel == replace(original.parallel, vpp=1)
    assert out.read_text().splitlines()[1] == f"# {COMMENT}"
    assert stat.S_IMODE(out.stat().st_mode) == 0o550 | 0o200  # its owner may edit it again
    assert script.read_text() == Path(SCRIPT).read_text()  # the original is untouched


def test_a_config_that_is_no_script_is_refused():
    with pytest.raises(ConfigError, match="needs a launch script or model file as CONFIG, not"):
        write_tuned_script(ModelSettings(config=HANDBOOK), "out.sh", PICK, COMMENT)


def test_a_run_log_is_no_script_to_write_back(tmp_path):
    log = tmp_path / "run.log"
    log.write_text("------------------------ arguments ------------------------\n")
    with pytest.raises(ConfigError, match=r"not the run log .*: paste the flag into the script"):
        write_tuned_script(ModelSettings(config=str(log)), "out.sh", PICK, COMMENT)


def test_a_script_that_does_not_read_back_as_the_pick_is_not_written(script, tmp_path, monkeypatch):
    monkeypatch.setattr(tuned_script, "current_layout", lambda *args, **kwargs: None)
    out = tmp_path / "tuned.sh"
    with pytest.raises(
        ConfigError, match=r"reads back as None, not Et\*5\|t\*6\|t\*5\|mL; nothing"
    ):
        write_tuned_script(ModelSettings(config=str(script)), str(out), PICK, COMMENT)
    assert not out.exists()


def test_a_file_it_cannot_write_is_one_error_and_leaves_nothing_behind(script, tmp_path):
    out = tmp_path / "gone" / "tuned.sh"
    with pytest.raises(ConfigError, match=f"^--write-script {out}: cannot write \\("):
        write_tuned_script(ModelSettings(config=str(script)), str(out), PICK, COMMENT)
    assert os.listdir(tmp_path) == ["train.sh"]


def test_an_existing_file_is_replaced_whole(script, tmp_path):
    out = tmp_path / "tuned.sh"
    out.write_text("old\n")
    write_tuned_script(ModelSettings(config=str(script)), str(out), PICK, COMMENT)
    assert "old" not in out.read_text() and sorted(os.listdir(tmp_path)) == ["train.sh", "tuned.sh"]
