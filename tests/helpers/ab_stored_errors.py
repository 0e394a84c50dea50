"""A stopped run's error as stores written before :class:`~ray_layout.ab.vocabulary.StopReason`
hold it: a resume must read it the same, whatever the prose says now."""

from __future__ import annotations

OLD_SETTLED = (
    "settled: every other arm is stopped or failed, so more steps cannot change the verdict"
)
OLD_COVERED = (
    "covered: every other arm is stopped, failed or ended, and each arm yet to run is "
    "expected to be decided within the steps this arm ran"
)
