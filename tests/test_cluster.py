"""Running rank processes on a Ray cluster: rank order against Megatron's own RankGenerator
(pure), failure classification (pure), and real runs of fake-GPU Python ranks on a local
3-node cluster, checking after every fault that no process, actor or placement group is left."""

from __future__ import annotations

import dataclasses
import itertools
import random
import signal
import socket
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from megatron.core.parallel_state import RankGenerator

from ray_layout.errors import ConfigError
from ray_layout.measure.store import CostStore
from ray_layout.model.spec import ParallelConfig
from ray_layout.runtime.actor import RankProcess
from ray_layout.runtime.failures import RankStatus, classify_exit, failure_mark
from ray_layout.runtime.local import check_reachable, connected
from ray_layout.runtime.placement import (
    check_placement,
    device_env,
    megatron_coordinates,
    rank_order,
)
from ray_layout.runtime.policy import RunPolicy
from ray_layout.runtime.runs import attempts, run_many, run_on_cluster
from ray_layout.runtime.spec import RunResult, RunSpec, attempt_id, attempt_number
from tests.conftest import GPUS_PER_NODE, NODES

ORDER = "tp-cp-ep-dp-pp"
DENSE, EXPERT = ("tp", "cp", "dp", "pp"), ("etp", "ep", "edp", "pp")


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


def test_run_spec_rejects_what_would_fail_late(tmp_path):
    good = {"parallel": ParallelConfig(), "gpus_per_node": 4, "log_dir": tmp_path}
    with pytest.raises(ConfigError, match="run id must be"):
        RunSpec("a/b", "s", ["python"], **good)
    with pytest.raises(ConfigError, match="study must be"):
        RunSpec("a", "", ["python"], **good)
    with pytest.raises(ConfigError, match="non-empty list"):
        RunSpec("a", "s", [], **good)
    with pytest.raises(ConfigError, match=r"source of the runs table, not nonsense, status$"):
        RunSpec("a", "s", ["python"], labels={"status": "x", "nonsense": 1, "model": "m"}, **good)


def test_attempt_ids_read_back():
    ids = [attempt_id("profile-ab12-retry", n) for n in (1, 2, 3)]
    assert ids == ["profile-ab12-retry", "profile-ab12-retry-retry1", "profile-ab12-retry-retry2"]
    assert [attempt_number("profile-ab12-retry", i) for i in ids] == [1, 2, 3]


def test_device_env_shows_each_rank_its_nodes_gpus():
    ordered = [("a", 0), ("a", 2), ("b", 1), ("b", 3)]
    assert device_env(ordered, 1) == {
        "CUDA_VISIBLE_DEVICES": "0,2",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
    }
    assert device_env(ordered, 2)["CUDA_VISIBLE_DEVICES"] == "1,3"


def status(code: int | None, *lines: str, exit_after_s: float = 1.0) -> RankStatus:
    marks: dict[str, str] = {}
    for line in lines:
        mark = failure_mark(line)
        if mark:
            marks.setdefault(mark, line)
    return RankStatus(1, code, None if code is None else exit_after_s, 0.0, marks, lines)


def test_an_address_nothing_answers_at_is_one_line_not_minutes_of_retries(monkeypatch):
    with socket.socket() as probe:  # a port that was free a moment ago: nothing listens there
        probe.bind(("127.0.0.1", 0))
        closed = f"127.0.0.1:{probe.getsockname()[1]}"
    with pytest.raises(ConfigError, match=rf"no Ray cluster answers at {closed} \(\$RAY_ADDRESS\)"):
        check_reachable(closed, "$RAY_ADDRESS")
    with pytest.raises(ConfigError, match=r"ray://" + closed + r" \(--ray-address\)"):
        check_reachable(f"ray://{closed}", "--ray-address")
    with pytest.raises(ConfigError, match="is not host:port"):
        check_reachable("127.0.0.1:head", "--ray-address")
    check_reachable("auto", "$RAY_ADDRESS")  # Ray's to resolve
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        check_reachable(f"127.0.0.1:{listening.getsockname()[1]}", "--ray-address")
    monkeypatch.setenv("RAY_ADDRESS", closed)
    started = time.monotonic()
    with pytest.raises(ConfigError, match="unset RAY_ADDRESS"), connected(None, 1, None):
        pass
    assert time.monotonic() - started < 5


