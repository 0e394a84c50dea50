"""The live A/B shell without Ray: watches fed by hand with Megatron iteration lines, as the
cluster's poll loop would, then ends, preloads, the final look, cost and the store."""

from __future__ import annotations

import math
import re
import time
from dataclasses import replace
from datetime import datetime
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from ray_layout.ab import live as live_ab
from ray_layout.ab.cost import gpu_seconds
from ray_layout.ab.live import (
    Arm,
    LiveTest,
    arm_runs,
    memory_per_stage,
    stored_steps,
    write_decisions,
)
from ray_layout.ab.live import test_id as ab_test_id
from ray_layout.ab.stats import ABConfig
from ray_layout.ab.vocabulary import ArmRole, StopReason
from ray_layout.measure.log_format import iteration_line, memory_line
from ray_layout.measure.store import CostStore
from ray_layout.model.layout import Layout
from ray_layout.model.memory_settings import PLAIN, memory_settings
from ray_layout.runtime.failures import FINISHED, STOPPED
from ray_layout.runtime.layout_runs import ProfiledRun
from ray_layout.runtime.run_spec import RunResult
from tests.helpers.ab_stored_errors import OLD_COVERED, OLD_SETTLED

# 2 warm-up steps, batches of 3, looks after 2 and 4 batches: look 0 at 8 lines, budget 14
CONFIG = ABConfig(warmup_iterations=2, batch_size=3, looks=(2, 4))
HBM = 80.0
LAYOUTS = {
    "fast": "Et*5|t*6|t*5|mL",
    "slow": "Et*4|t*4|t*4|t*4mL",
    "other": "Et*6|t*5|t*5|mL",
}
MEMORY = (40.0, 50.0, 45.0, 30.0)  # predicted GiB per stage: headroom 30 GiB
WHEN = datetime(2025, 1, 2, 3, 4, 5)
SETTLED, COVERED = StopReason.SETTLED.text, StopReason.COVERED.text


def make_arm(name, memory=MEMORY, role=ArmRole.CANDIDATE):
    return Arm(name, Layout.parse(LAYOUTS[name], 4), (role,), 100.0, tuple(memory))


def live(*names, memory=None, **kwargs):
    memory = memory or {}
    arms = [make_arm(name, memory.get(name, MEMORY)) for name in names]
    return LiveTest(arms, CONFIG, HBM, **kwargs)


def steps(n, mean, seed=0, cv=0.002):
    """Step times as an iteration line prints them (0.1 ms), so the trace holds them exactly."""
    rng = np.random.default_rng(seed)
    return [round(float(x), 1) for x in mean * (1 + cv * rng.standard_normal(n))]


def lines(values, start=1, loss=2.5):
    return [
        iteration_line(
            start + i, CONFIG.max_iterations, (start + i) * 8, ms, 8, {"lm loss": loss}, when=WHEN
        )
        for i, ms in enumerate(values)
    ]


def feed(watch, attempt, values, chunk=3, start=1):
    """Feed ``values`` in polls of ``chunk`` lines; the reasons each poll returned."""
    reasons = []
    for i in range(0, len(values), chunk):
        reasons.append(watch(attempt, lines(values[i : i + chunk], start=start + i)))
    return reasons


def run_of(name, status, failure_class=None, error=None):
    result = RunResult(f"run-{name}", status, failure_class, [], [], 1, error)
    return ProfiledRun(Layout.parse(LAYOUTS[name], 4), result, None)


def summary(decisions):
    return [(d.arm, d.look, d.action) for d in decisions]


# --- the trace ---------------------------------------------------------------------------------


def test_lines_build_the_trace_in_order_and_a_retry_starts_afresh():
    seen = []
    test = live("fast", "other", on_step=lambda arm, n: seen.append((arm, n)))
    assert test.trace("fast").steps_ms == () and test.trace("fast").headroom_gib == 30.0
    watch = test.watch("fast")
    first = steps(7, 100.0, seed=1)
    assert watch("attempt-1", []) is None
    noise = ["loading checkpoint", memory_line(3, 1, 1000.0, 1500.0, 2000.0, 2100.0)]
    assert watch("attempt-1", noise + lines(first[:3]) + noise) is None
    assert watch("attempt-1", lines(first[3:], start=4)) is None
    assert watch("attempt-1", ["no iteration here"]) is None
    trace = test.trace("fast")
    assert trace.steps_ms == tuple(first) and trace.failure is None
    assert trace.layout == LAYOUTS["fast"] and trace.arm == "fast"
    assert seen == [("fast", 3), ("fast", 7)]  # once per poll with steps
    assert test.trace("other").steps_ms == ()

    second = steps(2, 100.0, seed=2)
    assert watch("attempt-2", lines(second)) is None  # the retry's own iteration 1, 2
    assert test.trace("fast").steps_ms == tuple(second)
    assert test.decisions() == []


