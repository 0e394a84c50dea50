"""The parts of a FLOP guess that move bytes rather than compute: the embedding's memory traffic
and a MoE layer's EP all-to-alls, as milliseconds at given bandwidths."""

from __future__ import annotations

from ray_layout.model.fields import ModelSpec
from ray_layout.model.layout import EMBEDDING
from ray_layout.model.sizing import GRAD_BYTES, WEIGHT_BYTES, unit_sizes
from ray_layout.model.spec import ParallelConfig

HBM_GB_PER_S = 3000.0  # achieved HBM bandwidth per GPU for the memory-bound parts of a guess
# Bytes the embedding's backward moves per element of its (TP-sharded) table each micro-batch:
# PyTorch's dense embedding gradient is zero-filled (2) and read (2) by Megatron's hook, which
# adds it into the fp32 main gradient (read 4, write 4).
EMBEDDING_GRAD_BYTES_MOVED = 2 * WEIGHT_BYTES + 2 * GRAD_BYTES


def a2a_ms(
    model: ModelSpec,
    parallel: ParallelConfig,
    intra_node_gb_per_s: float,
    inter_node_gb_per_s: float,
    gpus_per_node: int = 8,
) -> float:
    """One dispatch (or combine) all-to-all of a MoE layer per micro-batch: each GPU's
    ``b x s / (TP x CP)`` tokens go to their top-k experts as bf16 rows, all but the 1/EP kept
    at home, over the node's links for peers on the node and the network for the rest (ranks
    run tp-cp-ep-dp-pp, so an EP group spans TP x CP x EP consecutive ranks)."""
    ep = parallel.ep
    if ep < 2 or not model.num_moe_layers:
        return 0.0
    tokens = parallel.micro_batch_size * model.seq_length / (parallel.tp * parallel.cp)
    sent = WEIGHT_BYTES * tokens * model.moe_router_topk * model.hidden_size * (ep - 1) / ep
    peers_on_node = min(max(gpus_per_node // (parallel.tp * parallel.cp), 1), ep) - 1
    on_node = peers_on_node / (ep - 1)
    seconds = sent * (on_node / intra_node_gb_per_s + (1 - on_node) / inter_node_gb_per_s) / 1e9
    return seconds * 1e3


def embedding_ms(
    model: ModelSpec, parallel: ParallelConfig, hbm_gb_per_s: float = HBM_GB_PER_S
) -> tuple[float, float]:
    """Forward and backward ms of the embedding per micro-batch: it computes nothing, it moves
    bytes at ``hbm_gb_per_s``.

    Forward: a GPU's ``b x s / CP`` tokens each read their row when it is in the GPU's vocabulary
    shard (1/TP of them) and write a full row of the output TP then reduces.  Backward: the
    tokens' gradient rows are read and added into a dense gradient of the whole shard, which is
    zero-filled and then accumulated into the fp32 main gradient every micro-batch
    (EMBEDDING_GRAD_BYTES_MOVED per element): the vocabulary x hidden term that makes it
    milliseconds at a 256k vocabulary."""
    row_bytes = model.hidden_size * WEIGHT_BYTES
    tokens = parallel.micro_batch_size * model.seq_length / parallel.cp
    table = unit_sizes(model, parallel.micro_batch_size, parallel.tp)[EMBEDDING].params
    elements = table.tp_sharded / parallel.tp
    forward_bytes = tokens * row_bytes * (1 + 1 / parallel.tp)
    backward_bytes = 2 * tokens * row_bytes + elements * EMBEDDING_GRAD_BYTES_MOVED
    per_ms = hbm_gb_per_s * 1e9 / 1e3
    return forward_bytes / per_ms, backward_bytes / per_ms