def test_classify_exit_names_the_cause_not_its_echo():
    closed = "RuntimeError: [pair.cc:534] Connection closed by peer [10.0.0.2]:4242"
    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    watchdog = "[Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7)"
    usage = "pretrain_gpt.py: error: unrecognized arguments: --bogus"
    # The OOM rank exited after its peers lost their connections to it.
    assert classify_exit([status(1, closed, exit_after_s=0.5), status(1, oom)]) == (
        "oom",
        f"rank 1: {oom}",
    )
    assert classify_exit([status(None), status(2, "usage: x", usage)])[0] == "invalid-config"
    assert classify_exit([status(2, "python: can't open file 'x.py'")])[0] == "invalid-config"
    # A rank killed by the host's OOM killer; its peer only saw the connection drop.
    name, error = classify_exit([status(1, closed, exit_after_s=0.1), status(-9, "step 3")])
    assert (name, error) == ("killed", "rank 1 killed by SIGKILL: step 3")
    # NCCL's watchdog aborts (SIGABRT) a rank whose peer hung: communication, not a kill.
    assert classify_exit([status(-6, watchdog), status(None)])[0] == "comm"
    assert classify_exit([status(1, closed), status(0)])[0] == "comm"
    name, error = classify_exit(
        [
            status(1, "Traceback", "ValueError: bad", exit_after_s=2.0),
            status(3, "x", exit_after_s=1.0),
        ]
    )
    assert (name, error) == ("crash", "rank 1 exited 3: x")


def test_failure_marks():
    assert failure_mark("RuntimeError: CUDA error: out of memory") == "oom"
    assert failure_mark("ray_layout.model.spec.ConfigError: TP=3") == "invalid-config"
    assert failure_mark("torch.distributed.DistBackendError: NCCL error in: x") == "comm"
    assert failure_mark("[E ProcessGroupGloo.cpp:143] gloo: Timed out waiting 1800000ms") == "comm"
    assert failure_mark(" iteration 10/ 20 | lm loss: 1.0 | error: none") is None


def test_rank_process_streams_marks_and_stops_a_stubborn_process(tmp_path):
    """The subprocess part of the rank actor, run here without Ray."""
    script = tmp_path / "stubborn.py"
    script.write_text(
        textwrap.dedent("""
        import signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print(" iteration        1/      10 | lm loss: 1.0 |", flush=True)
        print("torch.OutOfMemoryError: CUDA out of memory.", flush=True)
        time.sleep(60)
        """)
    )
    process = RankProcess()
    pid = process.start([sys.executable, str(script)], {}, "stubborn/rank-0")
    wait_for(lambda: "oom" in process.poll().marks, 10.0)
    running = process.poll()
    assert running.returncode is None and running.idle_s < 10.0
    started = time.monotonic()
    final = process.stop(grace_s=0.5)
    assert final is not None and final.returncode == -signal.SIGKILL
    assert time.monotonic() - started < 5.0
    assert not alive(pid)
    output = process.finish(grace_s=0.5)  # what it printed, parsed where it ran
    assert "CUDA out of memory" in output.text


# ---------------------------------------------------------------------------------------------
# Real runs on the session's local cluster.  Every rank is RANK_SCRIPT in some mode.

