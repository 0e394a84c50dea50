"""Which GPU gets which global rank, and what each rank is told about where it sits.

How a run is placed (docs/run.md): one placement group with one bundle per node
(``{"GPU": g, "CPU": c}``, STRICT_SPREAD; one bundle per GPU with STRICT_SPREAD can never be
placed), one actor per rank on its node's bundle.  Ray does not promise which GPU lands where,
so every actor reports (node id, GPU id) and :func:`rank_order` fills ranks node by node: with
Megatron's order tp-cp-ep-dp-pp (PP outermost) TP peers share a node and PP stages are
contiguous blocks.

Each rank is launched like torchrun does: RANK, WORLD_SIZE, MASTER_ADDR (rank 0's node IP),
MASTER_PORT (a free port on rank 0's node), CUDA_VISIBLE_DEVICES listing every GPU of the run on
the rank's node and LOCAL_RANK its own among them: a process that sees only its own GPU cannot
use CUDA IPC, so NCCL falls back from NVLink P2P to shared memory.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Mapping, Sequence

from ray_layout.errors import ConfigError
from ray_layout.model.spec import ParallelConfig

Device = tuple[str, int]  # (Ray node id, GPU id on that node)
# (rank, world size, master address, master port, the rank's GPU ids) -> its variables
RankEnv = Callable[[int, int, str, int, list[int]], Mapping[str, str]]


def check_placement(parallel: ParallelConfig, gpus_per_node: Mapping[str, int]) -> None:
    """Raise :class:`ConfigError` unless ranks filled node by node keep every TP (and expert TP)
    group inside one node: each node's GPU count must be a multiple of TP and ETP.

    ``gpus_per_node`` maps each node (any key) to the GPUs the run has there.  CP, EP, DP and PP
    groups may span nodes: Megatron runs them over the network in practice.
    """
    p = parallel
    world = p.world_size
    if min(p.tp, p.pp, p.cp, p.dp, p.ep, p.etp) < 1:
        raise ConfigError(f"parallel sizes must be >= 1, got {p}")
    if world % (p.etp * p.ep * p.pp):
        raise ConfigError(f"world size {world} is not divisible by ETP x EP x PP")
    placed = sum(gpus_per_node.values())
    if placed != world:
        raise ConfigError(f"the run has {placed} GPUs for a world size of {world}")
    for node, gpus in gpus_per_node.items():
        for name, size in (("TP", p.tp), ("ETP", p.etp)):
            if gpus % size:
                raise ConfigError(
                    f"{name}={size} groups do not fit in nodes: node {node} has {gpus} GPUs of "
                    f"this run, not a multiple of {size}"
                )


def node_bundles(world: int, gpus_per_node: int) -> list[int]:
    """GPUs per node bundle: full nodes, the rest on one more node."""
    full, rest = divmod(world, gpus_per_node)
    return [gpus_per_node] * full + ([rest] if rest else [])


def rank_order(devices: Sequence[Device], parallel: ParallelConfig) -> list[Device]:
    """The placed devices in global rank order: sorted by (node, GPU), so ranks fill node by
    node and, since Megatron's order is tp-cp-ep-dp-pp, TP peers share a node and PP stages
    are contiguous blocks of nodes.  Raises :class:`ConfigError` when that cannot hold."""
    if len(set(devices)) != len(devices):
        raise ConfigError(f"a GPU is placed twice: {sorted(devices)}")
    check_placement(parallel, collections.Counter(node for node, _ in devices))
    return sorted(devices)


def megatron_coordinates(rank: int, parallel: ParallelConfig) -> dict[str, int]:
    """Where a global rank sits in Megatron's groups (order tp-cp-ep-dp-pp): its tp, cp, dp and
    pp ranks, and in the expert layers its etp, ep and edp (expert data-parallel) ranks."""
    p = parallel
    if not 0 <= rank < p.world_size:
        raise ConfigError(f"rank {rank} is outside the world of {p.world_size}")
    if p.world_size % (p.etp * p.ep * p.pp):
        raise ConfigError(f"world size {p.world_size} is not divisible by ETP x EP x PP")
    tp, rest = rank % p.tp, rank // p.tp
    cp, rest = rest % p.cp, rest // p.cp
    dp, pp = rest % p.dp, rest // p.dp
    etp, rest = rank % p.etp, rank // p.etp
    ep, edp = rest % p.ep, (rest // p.ep) % p.expert_dp
    return {"tp": tp, "cp": cp, "dp": dp, "pp": pp, "etp": etp, "ep": ep, "edp": edp}


def device_env(ordered: Sequence[Device], rank: int) -> dict[str, str]:
    """torchrun's device variables for one rank, and the only place that decides them: every GPU
    of the run on its node visible (so NCCL can use CUDA IPC between them), LOCAL_RANK its own
    position among them."""
    node, gpu = ordered[rank]
    local = sorted(g for n, g in ordered if n == node)
    return {
        "CUDA_VISIBLE_DEVICES": ",".join(map(str, local)),
        "LOCAL_RANK": str(local.index(gpu)),
        "LOCAL_WORLD_SIZE": str(len(local)),
    }


def megatron_rank_env(
    rank: int, world: int, master_addr: str, master_port: int, gpu_ids: list[int]
) -> dict[str, str]:
    """The default per-rank variables: what torchrun gives ``pretrain_gpt.py`` besides the
    device ones (``gpu_ids``, the rank's own GPUs, are already in CUDA_VISIBLE_DEVICES)."""
    return {
        "RANK": str(rank),
        "WORLD_SIZE": str(world),
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
    }


def planned_devices(world: int, gpus_per_node: int) -> list[Device]:
    """The devices of a run, in rank order, when each node gives it GPUs 0, 1, ...: what
    ``megatron-command`` shows before Ray picks the real ones."""
    if gpus_per_node < 1:
        raise ConfigError(f"GPUs per node must be >= 1, got {gpus_per_node}")
    return [(f"node-{rank // gpus_per_node:06d}", rank % gpus_per_node) for rank in range(world)]


def launch_env(
    rank_env: RankEnv, ordered: Sequence[Device], rank: int, master_addr: str, master_port: int
) -> dict[str, str]:
    """Everything one rank is launched with: the launch's variables (``rank_env``), then its
    device view (:func:`device_env`) over them, so a run and ``megatron-command`` agree."""
    if not 0 <= rank < len(ordered):
        raise ConfigError(f"rank {rank} is outside the world of {len(ordered)} ranks")
    own = [ordered[rank][1]]
    return {
        **rank_env(rank, len(ordered), master_addr, master_port, own),
        **device_env(ordered, rank),
    }
