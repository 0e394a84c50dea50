"""The CUDA-only calls of megatron-core 0.16.1, adapted so that its training path runs on CPU.

Applied by the megatron-core rank program only, never in the tuner's own process: each
adaptation replaces one CUDA-only call with its CPU meaning, names it and says why.  The set is
known for one megatron-core version; any other version is refused with a one-line error, since
a call that moved or was fixed upstream would be patched blindly.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ray_layout.errors import ConfigError

KNOWN_VERSIONS = frozenset({"0.16.1"})


@dataclass(frozen=True)
class Adaptation:
    """One CUDA-only call and its CPU stand-in."""

    name: str
    reason: str
    apply: Callable[[], None]


class _NoStream:
    """A CUDA stream on a machine without one: work is already ordered on the CPU."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def wait_stream(self, stream: Any) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def record_event(self, event: Any = None) -> Any:
        return event if event is not None else _NoStream()


_THE_STREAM = _NoStream()


class _CpuTorch:
    """``torch`` as a module that hard-codes ``device="cuda"`` sees it: the same, on the CPU."""

    def __init__(self, torch: Any) -> None:
        self._torch = torch

    def __getattr__(self, name: str) -> Any:
        return getattr(self._torch, name)

    def zeros(self, *args: Any, device: Any = None, **kwargs: Any) -> Any:
        return self._torch.zeros(*args, device=_cpu(device), **kwargs)

    def tensor(self, *args: Any, device: Any = None, **kwargs: Any) -> Any:
        return self._torch.tensor(*args, device=_cpu(device), **kwargs)


def _cpu(device: Any) -> Any:
    return "cpu" if device == "cuda" or str(device).startswith("cuda") else device


def _current_device() -> None:
    import torch

    torch.cuda.current_device = lambda: "cpu"


def _synchronize() -> None:
    import torch

    torch.cuda.synchronize = lambda device=None: None


def _hard_coded_cuda_zeros() -> None:
    import torch
    from megatron.core import utils
    from megatron.core.optimizer import clip_grads, optimizer
    from megatron.core.pipeline_parallel import schedules
    from megatron.core.transformer.moe import moe_utils

    for module in (schedules, moe_utils, optimizer, clip_grads, utils):
        module.torch = _CpuTorch(torch)


def _rng_fork() -> None:
    from megatron.core.tensor_parallel import random

    def fork(self: Any, name: str = "model-parallel-rng") -> Any:
        return contextlib.nullcontext()

    random.CudaRNGStatesTracker.fork = fork


def _recompute_rng_states() -> None:
    import torch
    from megatron.core.tensor_parallel import random

    def get_states() -> tuple[Any, None, dict[str, Any]]:
        return torch.get_rng_state(), None, random.get_cuda_rng_tracker().get_states()

    def set_states(cpu_state: Any, cuda_state: None, tracker_states: dict[str, Any]) -> None:
        torch.set_rng_state(cpu_state)
        random.get_cuda_rng_tracker().set_states(tracker_states)

    random._get_all_rng_states = get_states
    random._set_all_rng_states = set_states


def _checkpoint_without_output_fp8() -> None:
    from megatron.core.tensor_parallel import random

    init = random.CheckpointWithoutOutput.__init__

    def without_fp8_unless_asked(self: Any, fp8: Any = False) -> None:
        init(self, fp8)
        self.fp8 = fp8 is not None and fp8 is not False

    random.CheckpointWithoutOutput.__init__ = without_fp8_unless_asked


def _te_general_gemm() -> None:
    from megatron.core.transformer.moe import moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None


def _streams() -> None:
    import torch

    torch.cuda.Stream = _NoStream
    torch.cuda.current_stream = lambda device=None: _THE_STREAM
    torch.cuda.stream = lambda stream=None: contextlib.nullcontext()
    torch.Tensor.record_stream = lambda self, stream: None


def _split_sizes_as_lists() -> None:
    import torch
    import torch.distributed as dist

    all_to_all_single = dist.all_to_all_single

    def listed(sizes: Any) -> Any:
        return sizes.tolist() if torch.is_tensor(sizes) or hasattr(sizes, "tolist") else sizes

    def with_lists(output: Any, input: Any, output_split_sizes: Any = None, **kw: Any) -> Any:
        kw["input_split_sizes"] = listed(kw.get("input_split_sizes"))
        return all_to_all_single(output, input, listed(output_split_sizes), **kw)

    dist.all_to_all_single = with_lists