RANK_SCRIPT = """
import os, signal, sys, time
from pathlib import Path

mode, state = sys.argv[1], Path(sys.argv[2])
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
(state / "pids").mkdir(parents=True, exist_ok=True)
(state / "pids" / str(os.getpid())).write_text(str(os.getppid()))  # the rank's actor process
actor_stat = Path(f"/proc/{os.getppid()}/stat").read_text()
raylet = actor_stat.rpartition(")")[2].split()[1]  # the actor's parent: its node's raylet
names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "CUDA_VISIBLE_DEVICES", "MASTER_ADDR", "MASTER_PORT")
print(" ".join(f"{name}={os.environ[name]}" for name in names), f"RAYLET={raylet}", flush=True)


def beat(i):
    print(f" [2026-01-01 00:00:0{i}] iteration {i:8d}/      10 | elapsed time per iteration "
          "(ms): 100.0 |", flush=True)


beat(1)
if mode == "ok":
    time.sleep(0.5)
    beat(2)
elif mode == "kill-once":
    if rank == world - 1 and not (state / "killed").exists():
        (state / "killed").touch()
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.5)
elif mode == "kill-actor":
    if rank == 0:
        time.sleep(0.3)
        os.kill(os.getppid(), signal.SIGKILL)
    time.sleep(60)
elif mode == "hang":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    time.sleep(600)
elif mode == "loop":
    for i in range(10**6):
        beat(i)
        time.sleep(0.2)
elif mode == "oom":
    if rank == 1:
        print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB", flush=True)
        sys.exit(1)
    time.sleep(60)
elif mode == "usage":
    print("usage: pretrain_gpt.py [-h] [--num-layers NUM_LAYERS]", file=sys.stderr)
    print("pretrain_gpt.py: error: unrecognized arguments: --bogus", file=sys.stderr)
    sys.exit(2)
elif mode == "span":
    start = time.time()
    time.sleep(3.0)
    (state / f"span-{os.environ['RUN_TAG']}").write_text(f"{start} {time.time()}")
"""


