"""A rank's order of work as megatron-core really ran it, for tests to hold against the emulator.

With ``RAY_LAYOUT_CORE_TRACE`` set to a folder, each rank records every forward (with its
virtual chunk), every backward and every p2p call (its sends and receives, named as
``_communicate``'s arguments) and writes them to ``rank<N>.json`` there when training ends.
:func:`program_signature` puts a program of the emulator's (``search.pipeline_ops`` ops) in the
same terms: a backward's chunk is not recorded here (megatron-core's ``backward_step`` is not
told it), and an overlapped call's waits are left out of both.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from search.pipeline_ops import BACKWARD, FORWARD, Compute, P2PCall

TRACE_ENV = "RAY_LAYOUT_CORE_TRACE"

# _communicate's arguments, each as the transfer it makes
_TRANSFERS = (
    ("tensor_send_next", "send_next"),
    ("tensor_send_prev", "send_prev"),
    ("recv_prev", "recv_prev"),
    ("recv_next", "recv_next"),
)

Signature = tuple[Any, ...]


def program_signature(program: Sequence[Any]) -> list[Signature]:
    """An emulator program as this trace records work: computes and p2p calls, in order."""
    signature: list[Signature] = []
    for op in program:
        if isinstance(op, Compute):
            chunk = op.chunk if op.kind == FORWARD else None
            signature.append(("compute", str(op.kind), chunk))
        elif isinstance(op, P2PCall):
            signature.append(("p2p", tuple(sorted(str(t) for t in op.transfers))))
    return signature


def call_transfers(kwargs: dict[str, Any]) -> tuple[str, ...]:
    """The transfers one ``_communicate`` call makes, sorted."""
    made = []
    for argument, transfer in _TRANSFERS:
        value = kwargs.get(argument)
        if (value is not None and argument.startswith("tensor")) or value is True:
            made.append(transfer)
    return tuple(sorted(made))


class OpTrace:
    """Records one rank's computes and p2p calls while it trains."""

    def __init__(self, chunks: Sequence[Any]) -> None:
        self.chunk_of = {id(chunk): index for index, chunk in enumerate(chunks)}
        self.ops: list[Signature] = []

    def forward(self, model: Any) -> None:
        self.ops.append(("compute", FORWARD, self.chunk_of.get(id(model))))

    def install(self) -> None:
        """Wrap megatron-core's ``backward_step`` and ``P2PCommunicator._communicate``."""
        from megatron.core.pipeline_parallel import schedules
        from megatron.core.pipeline_parallel.p2p_communication import P2PCommunicator

        backward_step: Callable[..., Any] = schedules.backward_step
        communicate: Callable[..., Any] = P2PCommunicator._communicate
        ops = self.ops

        def traced_backward(*args: Any, **kwargs: Any) -> Any:
            ops.append(("compute", BACKWARD, None))
            return backward_step(*args, **kwargs)

        def traced_communicate(communicator: Any, **kwargs: Any) -> Any:
            ops.append(("p2p", call_transfers(kwargs)))
            return communicate(communicator, **kwargs)

        schedules.backward_step = traced_backward
        P2PCommunicator._communicate = traced_communicate

    def write(self, folder: str | Path, rank: int) -> None:
        """The ops as JSON, ``rank<N>.json`` in ``folder``."""
        path = Path(folder) / f"rank{rank}.json"
        path.write_text(json.dumps(self.ops))


def read_trace(path: str | Path) -> list[Signature]:
    """A written trace, as tuples again."""
    return [
        tuple(tuple(x) if isinstance(x, list) else x for x in op)
        for op in json.loads(Path(path).read_text())
    ]
