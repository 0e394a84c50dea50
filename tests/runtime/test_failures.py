"""Why a run ended: the failure a rank's output proves, the class of a run in which ranks
exited, the status each class implies and which are retried."""

from __future__ import annotations

import pytest

from ray_layout.runtime.failures import (
    MAX_LINE,
    RETRIED,
    FailureClass,
    RankStatus,
    classify_exit,
    failure_mark,
    one_line,
    run_status,
)


def status(code: int | None, *lines: str, exit_after_s: float = 1.0) -> RankStatus:
    """A rank as its actor reports it after printing ``lines`` (``code`` None: running)."""
    marks: dict[str, str] = {}
    for line in lines:
        mark = failure_mark(line)
        if mark:
            marks.setdefault(mark, line)
    return RankStatus(1, code, None if code is None else exit_after_s, 0.0, marks, lines)


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


@pytest.mark.parametrize(
    ("failure", "expected"),
    [
        (None, "finished"),
        (FailureClass.OOM, "infeasible"),
        (FailureClass.INFEASIBLE_PLACEMENT, "infeasible"),
        (FailureClass.INVALID_CONFIG, "error"),
        (FailureClass.EARLY_STOP, "stopped"),
        (FailureClass.CANCELLED, "cancelled"),
        *((failure, "failed") for failure in ("node-lost", "killed", "comm", "hang", "timeout")),
        (FailureClass.CRASH, "failed"),
    ],
)
def test_the_status_each_class_ends_a_run_in(failure: FailureClass | None, expected: str) -> None:
    assert run_status(None if failure is None else FailureClass(failure)) == expected


def test_only_what_another_attempt_may_not_meet_again_is_retried() -> None:
    """A lost node, a kill, a peer's hang or a slow cluster may pass; an OOM, a bad flag or a
    bug comes back every time."""
    assert {str(failure) for failure in RETRIED} == {
        "node-lost",
        "killed",
        "comm",
        "hang",
        "timeout",
    }
    assert RETRIED.isdisjoint({FailureClass.OOM, FailureClass.INVALID_CONFIG, FailureClass.CRASH})


def test_a_class_read_back_from_the_store_is_its_member() -> None:
    for failure in FailureClass:
        assert FailureClass(str(failure)) is failure and failure == failure.value
    assert f"{FailureClass.NODE_LOST}" == "node-lost"


def test_the_first_class_a_line_proves_wins() -> None:
    """An OOM reported through NCCL is an OOM."""
    assert failure_mark("NCCL error: CUDA out of memory") == "oom"
    assert failure_mark("argparse: error: ConfigError") == "invalid-config"
    assert failure_mark("") is None


def test_a_rank_that_exited_0_beside_one_that_crashed_is_not_blamed() -> None:
    rank, crashed = classify_exit([status(0, "done"), status(1)])
    assert (rank, crashed) == ("crash", "rank 1 exited 1: (no output)")


def test_the_first_rank_to_fail_is_the_crash() -> None:
    statuses = [status(1, "late", exit_after_s=3.0), status(4, "early", exit_after_s=1.0)]
    assert classify_exit(statuses) == ("crash", "rank 1 exited 4: early")


def test_an_error_line_is_one_line_of_at_most_max_line_characters() -> None:
    assert one_line("Traceback:\n  File 'x'\r\n\tValueError:  bad ") == (
        "Traceback: File 'x' ValueError: bad"
    )
    assert one_line("x " * MAX_LINE) == ("x " * MAX_LINE)[:MAX_LINE]
    escaped = "rank 3: \\x1b[31mOOM\\x1b[0m"  # shown, never acted on
    assert one_line("rank 3: \x1b[31mOOM\x1b[0m") == escaped
    (_, error) = classify_exit([status(1, "e" * 2 * MAX_LINE)])
    assert len(error) == MAX_LINE and error.startswith("rank 0 exited 1: eee")