def wait_for(condition: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def alive(pid: int) -> bool:
    """Whether a process exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


# short enough for a test to see each failure class; no retry unless a test asks for one
TEST_POLICY = RunPolicy(
    timeout_s=60.0, heartbeat_s=30.0, max_retries=0, placement_timeout_s=30.0, stop_grace_s=1.0
)
POLICY_FIELDS = frozenset(item.name for item in dataclasses.fields(RunPolicy))


def make_spec(tmp_path: Path, mode: str, run_id: str, **changes) -> RunSpec:
    """A run of RANK_SCRIPT; ``changes`` set the spec's fields or its policy's."""
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    policy = {name: value for name, value in changes.items() if name in POLICY_FIELDS}
    fields = {
        "parallel": ParallelConfig(dp=2),
        "gpus_per_node": GPUS_PER_NODE,
        "policy": dataclasses.replace(TEST_POLICY, **policy),
        "log_dir": tmp_path / "logs",
    } | {name: value for name, value in changes.items() if name not in POLICY_FIELDS}
    command = [sys.executable, str(script), mode, str(tmp_path / "state")]
    return RunSpec(run_id, "test", command, **fields)


def assert_cleaned_up(tmp_path: Path, spec: RunSpec, result: RunResult) -> None:
    """No rank process, rank actor (process or name) or placement group is left over, and the
    cluster has all its GPUs back."""
    import ray

    pids = list((tmp_path / "state" / "pids").glob("*"))
    processes = {int(path.name) for path in pids} | {int(path.read_text()) for path in pids}
    wait_for(lambda: not any(map(alive, processes)), 10.0)
    names = [
        f"{attempt_id(spec.run_id, attempt)}.slot-{slot}"
        for attempt in range(1, result.attempts + 1)
        for slot in range(spec.parallel.world_size)
    ]
    wait_for(lambda: not any(actor_exists(ray, name) for name in names), 10.0)
    for group in ray.util.placement_group_table().values():
        assert group["state"] == "REMOVED", group
    wait_for(lambda: ray.available_resources().get("GPU") == NODES * GPUS_PER_NODE, 10.0)


def actor_exists(ray, name: str) -> bool:
    try:
        ray.get_actor(name)
    except ValueError:
        return False
    return True


def test_eight_ranks_fill_two_nodes_in_megatron_order(ray_cluster, tmp_path):
    store = CostStore(tmp_path / "store")
    parallel = ParallelConfig(tp=2, pp=2, dp=2)
    spec = make_spec(tmp_path, "ok", "eight", parallel=parallel, labels={"layout": "Et|tL"})
    result = run_on_cluster(spec, store)
    assert (result.status, result.failure_class, result.attempts) == ("finished", None, 1)
    assert result.returncodes == [0] * 8
    assert result.log_paths == [tmp_path / "logs" / "eight" / f"rank-{r}.log" for r in range(8)]
    lines = [path.read_text().splitlines()[0] for path in result.log_paths]
    env = [dict(item.split("=", 1) for item in line.split()) for line in lines]
    assert [e["RANK"] for e in env] == [str(r) for r in range(8)]
    assert {e["WORLD_SIZE"] for e in env} == {"8"}
    assert [e["LOCAL_RANK"] for e in env] == ["0", "1", "2", "3"] * 2
    assert {e["CUDA_VISIBLE_DEVICES"] for e in env} == {"0,1,2,3"}
    assert len({(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in env}) == 1
    raylets = [e["RAYLET"] for e in env]
    assert len(set(raylets[:4])) == len(set(raylets[4:])) == 1 and raylets[0] != raylets[4]
    rows = store.read("runs", "test")
    assert rows[["run_id", "status", "tp", "pp", "dp", "layout"]].values.tolist() == [
        ["eight", "finished", 2, 2, 2, "Et|tL"]
    ]
    assert_cleaned_up(tmp_path, spec, result)


def test_a_killed_rank_is_retried(ray_cluster, tmp_path):
    store = CostStore(tmp_path / "store")
    spec = make_spec(tmp_path, "kill-once", "killed", max_retries=2)
    result = run_on_cluster(spec, store)
    assert (result.status, result.attempts, result.run_id) == ("finished", 2, "killed-retry1")
    rows = store.read("runs", "test").sort_values("started_at")
    assert rows[["run_id", "status", "failure_class"]].fillna("-").values.tolist() == [
        ["killed", "failed", "killed"],
        ["killed-retry1", "finished", "-"],
    ]
    assert rows.error.iloc[0].startswith("rank 1 killed by SIGKILL")
    assert (tmp_path / "logs" / "killed" / "rank-1.log").exists()  # written by the driver
    assert_cleaned_up(tmp_path, spec, result)


def test_a_rank_that_dies_mid_run_returns_what_it_logged(ray_cluster, tmp_path):
    """No log folder: the killed rank's output before its death comes back through Ray."""
    spec = make_spec(tmp_path, "kill-once", "dies", log_dir=None)
    (first,) = list(attempts(spec))
    result = first.result
    assert (result.failure_class, result.log_paths) == ("killed", [])
    assert result.returncodes[-1] == -signal.SIGKILL
    for output in result.outputs:  # the killed rank's too
        assert output.text.startswith("RANK=") and "iteration        1/" in output.text
        assert [it.iteration for it in output.parsed.iterations] == [1]
    assert not (tmp_path / "logs").exists()
    assert_cleaned_up(tmp_path, spec, result)


def test_a_lost_actor_is_node_lost_and_retried_up_to_max_retries(ray_cluster, tmp_path):
    spec = make_spec(tmp_path, "kill-actor", "lost", max_retries=1)
    result = run_on_cluster(spec)
    assert (result.status, result.failure_class, result.attempts) == ("failed", "node-lost", 2)
    assert "actor died" in result.error
    assert_cleaned_up(tmp_path, spec, result)


def test_a_hanging_run_is_stopped_by_its_heartbeat(ray_cluster, tmp_path):
    spec = make_spec(tmp_path, "hang", "hang", heartbeat_s=2.0, stop_grace_s=0.5)
    started = time.monotonic()
    result = run_on_cluster(spec)
    assert (result.status, result.failure_class) == ("failed", "hang")
    assert result.returncodes == [None, None]  # still running when stopped
    assert time.monotonic() - started < 20.0  # the run timeout is 60 s
    assert_cleaned_up(tmp_path, spec, result)  # SIGTERM was ignored: SIGKILL worked


def test_a_busy_run_past_its_time_is_a_timeout(ray_cluster, tmp_path):
    spec = make_spec(tmp_path, "loop", "slow", timeout_s=4.0, heartbeat_s=2.0)
    result = run_on_cluster(spec)
    assert (result.status, result.failure_class) == ("failed", "timeout")
    assert_cleaned_up(tmp_path, spec, result)


def test_oom_is_infeasible_and_never_retried(ray_cluster, tmp_path):
    spec = make_spec(tmp_path, "oom", "oom", max_retries=2)
    result = run_on_cluster(spec)
    assert (result.status, result.failure_class, result.attempts) == ("infeasible", "oom", 1)
    assert result.error.startswith("rank 1: torch.OutOfMemoryError: CUDA out of memory")
    assert result.returncodes == [None, 1]
    assert_cleaned_up(tmp_path, spec, result)


def test_a_usage_error_is_invalid_config_and_never_retried(ray_cluster, tmp_path):
    spec = make_spec(tmp_path, "usage", "usage", max_retries=2)
    result = run_on_cluster(spec)
    assert (result.status, result.failure_class, result.attempts) == ("error", "invalid-config", 1)
    assert "unrecognized arguments: --bogus" in result.error
    assert_cleaned_up(tmp_path, spec, result)


def test_tp_larger_than_a_node_is_invalid_config_before_launch(ray_cluster, tmp_path):
    spec = make_spec(tmp_path, "ok", "wide", parallel=ParallelConfig(tp=8), max_retries=2)
    result = run_on_cluster(spec)
    assert (result.status, result.failure_class, result.attempts) == ("error", "invalid-config", 1)
    assert "TP=8 groups do not fit in nodes" in result.error


def test_an_unplaceable_run_is_infeasible_placement_at_once(ray_cluster, tmp_path):
    store = CostStore(tmp_path / "store")
    spec = make_spec(
        tmp_path, "ok", "huge", parallel=ParallelConfig(dp=20), placement_timeout_s=1.0,
        max_retries=2,
    )  # fmt: skip
    started = time.monotonic()
    result = run_on_cluster(spec, store)
    assert time.monotonic() - started < 5.0
    assert (result.status, result.failure_class, result.attempts) == (
        "infeasible",
        "infeasible-placement",
        1,
    )
    assert result.error == "4+4+4+4+4 GPUs on 5 nodes not placed within 1 s"
    assert store.read("runs", "test").failure_class.tolist() == ["infeasible-placement"]
    assert_cleaned_up(tmp_path, spec, result)


def test_run_many_shares_the_cluster_and_keeps_the_order(ray_cluster, tmp_path):
    # A rank takes all 4 CPUs of a node: three runs fit at once, the fourth waits for room.
    specs = [
        make_spec(tmp_path, "span", f"many-{i}", parallel=ParallelConfig(), cpus_per_rank=4.0,
                  env={"RUN_TAG": str(i)})
        for i in range(4)
    ]  # fmt: skip
    results = run_many(specs)
    assert [r.run_id for r in results] == [f"many-{i}" for i in range(4)]
    assert {r.status for r in results} == {"finished"}
    spans = [
        tuple(map(float, (tmp_path / "state" / f"span-{i}").read_text().split())) for i in range(4)
    ]
    starts = sorted(start for start, _ in spans)
    ends = sorted(end for _, end in spans)
    assert starts[1] < ends[0]  # runs overlapped
    assert starts[3] >= ends[0]  # the fourth waited for a node
    for spec, result in zip(specs, results, strict=True):
        assert_cleaned_up(tmp_path, spec, result)


def test_a_watch_sees_every_iteration_line_and_can_stop_the_run(ray_cluster, tmp_path):
    spec = make_spec(tmp_path, "loop", "watched")
    seen: list[str] = []

    def watch(run_id: str, lines: list[str]) -> str | None:
        assert run_id == "watched"
        seen.extend(lines)
        return "enough: 5 iterations" if len(seen) >= 5 else None

    result = run_on_cluster(spec, watch=watch)
    assert (result.status, result.failure_class, result.error) == (
        "stopped",
        "early-stop",
        "enough: 5 iterations",
    )
    numbers = [int(line.split("iteration")[1].split("/")[0]) for line in seen]
    assert numbers[:5] == [1, 0, 1, 2, 3]  # in order, none lost between polls
    assert_cleaned_up(tmp_path, spec, result)


def test_cancelling_run_many_stops_running_and_waiting_runs(ray_cluster, tmp_path):
    # Each rank takes all 4 CPUs of a node: three runs fit, the fourth waits for room.
    specs = [
        make_spec(tmp_path, "loop", f"cancel-{i}", parallel=ParallelConfig(), cpus_per_rank=4.0)
        for i in range(4)
    ]
    cancel = threading.Event()
    timer = threading.Timer(3.0, cancel.set)
    timer.start()
    started = time.monotonic()
    results = run_many(specs, cancel=cancel)
    assert time.monotonic() - started < 15.0
    assert {(r.status, r.failure_class) for r in results} == {("cancelled", "cancelled")}
    for spec, result in zip(specs, results, strict=True):
        assert_cleaned_up(tmp_path, spec, result)