def test_a_truncated_line_is_not_a_step():
    test = live("fast", "other")
    whole = lines([101.5, 99.5])
    assert test.watch("fast")("a", [whole[0], whole[1][:-20]]) is None
    assert test.trace("fast").steps_ms == (101.5,)


# --- stops while running -----------------------------------------------------------------------


def test_a_clearly_slower_arm_stops_at_its_first_look_and_stays_stopped():
    test = live("fast", "slow")
    fast, slow = test.watch("fast"), test.watch("slow")
    assert feed(fast, "f", steps(8, 100.0, seed=1)) == [None, None, None]
    assert summary(test.decisions()) == [("fast", 0, "continue")]
    assert "nothing to compare" in test.decisions()[0].reason

    slow_steps = steps(CONFIG.max_iterations, 120.0, seed=2)
    reasons = feed(slow, "s", slow_steps[:8], chunk=4)  # iterations 1-4, then 5-8: look 0
    assert reasons[0] is None
    reason = reasons[1]
    assert reason is not None and re.match(r"\d+\.\d% slower than .* \[fast\] \(p=", reason)
    decisions = {(d.arm, d.look): d for d in test.decisions()}
    stop = decisions["slow", 0]
    assert (stop.action, stop.reference, stop.n_steady, stop.reason) == ("stop", "fast", 6, reason)
    assert stop.p_value < CONFIG.alpha_per_look
    assert decisions["fast", 0].action == "continue" and "best" in decisions["fast", 0].reason

    # the run ends at its next poll, whatever that poll brings
    assert slow("s", lines(slow_steps[8:10], start=9)) == reason
    assert slow("s", []) == reason
    assert len(test.decisions()) == 2
    # the fast arm is now the last one standing, past its first look
    assert fast("f", lines(steps(1, 100.0, seed=3), start=9)) == SETTLED


@pytest.mark.parametrize(
    ("make_line", "warm"),
    [
        (lambda i: lines([100.0], start=i, loss=math.nan)[0], True),
        (
            lambda i: lines([100.0], start=i)[0].replace(
                "nan iterations:   0", "nan iterations:   1"
            ),
            True,
        ),
        (lambda i: lines([math.nan], start=i)[0], False),
    ],
    ids=["nan-loss", "nan-iterations", "nan-step"],
)
def test_a_nan_stops_the_arm_at_once(make_line, warm):
    test = live("fast", "other")
    watch = test.watch("fast")
    good = steps(4, 100.0)
    # a NaN loss counts even in warm-up; a NaN step time only once steady
    at = 1 if warm else CONFIG.warmup_iterations + 2
    before = lines(good[: at - 1])
    reason = watch("a", [*before, make_line(at)])
    assert reason is not None and "NaN" in reason
    (stop,) = test.decisions()
    assert (stop.arm, stop.look, stop.action, stop.reason) == ("fast", 0, "stop", reason)
    assert watch("a", []) == reason


def test_a_nan_loss_after_good_lines_in_the_same_poll_stops():
    test = live("fast", "other")
    good = lines(steps(5, 100.0))
    bad = lines([100.0], start=6, loss=math.nan)
    reason = test.watch("fast")("a", good + bad)
    assert reason == "NaN loss or step time" and test.trace("fast").failure == "nan"


def test_a_blown_up_arm_stops_after_one_batch_before_any_look():
    test = live("fast", "slow")
    batch = CONFIG.warmup_iterations + CONFIG.batch_size
    assert feed(test.watch("fast"), "f", steps(batch, 100.0), chunk=batch) == [None]
    slow = test.watch("slow")
    slow_steps = steps(batch, 400.0, seed=4)
    assert slow("s", lines(slow_steps[:-1])) is None  # not a whole batch of steady steps yet
    reason = slow("s", lines(slow_steps[-1:], start=batch))
    assert reason is not None and reason.startswith("blow-up") and "4.0x" in reason
    (stop,) = test.decisions()
    assert (stop.arm, stop.look, stop.action, stop.reference) == ("slow", 0, "stop", "fast")
    assert stop.n_steady == CONFIG.batch_size and batch < 8  # look 0 needs 8 lines