def _tensor_cuda() -> None:
    import torch

    torch.Tensor.cuda = lambda self, *args, **kwargs: self


ADAPTATIONS = (
    Adaptation(
        "current-device",
        "torch.cuda.current_device() is used as the device of new buffers (p2p shapes, routers, "
        "MTP, grad buffers): the CPU is the device",
        _current_device,
    ),
    Adaptation(
        "synchronize",
        "torch.cuda.synchronize() follows batched p2p and every timer start and stop: CPU work "
        "is synchronous, so it is a no-op",
        _synchronize,
    ),
    Adaptation(
        "cuda-zeros",
        "the schedules, the MoE loss tracker and the optimizer build torch.zeros or torch.tensor "
        'with device="cuda" (token counts, aux losses, loss scale, the local l2-norm kernel) '
        "built on the CPU",
        _hard_coded_cuda_zeros,
    ),
    Adaptation(
        "rng-fork",
        "the CUDA RNG tracker's fork() saves and restores CUDA generator state (expert "
        "initialization, dropout): without CUDA there is no state to fork",
        _rng_fork,
    ),
    Adaptation(
        "recompute-rng-states",
        "activation recompute (tensor_parallel.random's CheckpointFunction and "
        "CheckpointWithoutOutput) saves the RNG states before a checkpointed forward and restores "
        "them around its re-run with _get_all_rng_states/_set_all_rng_states, which read the CUDA "
        "generator: the CPU generator's state and the tracker's are saved and restored, so a "
        "re-run forward draws the dropout masks of the first",
        _recompute_rng_states,
    ),
    Adaptation(
        "checkpoint-without-output-fp8",
        "CheckpointWithoutOutput() (layernorm recompute) takes its default fp8=False for fp8 on "
        "(it tests fp8 is not None) and then reads Transformer Engine's FP8GlobalStateManager, "
        "undefined without TE: False means no fp8",
        _checkpoint_without_output_fp8,
    ),
    Adaptation(
        "te-general-gemm",
        "moe_utils reads te_general_gemm, which is only defined when Transformer Engine imports "
        "(fixed upstream): undefined means None",
        _te_general_gemm,
    ),
    Adaptation(
        "streams",
        "the alltoall dispatcher moves split sizes to the host on a CUDA side stream with events: "
        "on the CPU the stream is the one the work runs on",
        _streams,
    ),
    Adaptation(
        "split-sizes",
        "the alltoall dispatcher passes all_to_all_single its split sizes as tensors, which gloo "
        "refuses: passed as lists",
        _split_sizes_as_lists,
    ),
    Adaptation(
        "tensor-cuda",
        "the shared embedding weight (tied embeddings) is moved with .cuda() before its "
        "first/last-stage all-reduce: it stays on the CPU",
        _tensor_cuda,
    ),
)


def check_version(version: str) -> None:
    """Refuse a megatron-core whose CUDA-only calls this module does not know."""
    if version not in KNOWN_VERSIONS:
        raise ConfigError(
            f"megatron-core {version} is not supported by the CPU backend (its adaptations are "
            f"for {', '.join(sorted(KNOWN_VERSIONS))})"
        )


def megatron_core_version() -> str:
    """The installed megatron-core's version (a one-line error when it is missing)."""
    try:
        import megatron.core
    except ImportError as error:
        raise ConfigError(
            f"the megatron-core backend needs megatron-core installed on every node ({error})"
        ) from None
    return str(megatron.core.__version__)


@contextlib.contextmanager
def _quiet_imports() -> Iterator[None]:
    """megatron-core warns at import that Transformer Engine and Apex are missing: known here."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def apply_adaptations() -> tuple[str, ...]:
    """Check the version, then apply every adaptation; the names applied, in order."""
    with _quiet_imports():
        check_version(megatron_core_version())
        for adaptation in ADAPTATIONS:
            adaptation.apply()
    return tuple(adaptation.name for adaptation in ADAPTATIONS)
