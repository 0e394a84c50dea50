"""The order of work per rank: megatron-core's real schedule on real ranks (traced) against the
emulator's program for the same pipeline, each the other's oracle (1F1B and VPP 2)."""

from __future__ import annotations

import pytest

from launchers.emulated.config import run_config
from launchers.emulated.rank_order import pipeline_programs
from launchers.megatron_core.op_trace import (
    TRACE_ENV,
    call_transfers,
    program_signature,
    read_trace,
)
from ray_layout.model.layout import Layout
from search.pipeline_ops import BACKWARD, FORWARD, Compute, P2PCall
from tests.helpers.megatron_core_ranks import core_arguments, run_ranks


def test_a_call_names_its_transfers_as_communicate_does():
    kwargs = {"tensor_send_next": object(), "tensor_send_prev": None, "recv_prev": False,
              "recv_next": True}  # fmt: skip
    assert call_transfers(kwargs) == ("recv_next", "send_next")


def test_an_emulator_program_in_trace_terms():
    program = [Compute(FORWARD, 0, 1), P2PCall("send_forward", ("send_next",)),
               Compute(BACKWARD, 0, 1)]  # fmt: skip
    assert program_signature(program) == [
        ("compute", "F", 1),
        ("p2p", ("send_next",)),
        ("compute", "B", None),
    ]


@pytest.mark.slow
@pytest.mark.megatron
@pytest.mark.parametrize("text", ["Ett|t*2mL", "Et|tt|t|mL"], ids=["1f1b", "vpp2"])
def test_megatron_core_and_the_emulator_agree_on_each_ranks_order(tmp_path, monkeypatch, text):
    layout = Layout.parse(text, 2)
    argv = core_arguments(layout, iterations=1)
    run = run_config(argv, world_size=2)
    traces = tmp_path / "traces"
    traces.mkdir()
    monkeypatch.setenv(TRACE_ENV, str(traces))
    outputs = run_ranks(argv, 2, tmp_path)
    assert all(output.returncode == 0 for output in outputs), outputs[-1].stderr[-2000:]
    programs = pipeline_programs(run.schedule_shape)
    for rank in range(2):
        assert read_trace(traces / f"rank{rank}.json") == program_signature(programs[rank])
