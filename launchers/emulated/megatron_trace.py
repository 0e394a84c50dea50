"""One rank's order of work, recorded from megatron-core's own interleaved schedule.

``forward_backward_pipelining_with_interleaving`` is run for one PP rank with stubs for what
needs a GPU or a peer: the forward and backward steps record a :class:`Compute`, the
communicator records each p2p call (a blocking one, or with ``overlap_p2p_comm`` one that only
posts its isend/irecv) and hands back handles whose ``wait()`` records a :class:`Wait`.  The
overlapped order (receives waited just before the compute that needs them, a send waited when
the next one of its direction is posted) is then Megatron's by construction, not a reading of
it; the emulator follows it and the simulator's own version is tested against it.

With ``overlap_moe_expert_parallel_comm`` (combined 1F1B) Megatron's own
``combined_1f1b_schedule_for_interleaved_pipelining`` runs too; only the model chunk's schedule
plan (``TransformerModelChunkSchedulePlan.run``, which needs a GPTModel on a GPU) is replaced by
a stub that calls the p2p hooks where the plan calls them: ``pre_forward``, ``pre_backward``,
the merged forward and backward, ``post_forward``, ``post_backward``.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

from search.pipeline_ops import (
    BACKWARD,
    FORWARD,
    Compute,
    Op,
    P2PCall,
    ScheduleShape,
    Transfer,
    Wait,
)


class _Recorder:
    """The stub communicator: records calls, numbers each transfer's posts per kind."""

    def __init__(self, pp: int, rank: int, vpp: int, config: Any) -> None:
        self.pp_group = SimpleNamespace(size=lambda: pp, rank=lambda: rank)
        self.config = config
        self.virtual_pipeline_model_parallel_size = vpp
        self.ops: list[Op] = []
        self.posted: dict[str, int] = {}

    def _communicate(self, name: str, transfers: dict[str, bool], p2p_overlap: bool = False):
        kept = tuple(transfer for transfer, on in transfers.items() if on)
        self.ops.append(P2PCall(name, kept, blocking=not p2p_overlap))
        received = [
            ("received", t) if transfers.get(t) else None
            for t in (Transfer.RECV_PREV, Transfer.RECV_NEXT)
        ]
        if not p2p_overlap:
            return received
        handles = {}
        for transfer in kept:
            index = self.posted.get(transfer, 0)
            self.posted[transfer] = index + 1
            handles[transfer] = SimpleNamespace(
                wait=lambda t=transfer, i=index: self.ops.append(Wait(t, i))
            )
        return received, handles

    def recv_forward(self, tensor_shape, is_first_stage):
        if not is_first_stage:
            return self._communicate("recv_forward", {Transfer.RECV_PREV: True})[0]
        return None

    def recv_backward(self, tensor_shape, is_last_stage):
        if not is_last_stage:
            return self._communicate("recv_backward", {Transfer.RECV_NEXT: True})[1]
        return None

    def send_forward_recv_forward(
        self, output_tensor, recv_prev, tensor_shape, overlap_p2p_comm=False
    ):
        transfers = {Transfer.SEND_NEXT: output_tensor is not None, Transfer.RECV_PREV: recv_prev}
        result = self._communicate("send_forward_recv_forward", transfers, overlap_p2p_comm)
        return (result[0][0], result[1]) if overlap_p2p_comm else result[0]

    def send_backward_recv_backward(
        self, input_tensor_grad, recv_next, tensor_shape, overlap_p2p_comm=False
    ):
        transfers = {
            Transfer.SEND_PREV: input_tensor_grad is not None,
            Transfer.RECV_NEXT: recv_next,
        }
        result = self._communicate("send_backward_recv_backward", transfers, overlap_p2p_comm)
        return (result[0][1], result[1]) if overlap_p2p_comm else result[1]

    def send_forward_backward_recv_forward_backward(
        self, output_tensor, input_tensor_grad, recv_prev, recv_next, tensor_shape
    ):
        transfers = {
            Transfer.SEND_NEXT: output_tensor is not None,
            Transfer.SEND_PREV: input_tensor_grad is not None,
            Transfer.RECV_PREV: recv_prev,
            Transfer.RECV_NEXT: recv_next,
        }
        return tuple(self._communicate("send_forward_backward_recv_forward_backward", transfers))


def _plan_run(recorder: _Recorder):
    """``combined_forward_backward_step`` with the schedule plan's order of hooks and work
    (model_chunk_schedule_plan.py, ``TransformerModelChunkSchedulePlan.run``)."""

    def step(*args: Any, f_model_chunk_id=None, current_microbatch=None, **kwargs: Any):
        f_model, b_model, b_output_tensor = args[2], args[6], args[8]
        hooks = {
            name: kwargs.get(name)
            for name in ("pre_forward", "pre_backward", "post_forward", "post_backward")
        }
        forward = f_model is not None
        chunk = f_model_chunk_id or 0
        backward = b_output_tensor if b_model is not None else None
        if forward and hooks["pre_forward"]:
            hooks["pre_forward"](chunk)
        if backward and hooks["pre_backward"]:
            hooks["pre_backward"](backward[1])
        output = None
        if forward:
            recorder.ops.append(Compute(FORWARD, current_microbatch or 0, chunk))
            output = (current_microbatch or 0, chunk)
        if backward:
            recorder.ops.append(Compute(BACKWARD, *backward, merged=forward))
        if forward and hooks["post_forward"]:
            hooks["post_forward"](output, chunk)
        if backward and hooks["post_backward"]:
            hooks["post_backward"]("gradient", backward[1])
        return output, 0, "gradient" if backward else None

    return step


