"""The flag table of the cluster's Megatron: argparse help parsed back into the bundled table's
shape (round trip through a real argparse parser built from the bundled table), read on a worker
of the local Ray cluster from a fake ``pretrain_gpt.py``, cached in the store, and used to refuse
a flag that Megatron does not know before any run."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest

from ray_layout.errors import ConfigError, MeasurementError
from ray_layout.measure.store import CostStore
from ray_layout.model.megatron_args import _FLAG_TABLE, megatron_flag_table
from ray_layout.model.megatron_help_table import merge_with_bundled, parse_help
from ray_layout.runtime.layout_runs import MEGATRON, Backend
from ray_layout.runtime.megatron_help_probe import BUNDLED, cluster_flag_table, write_cache
from ray_layout.tuning.phases import check_cluster_flags
from ray_layout.tuning.settings import TuneSettings

NEW_FLAG, GONE_FLAG = "--brand-new-flag", "--moe-grouped-gemm"

# pretrain_gpt.py --help of a Megatron one version on: the bundled table's parser, one flag added
# and one removed.  argparse itself formats it.
FAKE_PRETRAIN_GPT = """\
import argparse, json, sys
parser = argparse.ArgumentParser(prog="pretrain_gpt.py")
for entry in json.load(open({table!r})):
    if {gone!r} in entry["flags"] or entry["dest"] == "help":
        continue
    options = {{"dest": entry["dest"]}}
    if entry["nargs"] == 0:
        options["action"] = "store_true"
    else:
        options.update(nargs=entry["nargs"], choices=entry["choices"])
    parser.add_argument(*entry["flags"], **options)
parser.add_argument({new!r}, type=int, nargs=2, help="new in this version " * 8)
parser.parse_args()
"""


def _bundled_parser(drop: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pretrain_gpt.py", add_help=False)
    for entry in json.loads(_FLAG_TABLE.read_text()):
        if drop in entry["flags"]:
            continue
        if entry["nargs"] == 0:
            parser.add_argument(*entry["flags"], dest=entry["dest"], action="store_true")
        else:
            parser.add_argument(*entry["flags"], dest=entry["dest"], nargs=entry["nargs"],
                                choices=entry["choices"], help="some words " * 20)  # fmt: skip
    return parser


@pytest.mark.parametrize("columns", ["60", "1000"])
def test_help_of_the_bundled_table_parses_back_to_it(monkeypatch, columns):
    monkeypatch.setenv("COLUMNS", columns)  # narrow: help text wraps, invocations on own lines
    bundled = megatron_flag_table()
    table = merge_with_bundled(parse_help(_bundled_parser().format_help()), bundled)
    assert table.keys() == bundled.keys()
    assert all(table[flag] is bundled[flag] for flag in bundled)


def test_help_entries_carry_arity_choices_and_dest():
    parser = argparse.ArgumentParser(prog="pretrain_gpt.py")
    parser.add_argument("--pair", type=int, nargs=2)
    parser.add_argument("--maybe", nargs="?")
    parser.add_argument("--any", nargs="*")
    parser.add_argument("--some", nargs="+")
    parser.add_argument("--one", nargs=1)
    parser.add_argument("--pick", choices=["round-robin", "one-by-one"])
    parser.add_argument("--fused", action=argparse.BooleanOptionalAction)
    entries = {e["flags"][0]: e for e in parse_help(parser.format_help())}
    assert {flag: e["nargs"] for flag, e in entries.items()} == {
        "-h": 0, "--pair": 2, "--maybe": "?", "--any": "*", "--some": "+", "--one": None,
        "--pick": None, "--fused": 0,
    }  # fmt: skip
    assert entries["-h"]["flags"] == ["-h", "--help"] and entries["-h"]["dest"] == "help"
    assert entries["--fused"]["flags"] == ["--fused", "--no-fused"]
    assert entries["--pick"]["choices"] == ["round-robin", "one-by-one"]
    assert entries["--pair"]["dest"] == "pair" and entries["--pair"]["type"] is None


# Lines of core_v0.16.1's own `pretrain_gpt.py --help` (COLUMNS=1000), help texts cut short.
MEGATRON_HELP = """\
usage: pretrain_gpt.py [-h] [--tensor-model-parallel-size TENSOR_MODEL_PARALLEL_SIZE]
                       [--cross-entropy-fusion-impl {native,te}] [--tp-comm-bootstrap-backend {nccl,mpi,gloo}]

options:
  -h, --help            show this help message and exit

