"""The out-of-memory line: PyTorch's own wording and sizes, one line, for a rank whose modelled
peak passes the profile's HBM; the failing allocation is one more micro-batch's activations."""

from __future__ import annotations

from launchers.emulated.oom import fits, out_of_memory_message
from launchers.emulated.rank_costs import RankCosts
from ray_layout.model.sizing import GIB
from search.memory import StageMemory


def rank(held: int, activations_gib: float = 40.0, logits_gib: float = 4.0) -> RankCosts:
    """A rank of 10 + 10 + 20 GiB of weights, gradients and optimizer state, 3 GiB overhead."""
    memory = StageMemory(
        pp_rank=3,
        weights=10 * GIB,
        gradients=10 * GIB,
        optimizer=20 * GIB,
        activations=activations_gib * GIB,
        logits=logits_gib * GIB,
        overhead=3 * GIB,
    )
    return RankCosts((1.0,), (2.0,), 0.5, 0.5, memory, held)


def test_a_peak_fits_up_to_the_hbm_itself():
    assert fits(rank(4), 87.0) and not fits(rank(4), 86.99)


def test_the_line_is_pytorchs_with_one_more_micro_batch_as_the_failed_allocation():
    """87 GiB modelled on 80: 11 GiB (44 GiB of activations and logits over 4 micro-batches)
    fail with 76 GiB in use, 73 of it reserved by PyTorch (the rest is the CUDA context)."""
    line = out_of_memory_message(rank(4), 80.0, device=2)
    assert "\n" not in line
    assert line.startswith(
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 11.00 GiB. GPU 2 has a "
        "total capacity of 80.00 GiB of which 4.00 GiB is free. Including non-PyTorch memory, "
        "this process has 76.00 GiB memory in use. Of the allocated memory 69.52 GiB is "
        "allocated by PyTorch, and 3.48 GiB is reserved by PyTorch but unallocated."
    )
    assert line.endswith("(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)")


def test_with_nothing_in_flight_the_optimizer_state_fails_and_small_sizes_are_mib():
    assert "Tried to allocate 20.00 GiB." in out_of_memory_message(rank(0), 30.0, 0)
    small = out_of_memory_message(rank(1, activations_gib=0.5, logits_gib=0.0), 40.0, 0)
    assert "Tried to allocate 512.00 MiB." in small
    assert "of which 0.00 MiB is free" in small  # in use is capped at the capacity
