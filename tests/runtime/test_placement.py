"""Which GPU gets which global rank, against Megatron's own RankGenerator, and what each rank is
told about where it sits."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st
from megatron.core.parallel_state import RankGenerator

from ray_layout.errors import ConfigError
from ray_layout.model.spec import ParallelConfig
from ray_layout.runtime.placement import (
    check_placement,
    device_env,
    launch_env,
    megatron_coordinates,
    megatron_rank_env,
    node_bundles,
    planned_devices,
    rank_order,
)

DENSE, EXPERT = ("tp", "cp", "dp", "pp"), ("etp", "ep", "edp", "pp")
ORDER = "tp-cp-ep-dp-pp"


def shapes() -> list[ParallelConfig]:
    """Many (TP, CP, DP, PP, EP, ETP) shapes up to 64 GPUs that Megatron accepts."""
    found = []
    for tp, cp, dp, pp in itertools.product((1, 2, 4, 8), (1, 2), (1, 2, 4), (1, 2, 4)):
        world = tp * cp * dp * pp
        if world > 64:
            continue
        for ep, etp in itertools.product((1, 2, 4, 8), (1, 2, 4)):
            if (world // pp) % (ep * etp) == 0:
                found.append(ParallelConfig(tp=tp, cp=cp, dp=dp, pp=pp, ep=ep, etp=etp))
    return found


SHAPES = shapes()


def megatron_groups(p: ParallelConfig) -> dict[str, list[list[int]]]:
    """The groups ``initialize_model_parallel`` builds, by coordinate name."""
    dense = RankGenerator(tp=p.tp, ep=1, dp=p.dp, pp=p.pp, cp=p.cp, order=ORDER)
    expert = RankGenerator(tp=p.etp, ep=p.ep, dp=p.expert_dp, pp=p.pp, cp=1, order=ORDER)
    return {
        "tp": dense.get_ranks("tp"),
        "cp": dense.get_ranks("cp"),
        "dp": dense.get_ranks("dp"),
        "pp": dense.get_ranks("pp"),
        "etp": expert.get_ranks("tp"),
        "ep": expert.get_ranks("ep"),
        "edp": expert.get_ranks("dp"),
    }


def test_coordinates_follow_megatrons_rank_generator():
    assert len(SHAPES) > 200
    for p in SHAPES:
        coords = [megatron_coordinates(rank, p) for rank in range(p.world_size)]
        for name, groups in megatron_groups(p).items():
            for group in groups:
                # Within a group the named coordinate counts up; every other one of the same
                # generator stays put.
                assert [coords[r][name] for r in group] == list(range(len(group))), (p, name)
                family = DENSE if name in DENSE else EXPERT
                for other in set(family) - {name}:
                    assert len({coords[r][other] for r in group}) == 1, (p, name, other)


def placed(p: ParallelConfig, gpus_per_node: int, seed: int) -> list[tuple[str, int]]:
    """Devices as Ray might report them: random node ids, shuffled."""
    rng = random.Random(seed)
    nodes = sorted(f"{rng.getrandbits(64):016x}" for _ in range(p.world_size // gpus_per_node))
    devices = [(node, gpu) for node in nodes for gpu in range(gpus_per_node)]
    rng.shuffle(devices)
    return devices


def test_rank_order_keeps_megatron_groups_where_they_belong():
    checked = 0
    for p, gpus_per_node in itertools.product(SHAPES, (2, 4, 8)):
        if p.world_size % gpus_per_node or gpus_per_node % max(p.tp, p.etp):
            continue
        devices = placed(p, gpus_per_node, seed=checked)
        ordered = rank_order(devices, p)
        assert ordered == rank_order(list(reversed(devices)), p)
        nodes = sorted({node for node, _ in devices})
        # Node by node, GPUs in order: rank r is GPU r % g of the (r // g)-th node.
        assert ordered == [
            (nodes[r // gpus_per_node], r % gpus_per_node) for r in range(p.world_size)
        ]
        groups = megatron_groups(p)
        for name in ("tp", "etp"):
            for group in groups[name]:
                assert len({ordered[r][0] for r in group}) == 1, (p, gpus_per_node, name)
        stage_size = p.world_size // p.pp
        for group in groups["pp"]:
            # PP neighbours are one stage apart; a stage is a contiguous block of ranks, so it
            # spans whole nodes or shares one node with other whole stages.
            assert [b - a for a, b in itertools.pairwise(group)] == [stage_size] * (p.pp - 1)
        for stage in range(p.pp):
            span = {ordered[r][0] for r in range(stage * stage_size, (stage + 1) * stage_size)}
            assert len(span) == max(1, stage_size // gpus_per_node), (p, gpus_per_node)
        checked += 1
    assert checked > 300


def test_check_placement_rejects_groups_that_cross_nodes():
    check_placement(ParallelConfig(tp=4, dp=2), {"a": 4, "b": 4})
    with pytest.raises(ConfigError, match=r"TP=8 groups do not fit in nodes: node a has 4"):
        check_placement(ParallelConfig(tp=8), {"a": 4, "b": 4})
    with pytest.raises(ConfigError, match=r"TP=4 .* node b has 2"):
        check_placement(ParallelConfig(tp=4, dp=2), {"a": 4, "b": 2, "c": 2})
    with pytest.raises(ConfigError, match="ETP=4"):
        check_placement(ParallelConfig(tp=2, dp=4, ep=2, etp=4), {"a": 2, "b": 2, "c": 2, "d": 2})
    with pytest.raises(ConfigError, match="has 4 GPUs for a world size of 8"):
        check_placement(ParallelConfig(tp=2, dp=4), {"a": 4})
    with pytest.raises(ConfigError, match="ETP x EP x PP"):
        check_placement(ParallelConfig(tp=1, dp=6, ep=4), {"a": 6})
    with pytest.raises(ConfigError, match="placed twice"):
        rank_order([("a", 0), ("a", 0)], ParallelConfig(dp=2))
    with pytest.raises(ConfigError, match="outside the world"):
        megatron_coordinates(8, ParallelConfig(dp=8))


def test_device_env_shows_each_rank_its_nodes_gpus():
    ordered = [("a", 0), ("a", 2), ("b", 1), ("b", 3)]
    assert device_env(ordered, 1) == {
        "CUDA_VISIBLE_DEVICES": "0,2",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
    }
    assert device_env(ordered, 2)["CUDA_VISIBLE_DEVICES"] == "1,3"


@given(st.integers(1, 512), st.integers(1, 16))
def test_bundles_are_full_nodes_and_the_rest_on_one_more(world: int, gpus_per_node: int) -> None:
    bundles = node_bundles(world, gpus_per_node)
    assert sum(bundles) == world
    assert set(bundles[:-1]) <= {gpus_per_node} and 0 < bundles[-1] <= gpus_per_node
    assert len(bundles) == -(-world // gpus_per_node)


def test_bundles_of_a_few_shapes() -> None:
    assert node_bundles(8, 4) == [4, 4]
    assert node_bundles(10, 4) == [4, 4, 2]
    assert node_bundles(3, 8) == [3]


def test_planned_devices_are_gpus_0_1_of_each_node_in_rank_order() -> None:
    devices = planned_devices(6, 4)
    assert devices == [
        ("node-000000", 0),
        ("node-000000", 1),
        ("node-000000", 2),
        ("node-000000", 3),
        ("node-000001", 0),
        ("node-000001", 1),
    ]
    # already in the order Ray's real devices are put in, whatever the shape
    planned = planned_devices(16, 8)
    assert rank_order(planned, ParallelConfig(tp=2, pp=4, dp=2)) == planned
    with pytest.raises(ConfigError, match=r"^GPUs per node must be >= 1, got 0$"):
        planned_devices(4, 0)


def test_node_names_sort_as_numbers_past_ten_nodes() -> None:
    devices = planned_devices(12, 1)
    assert sorted(devices) == devices


def test_a_rank_is_launched_with_its_variables_and_its_nodes_device_view() -> None:
    ordered = [("a", 0), ("a", 1), ("b", 2), ("b", 5)]
    seen: list[list[int]] = []

    def rank_env(rank: int, world: int, addr: str, port: int, gpus: list[int]) -> dict[str, str]:
        seen.append(gpus)
        return {**megatron_rank_env(rank, world, addr, port, gpus), "CUDA_VISIBLE_DEVICES": "x"}

    env = launch_env(rank_env, ordered, 3, "10.0.0.1", 29500)
    assert env == {
        "RANK": "3",
        "WORLD_SIZE": "4",
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29500",
        "CUDA_VISIBLE_DEVICES": "2,5",  # the device view wins over the launch's
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
    }
    assert seen == [[5]]  # the rank's own GPU
    with pytest.raises(ConfigError, match=r"^rank 4 is outside the world of 4 ranks$"):
        launch_env(rank_env, ordered, 4, "10.0.0.1", 29500)


def test_sizes_below_1_or_that_do_not_divide_are_refused() -> None:
    with pytest.raises(ConfigError, match="parallel sizes must be >= 1"):
        check_placement(ParallelConfig(tp=0), {"a": 1})
    with pytest.raises(ConfigError, match="world size 6 is not divisible by ETP x EP x PP"):
        megatron_coordinates(0, ParallelConfig(dp=6, ep=4))
    with pytest.raises(ConfigError, match=r"^rank -1 is outside the world of 8$"):
        megatron_coordinates(-1, ParallelConfig(dp=8))