transformer configuration:
  --attention-backend {AttnBackend.flash,AttnBackend.fused,AttnBackend.unfused,AttnBackend.local,AttnBackend.auto}
                        Attention backend to run. By default we let transformer engine decide
  --softmax-type {vanilla,off-by-one,learnable}
                        Applies modified softmax from https://www.evanmiller.org/attention-is-off-by-one.html.
  --recompute-modules RECOMPUTE_MODULES [RECOMPUTE_MODULES ...]
                        The submodules to recompute. choices: "core_attn", "moe_act", "layernorm",
  --moe-router-dtype {fp32,fp64}
                        Data type for routing and expert output weighted averaging.
  --inference-wandb-logging, --no-inference-wandb-logging
                        Enable inference wandb logging.
  --spec [SPEC ...]     Specify the <module_location function_name> pair that returns a spec
  --hybrid-attention-ratio HYBRID_ATTENTION_RATIO
"""  # noqa: E501


def test_megatron_help_parses_to_the_bundled_entries():
    """Every option of the real help keeps its bundled entry (same option strings and arity);
    with the whole help (tried by hand) all but one flag do: ``--disable-chunked-prefill`` is
    hidden from help (``help=argparse.SUPPRESS``), so it counts as unknown."""
    bundled = megatron_flag_table()
    table = merge_with_bundled(parse_help(MEGATRON_HELP), bundled)
    assert len(table) == 10 and all(table[flag] is bundled[flag] for flag in table)
    assert "--tensor-model-parallel-size" not in table  # the usage lines are not options


def _backend(folder: Path) -> Backend:
    return Backend(MEGATRON, megatron_path=folder, python=sys.executable)


def test_the_cluster_table_is_read_on_a_worker_cached_and_checks_flags(ray_cluster, tmp_path):
    megatron = tmp_path / "megatron"
    megatron.mkdir()
    script = megatron / "pretrain_gpt.py"
    script.write_text(
        FAKE_PRETRAIN_GPT.format(table=str(_FLAG_TABLE), gone=GONE_FLAG, new=NEW_FLAG)
    )
    store = CostStore(tmp_path / "store")
    flags = cluster_flag_table(_backend(megatron), store, "s1")
    assert flags.note is None and flags.source != BUNDLED
    assert flags.flags[NEW_FLAG]["nargs"] == 2 and GONE_FLAG not in flags.flags
    assert store.megatron_flags_path("s1").is_file()

    script.unlink()  # the second call of the study reads the store, not the worker
    again = cluster_flag_table(_backend(megatron), store, "s1")
    assert again.flags.keys() == flags.flags.keys() and again.note is None

    settings = TuneSettings(_backend(megatron), store.root, "s1", None, tmp_path, 4)
    said: list[str] = []
    phases = type("Phases", (), {"say": staticmethod(said.append)})()
    check_cluster_flags([[NEW_FLAG, "1", "2"], ["--num-layers", "4"]], settings, store, phases)
    with pytest.raises(ConfigError) as refused:
        check_cluster_flags([["--num-layers", "4"], [GONE_FLAG]], settings, store, phases)
    message = str(refused.value)
    assert "\n" not in message and message.endswith(f"unknown Megatron flag {GONE_FLAG}")
    assert "pretrain_gpt.py" in message and said == []


def test_without_a_help_the_bundled_table_stands_in_with_a_note(ray_cluster, tmp_path):
    store = CostStore(tmp_path / "store")
    flags = cluster_flag_table(_backend(tmp_path / "nowhere"), store, "s2")
    assert flags.flags is megatron_flag_table() and flags.source == BUNDLED
    assert flags.note and "\n" not in flags.note and BUNDLED in flags.note
    assert not store.megatron_flags_path("s2").exists()  # a failed probe is retried next time


def test_the_cached_table_is_written_whole_or_refused_in_one_line(tmp_path):
    path = tmp_path / "store" / "_megatron_flags" / "s.json"
    write_cache(path, {"command": "python pretrain_gpt.py", "entries": {}})
    assert json.loads(path.read_text())["command"] == "python pretrain_gpt.py"
    assert [p.name for p in path.parent.iterdir()] == ["s.json"]  # no temporary file left
    path.unlink()
    path.mkdir()  # a folder where the cache goes
    with pytest.raises(MeasurementError) as refused:
        write_cache(path, {"command": "x", "entries": {}})
    message = str(refused.value)
    assert "\n" not in message and str(path) in message and "remove it" in message
    assert [p.name for p in path.parent.iterdir()] == ["s.json"]