def test_the_last_arm_standing_settles_after_its_first_look_and_wins():
    test = live("fast", "slow")
    first_look = CONFIG.warmup_iterations + CONFIG.look_iterations(0)
    fast = test.watch("fast")
    # alone at its first look: the other arm may still come, so it runs on
    assert set(feed(fast, "f", steps(first_look, 100.0, seed=1))) == {None}
    reasons = feed(test.watch("slow"), "s", steps(first_look, 120.0, seed=2))
    assert reasons[-1] is not None and "slower than" in reasons[-1]  # stopped at its first look
    assert fast("f", lines([100.0], start=first_look + 1)) == SETTLED

    test.end("fast", run_of("fast", STOPPED, "early-stop", SETTLED), None)
    test.end("slow", run_of("slow", STOPPED, "early-stop", reasons[-1]), None)
    final = test.finish()
    wins = [d for d in final if d.action == "win"]
    assert len(wins) == 1 and wins[0].arm == "fast" and wins[0].look == len(CONFIG.looks)
    assert not any(d.action == "stop" for d in final if d.arm == "fast")


def test_an_arm_run_to_its_budget_still_competes():
    """Settling needs every other arm stopped or failed: against an arm that ran its whole
    budget the final comparison needs this arm's whole budget too."""
    fast = steps(CONFIG.max_iterations, 100.0, seed=1)
    # first 6 steady steps 1% faster than fast but too noisy to be shown tied at the first look,
    # the next 6 2% slower: 0.5% slower over all
    other = steps(2, 100.0, seed=2) + steps(6, 99.0, seed=3, cv=0.03) + steps(6, 102.0, seed=4)
    test = live("fast", "other")
    feed(test.watch("fast"), "f", fast)
    assert feed(test.watch("other"), "o", other[:8], chunk=8) == [None]
    assert feed(test.watch("other"), "o", other[8:], chunk=6, start=9) == [None]
    assert next(d.arm for d in test.finish() if d.action == "win") == "fast"


ROUNDS = ABConfig(warmup_iterations=2, batch_size=3, looks=(2, 4, 8))  # budget 26 lines


def rounds(**predicted_ms):
    """A test whose arms run one round after another, predicted as given."""
    arms = [replace(make_arm(name), predicted_ms=ms) for name, ms in predicted_ms.items()]
    return LiveTest(arms, ROUNDS, HBM)


def test_in_rounds_the_first_arm_runs_only_as_far_as_the_arms_to_come_need():
    test = rounds(fast=100.0, other=100.3, slow=150.0)
    # 0.2% spread: the near tie is expected to be settled at the second look (4 batches)
    second_look = ROUNDS.warmup_iterations + ROUNDS.look_iterations(1)
    reasons = feed(test.watch("fast"), "f", steps(second_look, 100.0, seed=1), chunk=1)
    assert reasons[:-1] == [None] * (second_look - 1) and reasons[-1] == COVERED  # not 26
    # the next rounds meet fast's steps at their looks: a tie settled, a loser stopped
    tie = feed(test.watch("other"), "o", steps(second_look, 100.3, seed=2), chunk=1)
    assert any(reason is not None for reason in tie)
    reasons = feed(test.watch("slow"), "s", steps(second_look, 150.0, seed=3), chunk=second_look)
    assert "slower than" in reasons[-1]
    for name in ("fast", "other", "slow"):
        test.end(name, run_of(name, STOPPED, "early-stop", COVERED), None)
    wins = [d.arm for d in test.finish() if d.action == "win"]
    assert len(wins) == 1 and wins[0] in ("fast", "other")


def test_in_rounds_an_arm_to_come_on_the_margins_edge_keeps_the_first_one_to_its_budget():
    test = rounds(fast=100.0, other=102.0)
    reasons = feed(test.watch("fast"), "f", steps(ROUNDS.max_iterations, 100.0, seed=1), chunk=1)
    assert reasons == [None] * ROUNDS.max_iterations


