"""Real runs of fake-GPU Python ranks on a local 3-node Ray cluster, through every way a run
ends (``runs``, ``attempt``, ``actor`` end to end), checking after every fault that no process,
actor or placement group is left."""

from __future__ import annotations

import dataclasses
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from ray_layout.measure.store import CostStore
from ray_layout.model.spec import ParallelConfig
from ray_layout.runtime.policy import RunPolicy
from ray_layout.runtime.run_spec import RunResult, RunSpec, attempt_id
from ray_layout.runtime.runs import attempts, run_many, run_on_cluster
from tests.helpers.cluster import GPUS_PER_NODE, NODES
from tests.helpers.runtime_processes import alive, wait_for

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


def test_an_unplaceable_run_is_infeasible_placement_at_once(ray_cluster, tmp_path, caplog):
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
    said = [r.getMessage() for r in caplog.records if r.name == "ray_layout.runtime.runs"]
    assert said == [f"{result.run_id}: infeasible-placement ({result.error})"]  # as it ends
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


def cancel_at(moment: str, cancel: threading.Event, monkeypatch) -> list[str]:
    """Set ``cancel`` at ``moment`` of each attempt that reaches it; returns the actors that
    such an attempt created after setting it (none: at most the one it had just created).  Only
    the setting attempt is checked: in its own thread the order is certain."""
    from ray_layout.runtime import attempt as attempt_module

    setters: set[int] = set()
    late: list[str] = []

    def stop() -> None:
        setters.add(threading.get_ident())
        cancel.set()

    def stop_after(name: str) -> None:
        original = getattr(attempt_module, name)

        def then_stop(*args, **kwargs):
            result = original(*args, **kwargs)
            stop()
            return result

        monkeypatch.setattr(attempt_module, name, then_stop)

    if moment == "group created":  # Ray is still reserving it: where a removal leaks
        stop_after("placement_group")
    elif moment == "group placed":
        stop_after("_placed")
    elif moment == "actor created":  # the others of its run not created yet
        held = attempt_module.Held

        class StopAtFirst(dict):
            def __setitem__(self, name: str, actor) -> None:
                super().__setitem__(name, actor)
                stop()

        monkeypatch.setattr(attempt_module, "Held", lambda group: held(group, StopAtFirst()))
    create_actors = attempt_module._create_actors

    def counted(attempt, held, bundles) -> None:
        try:
            create_actors(attempt, held, bundles)
        finally:
            if threading.get_ident() in setters:
                late.extend(list(held.actors)[int(moment == "actor created") :])

    monkeypatch.setattr(attempt_module, "_create_actors", counted)
    return late


MOMENTS = ("group created", "group placed", "actor created", "ranks running")


@pytest.mark.parametrize("moment", MOMENTS)
def test_a_stop_at_any_moment_gives_back_every_gpu(ray_cluster, tmp_path, monkeypatch, moment):
    """Three runs of a node each fill the cluster and a fourth waits its turn; a stop at each
    moment of an attempt cancels them all, the fourth never takes a group, no actor is created
    after the stop, and every GPU is free when ``run_many`` returns."""
    import ray

    cancel = threading.Event()
    late = cancel_at(moment, cancel, monkeypatch)
    tag = moment.replace(" ", "-")
    specs = [
        make_spec(tmp_path, "loop", f"{tag}-{i}", parallel=ParallelConfig(dp=GPUS_PER_NODE))
        for i in range(NODES + 1)
    ]

    def running(run_id: str, lines: list[str]) -> str | None:
        if lines:  # the last rank printed its first iteration line
            cancel.set()
        return None

    watches = [running if moment == "ranks running" else None] * len(specs)
    started = time.monotonic()
    results = run_many(specs, cancel=cancel, max_parallel=NODES, watches=watches)
    took = time.monotonic() - started
    assert {(r.status, r.failure_class) for r in results} == {("cancelled", "cancelled")}
    assert late == []
    groups = {g["name"] for g in ray.util.placement_group_table().values()}
    assert specs[-1].run_id not in groups  # the waiting run never started
    wait_for(lambda: ray.available_resources().get("GPU") == NODES * GPUS_PER_NODE, 2.0)
    for spec, result in zip(specs, results, strict=True):
        assert_cleaned_up(tmp_path, spec, result)
    assert took < 30.0, took