def _plan_stub(recorder: _Recorder) -> dict[str, Any]:
    """What ``combined_1f1b`` calls on a GPU, for the recorder: the merged step, no streams."""
    return {"combined_forward_backward_step": _plan_run(recorder), "set_streams": lambda: None}


@contextmanager
def _swapped(module: Any, swapped: dict[str, Any]) -> Iterator[None]:
    saved = {name: getattr(module, name) for name in swapped}
    try:
        for name, value in swapped.items():
            setattr(module, name, value)
        yield
    finally:
        for name, value in saved.items():
            setattr(module, name, value)


@contextmanager
def _stubbed(schedules: Any, recorder: _Recorder) -> Iterator[None]:
    """Swap the schedule modules' GPU work and stage tests for the recorder's, then restore."""
    import torch
    from megatron.core.pipeline_parallel import combined_1f1b

    def forward_step(*args: Any, current_microbatch: int, vp_stage: int, **kwargs: Any):
        recorder.ops.append(Compute(FORWARD, current_microbatch, vp_stage))
        return (current_microbatch, vp_stage), 0

    def backward_step(input_tensor, output_tensor, output_tensor_grad, model_type, config):
        recorder.ops.append(Compute(BACKWARD, *output_tensor))
        return "gradient"

    def zeros(*args: Any, device: Any = None, **kwargs: Any):  # the token count lives on a GPU
        return torch.zeros(*args, **kwargs)

    cpu_torch = SimpleNamespace(**{**vars(torch), "zeros": zeros})
    rank, size = recorder.pp_group.rank, recorder.pp_group.size
    swapped = {
        "forward_step": forward_step,
        "backward_step": backward_step,
        "is_pp_first_stage": lambda group: rank() == 0,
        "is_pp_last_stage": lambda group: rank() == size() - 1,
        "torch": cpu_torch,
    }
    with _swapped(schedules, swapped), _swapped(combined_1f1b, _plan_stub(recorder)):
        yield


def traced_program(shape: ScheduleShape, rank: int) -> list[Op]:
    """Rank ``rank``'s computations, p2p calls and waits as megatron-core's interleaved schedule
    (VPP > 1) issues them, with ``overlap_p2p_comm`` as ``shape.p2p_overlap`` (``batch_p2p_comm``
    its opposite, as Megatron-LM's arguments set it) and ``overlap_moe_expert_parallel_comm`` as
    ``shape.combined``."""
    pp, vpp = shape.pp, shape.vpp
    with warnings.catch_warnings():  # "Transformer Engine and Apex are not installed"
        warnings.simplefilter("ignore")
        import torch
        from megatron.core.enums import ModelType
        from megatron.core.pipeline_parallel import schedules
        from megatron.core.transformer.transformer_config import TransformerConfig

        config = TransformerConfig(
            num_layers=pp * vpp,
            hidden_size=8,
            num_attention_heads=1,
            pipeline_model_parallel_size=pp,
            virtual_pipeline_model_parallel_size=vpp,
            overlap_p2p_comm=shape.p2p_overlap,
            batch_p2p_comm=not shape.p2p_overlap,
            microbatch_group_size_per_vp_stage=shape.group_size,
            pipeline_dtype=torch.float32,
        )
    # set after construction: its checks want an EP > 1 MoE model, which the trace never builds
    config.overlap_moe_expert_parallel_comm = shape.combined
    chunks = []
    for _ in range(vpp):
        chunk = torch.nn.Module()
        chunk.config, chunk.model_type = config, ModelType.encoder_or_decoder
        chunks.append(chunk)
    recorder = _Recorder(pp, rank, vpp, config)
    single = SimpleNamespace(size=lambda: 1)
    groups = SimpleNamespace(tp=single, cp=single, embd=None, pos_embd=None, pp=None, dp_cp=None)
    groups.pp = recorder.pp_group
    with _stubbed(schedules, recorder):
        schedules.forward_backward_pipelining_with_interleaving(
            forward_step_func=None,
            data_iterator=[None] * vpp,
            model=chunks,
            num_microbatches=shape.num_microbatches,
            seq_length=1,
            micro_batch_size=1,
            p2p_communicator=recorder,
            pg_collection=groups,
        )
    return recorder.ops


def traced_no_pipelining(num_microbatches: int) -> list[Op]:
    """PP 1 with ``overlap_moe_expert_parallel_comm``: megatron-core's
    ``combined_1f1b_schedule_for_no_pipelining`` run with the schedule plan stubbed."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import torch
        from megatron.core.pipeline_parallel import combined_1f1b

    recorder = _Recorder(1, 0, 1, None)
    with _swapped(combined_1f1b, _plan_stub(recorder)):
        combined_1f1b.combined_1f1b_schedule_for_no_pipelining(
            None, None, torch.nn.Module(), num_microbatches, None, None, [], None,
            False, None, False, contextlib.nullcontext, torch.zeros([]), lambda first: first,
        )  # fmt: skip
    return recorder.ops