def test_an_arm_ended_with_more_steps_keeps_the_next_one_running_as_long():
    test = rounds(fast=100.0, other=100.3)
    feed(test.watch("fast"), "f", steps(ROUNDS.max_iterations, 100.0, seed=1))  # its whole budget
    other = steps(ROUNDS.max_iterations, 101.0, seed=2, cv=0.03)  # too noisy to be settled early
    reasons = feed(test.watch("other"), "o", other, chunk=1)
    assert reasons == [None] * ROUNDS.max_iterations


def test_a_lone_arm_settles_only_after_its_first_look():
    test = live("fast")
    reasons = feed(test.watch("fast"), "f", steps(9, 100.0), chunk=1)
    assert reasons[:7] == [None] * 7 and reasons[7:] == [SETTLED, SETTLED]


# --- resumed arms, ends ------------------------------------------------------------------------


def test_preload_with_a_stop_records_it_and_with_settled_does_not():
    test = live("fast", "slow", "other")
    slow_steps = steps(8, 120.0)
    test.preload("slow", slow_steps, None, "20.0% slower than the best")
    (stop,) = test.decisions()
    assert (stop.arm, stop.look, stop.action, stop.reason) == (
        "slow",
        1,
        "stop",
        "20.0% slower than the best",
    )
    assert stop.n_steady == 6 and stop.mean_ms == pytest.approx(np.mean(slow_steps[2:]))
    assert test.trace("slow").steps_ms == tuple(slow_steps)
    assert test.watch("slow")("stored", []) == stop.reason

    test.preload("other", steps(8, 100.0, seed=2), None, SETTLED)
    test.preload("fast", steps(4, 100.0, seed=3), None, None)
    assert len(test.decisions()) == 1
    cost = test.cost("other", 8)
    assert cost.overhead_s == 0.0 and cost.steps_ms == tuple(steps(8, 100.0, seed=2))
    final = {d.arm: d for d in test.finish()}
    assert final["other"].action == "win" and "fast" not in final  # fast: too few steps
    assert final["slow"].action == "stop" and final["slow"].look == 1


@pytest.mark.parametrize(
    "stored",
    [
        SETTLED,
        COVERED,
        OLD_SETTLED,
        OLD_COVERED,
        "settled",
        "covered: in other words",
        " settled:x",
    ],
)
def test_preload_reads_a_stop_reason_by_its_code_whatever_its_words(stored):
    test = live("fast", "other")
    test.preload("other", steps(8, 100.0, seed=2), None, stored)
    assert test.decisions() == []  # ended, not lost
    test.preload("fast", steps(14, 100.0, seed=3), None, None)
    final = {d.arm: d.action for d in test.finish()}
    assert set(final) == {"fast", "other"} and "stop" not in final.values()


@pytest.mark.parametrize("stored", ["unsettled: x", "tied and settled", "covers: x", "hang: no"])
def test_preload_of_any_other_reason_is_a_stop(stored):
    test = live("fast", "other")
    test.preload("other", steps(8, 100.0, seed=2), None, stored)
    assert [(d.arm, d.action, d.reason) for d in test.decisions()] == [("other", "stop", stored)]


def test_preload_of_a_failed_arm_stops_it_at_the_final_look():
    test = live("fast", "other")
    test.preload("other", steps(3, 100.0), "oom", None)
    assert test.decisions() == []
    test.preload("fast", steps(14, 100.0), None, None)
    final = {d.arm: d for d in test.finish()}
    assert final["other"].action == "stop" and final["other"].reason == "out of memory"
    assert final["fast"].action == "win"


def test_end_with_a_failed_run_stops_the_arm_and_measured_memory_replaces_the_prediction():
    test = live("fast", "other")
    feed(test.watch("other"), "o", steps(4, 100.0))
    assert test.trace("other").headroom_gib == HBM - max(MEMORY)
    run = run_of("other", "infeasible", "oom", "CUDA out of memory")
    test.end("other", run, (60.0, 70.5, 65.0, 50.0))
    (stop,) = test.decisions()
    assert (stop.arm, stop.action, stop.reason) == ("other", "stop", "out of memory")
    trace = test.trace("other")
    assert trace.failure == "oom" and trace.headroom_gib == pytest.approx(HBM - 70.5)
    assert test.watch("other")("o", []) == "out of memory"


def test_end_of_a_good_run_only_measures_memory_and_a_stopped_arm_is_not_stopped_twice():
    test = live("fast", "slow")
    feed(test.watch("fast"), "f", steps(8, 100.0, seed=1))
    reason = feed(test.watch("slow"), "s", steps(8, 130.0, seed=2), chunk=8)[0]
    assert reason is not None
    before = test.decisions()
    test.end("slow", run_of("slow", STOPPED), None)
    test.end("fast", run_of("fast", FINISHED), (20.0, 21.0, 19.0, 18.0))
    assert test.decisions() == before
    assert test.trace("fast").headroom_gib == pytest.approx(HBM - 21.0)
    assert test.trace("slow").failure is None
    assert test.trace("slow").headroom_gib == HBM - max(MEMORY)  # no measurement: predicted


def test_end_of_a_run_that_failed_without_a_class_stops_with_its_status():
    test = live("fast", "other")
    test.end("other", run_of("other", "failed"), None)
    assert summary(test.decisions()) == [("other", 0, "stop")]
    assert test.decisions()[0].reason == "failed"


# --- cost --------------------------------------------------------------------------------------


class Clock:
    def __init__(self, now):
        self.now = now

    def __call__(self):
        return self.now


@pytest.fixture
def clock(monkeypatch):
    fake = Clock(100.0)
    monkeypatch.setattr(live_ab, "time", SimpleNamespace(monotonic=fake, time=time.time))
    return fake


def test_cost_rescales_steps_to_the_wall_clock(clock):
    test = live("fast", "other")
    watch = test.watch("fast")
    assert watch("a", []) is None  # launched at 100 s
    clock.now = 130.0
    watch("a", lines([500.0, 500.0, 500.0]))  # the first line seen 30 s after the launch
    clock.now = 140.0
    watch("a", lines([500.0, 500.0], start=4))
    cost = test.cost("fast", 8)
    assert cost.world_size == 8 and cost.budget_iterations == CONFIG.max_iterations
    assert cost.overhead_s == pytest.approx(30.0 - 2.5)  # the first step (500 ms x 5) ends it
    # 10 s of wall clock between the first and last lines for 4 x 500 ms printed: x5
    assert cost.steps_ms == pytest.approx((2500.0,) * 5)
    assert test.cost("other", 8).steps_ms == () and test.cost("other", 8).overhead_s == 0.0


def test_cost_without_wall_clock_progress_keeps_the_printed_steps(clock):
    test = live("fast", "other")
    watch = test.watch("fast")
    watch("a", [])
    clock.now = 105.0
    watch("a", lines([400.0, math.inf, 600.0]))  # all in one poll: no interval to rescale to
    cost = test.cost("fast", 4)
    assert cost.overhead_s == pytest.approx(5.0 - 0.4)  # less the first step
    assert cost.steps_ms[0] == 400.0 and cost.steps_ms[2] == 600.0


def test_a_retry_restarts_the_cost_clock(clock):
    test = live("fast", "other")
    watch = test.watch("fast")
    watch("a", [])
    clock.now = 150.0
    watch("a", lines([100.0]))
    clock.now = 200.0
    watch("b", [])
    clock.now = 210.0
    watch("b", lines([100.0]))
    assert test.cost("fast", 1).overhead_s == pytest.approx(10.0 - 0.1)


def test_spent_gpu_seconds_equal_the_wall_clock_held(clock):
    test = live("fast", "other")
    watch = test.watch("fast")
    watch("a", [])  # launched at 100 s
    clock.now = 130.0
    watch("a", lines([500.0, 500.0, 500.0]))
    clock.now = 140.0
    watch("a", lines([500.0, 500.0], start=4))
    spent, _ = gpu_seconds([test.cost("fast", 8)])
    assert spent == pytest.approx(8 * (140.0 - 100.0))  # GPUs held from launch to the last line


# --- decision order, the store, the test id ----------------------------------------------------


def test_decisions_are_in_the_order_made_and_a_stop_replaces_a_continue():
    test = live("fast", "slow")
    feed(test.watch("slow"), "s", steps(8, 125.0, seed=2))
    assert summary(test.decisions()) == [("slow", 0, "continue")]  # alone at look 0
    feed(test.watch("fast"), "f", steps(8, 100.0, seed=1))
    assert summary(test.decisions()) == [("fast", 0, "continue"), ("slow", 0, "stop")]
    assert feed(test.watch("fast"), "f", steps(6, 100.0, seed=3), start=9) == [SETTLED, SETTLED]
    final = test.finish()
    assert summary(final) == [
        ("fast", 0, "continue"),
        ("slow", 0, "stop"),
        ("fast", 1, "continue"),
        ("fast", 2, "win"),
    ]
    assert test.decisions() == final
    assert test.finish() == final  # judging again changes nothing


def test_write_decisions_adds_only_what_is_new(tmp_path):
    store = CostStore(tmp_path)
    test = live("fast", "slow")
    key = ab_test_id(list(test.arms.values()), CONFIG)
    runs = {"fast": "run-fast"}
    feed(test.watch("slow"), "s", steps(8, 125.0, seed=2))
    write_decisions(store, "study", key, test.decisions(), runs)
    feed(test.watch("fast"), "f", steps(8, 100.0, seed=1))
    for _ in range(2):
        write_decisions(store, "study", key, test.decisions(), runs)
    rows = store.read("decisions", study="study")
    assert len(rows) == 3 and rows.decision_id.is_unique
    assert set(rows.decision_id) == {
        f"{key}.slow.look0.continue",
        f"{key}.slow.look0.stop",
        f"{key}.fast.look0.continue",
    }
    by_id = rows.set_index("decision_id")
    assert by_id.loc[f"{key}.fast.look0.continue", "run_id"] == "run-fast"
    assert pd.isna(by_id.loc[f"{key}.slow.look0.stop", "run_id"])
    assert by_id.loc[f"{key}.slow.look0.stop", "layout"] == LAYOUTS["slow"]

    write_decisions(store, "study", key, test.finish(), runs)
    rows = store.read("decisions", study="study")
    assert len(rows) == 4 and rows.decision_id.is_unique
    assert f"{key}.fast.look2.win" in set(rows.decision_id)
    write_decisions(store, "study", key, test.finish(), runs)
    assert len(store.read("decisions", study="study")) == 4
    write_decisions(store, "other-study", key, test.finish(), runs)  # studies are separate
    assert len(store.read("decisions", study="other-study")) == 3


def test_test_id_is_stable_and_digests_arms_and_settings():
    arms = [make_arm("fast"), make_arm("slow", role=ArmRole.DEFAULT)]
    key = ab_test_id(arms, CONFIG)
    assert re.fullmatch(r"ab-[0-9a-f]{12}", key)
    assert key == ab_test_id([make_arm("fast"), make_arm("slow")], ABConfig(2, 3, (2, 4)))
    swapped = [arms[0], replace(arms[1], layout=Layout.parse(LAYOUTS["other"], 4))]
    changed = [
        ab_test_id(swapped, CONFIG),
        ab_test_id([replace(arms[0], name="best"), arms[1]], CONFIG),
        ab_test_id(arms[:1], CONFIG),
        ab_test_id(arms, replace(CONFIG, batch_size=4)),
        ab_test_id(arms, replace(CONFIG, margin=0.03)),
        ab_test_id(arms, CONFIG, extra="seq 8192"),
        ab_test_id([replace(arms[0], recompute=SELECTIVE), arms[1]], CONFIG),
    ]
    assert key not in changed and len(set(changed)) == len(changed)
    # what the search predicted is no part of the test's identity
    assert key == ab_test_id(
        [replace(arms[0], predicted_ms=1.0, predicted_memory_gib=(1.0,)), arms[1]], CONFIG
    )


SELECTIVE = ("--recompute-granularity", "selective", "--recompute-modules", "core_attn", "moe")


def test_each_arm_runs_its_own_recomputation_and_is_watched_by_the_test():
    arms = [replace(make_arm("fast"), recompute=SELECTIVE), make_arm("slow", role=ArmRole.DEFAULT)]
    test = LiveTest(arms, CONFIG, HBM)
    runs = arm_runs(test, "ab-key")
    assert [(r.layout, r.kind, r.source) for r in runs] == [
        (arms[0].layout, "ab", "ab-key:fast"),
        (arms[1].layout, "ab", "ab-key:slow"),
    ]
    assert runs[0].recompute == memory_settings(SELECTIVE) == arms[0].recompute_settings
    assert runs[0].recompute.recompute_flags() == SELECTIVE
    assert runs[1].recompute == PLAIN  # no flags: no recomputation
    assert runs[0].watch is not None and runs[0].watch("attempt-1", []) is None


# --- stored runs -------------------------------------------------------------------------------


def test_memory_per_stage_and_stored_steps_read_ingested_runs_only(tmp_path):
    store = CostStore(tmp_path)
    memory = [
        {"rank": 0, "pp_rank": 0, "max_allocated_mb": 1024.0},
        {"rank": 1, "pp_rank": 0, "max_allocated_mb": 2048.0},
        {"rank": 2, "pp_rank": 2, "max_allocated_mb": 512.0},
    ]
    iterations = [{"iteration": i, "elapsed_ms": 100.0 + i} for i in (3, 1, 2)]
    run = {"run_id": "r1", "content_hash": "h1", "status": "finished"}
    assert store.write_run(run, {"memory": memory, "iterations": iterations}, "s")
    stages = memory_per_stage(store, "s", "r1", 3)
    assert stages[0] == 2.0 and math.isnan(stages[1]) and stages[2] == 0.5
    assert stored_steps(store, "s", "r1") == [101.0, 102.0, 103.0]
    assert memory_per_stage(store, "s", "missing", 3) == ()
    assert stored_steps(store, "s", "missing") == []
    # data without its runs row (an ingest cut short) is not read
    store.write("memory", [{"run_id": "r2", "rank": 0, "pp_rank": 0, "max_allocated_mb": 9.0}], "s")
    assert memory_per_stage(store, "s", "r2", 1) == ()


# --- known problems ----------------------------------------------------------------------------


def test_measured_headroom_does_not_depend_on_which_stage_is_missing():
    test = live("fast", "other")
    test.end("fast", run_of("fast", FINISHED), (math.nan, 70.0, 60.0, 50.0))
    test.end("other", run_of("other", FINISHED), (70.0, math.nan, 60.0, 50.0))
    first, second = test.trace("fast").headroom_gib, test.trace("other").headroom_gib
    assert first == second or (math.isnan(first) and math.isnan(second))


# --- predictions and ties ----------------------------------------------------------------------


def test_an_arm_predicted_to_lose_by_far_is_looked_at_sooner():
    config = ABConfig(warmup_iterations=2, batch_size=3, looks=(4, 8))
    arms = [
        replace(make_arm("fast"), critical_stages=2, predicted_cv=0.01),
        replace(make_arm("slow", role=ArmRole.DEFAULT), predicted_ms=150.0, predicted_cv=0.01),
    ]
    test = LiveTest(arms, config, HBM)
    assert test.first_looks == {"slow": 2}
    early = config.warmup_iterations + 2 * config.batch_size  # 8 lines, not 14
    assert feed(test.watch("fast"), "f", steps(early, 100.0, seed=1)) == [None] * 3
    reasons = feed(test.watch("slow"), "s", steps(early, 130.0, seed=2), chunk=early)
    assert reasons[0] is not None and "slower than" in reasons[0]
    (stop,) = [d for d in test.decisions() if d.arm == "slow"]
    assert (stop.look, stop.n_steady, stop.reference) == (0, 6, "fast")
    assert test.trace("fast").critical_stages == 2
    # the survivor still waits for its own first look (12 steady steps) before it settles
    more = feed(test.watch("fast"), "f", steps(6, 100.0, seed=3), chunk=1, start=early + 1)
    assert more[:-1] == [None] * 5 and more[-1] == SETTLED


def test_a_tied_pair_stops_whichever_loses_the_tie_break_even_the_best():
    test = live("fast", "other", memory={"fast": (70.0,) * 4})  # headroom 10 against 30 GiB
    first_look = CONFIG.warmup_iterations + CONFIG.look_iterations(0)
    fast = test.watch("fast")
    feed(fast, "f", steps(first_look, 100.0, seed=1))
    reasons = feed(test.watch("other"), "o", steps(first_look, 100.4, seed=2))
    assert reasons[-1] == SETTLED  # the best stopped on the tie: the other is left alone
    decisions = {d.arm: d for d in test.decisions()}
    stop = decisions["fast"]
    assert (stop.action, stop.look, stop.reference) == ("stop", 0, "other")
    assert "cannot win the tie-break" in stop.reason and "10.0 GiB vs 30.0 GiB" in stop.reason
    assert fast("f", []) == stop.reason  # its run ends at its next poll
    test.end("fast", run_of("fast", STOPPED, "early-stop", stop.reason), None)
    test.end("other", run_of("other", STOPPED, "early-stop", SETTLED), None)
    assert next(d.arm for d in test.finish() if d.action == "win") == "other"
