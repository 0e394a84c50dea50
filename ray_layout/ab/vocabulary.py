"""The A/B test's words as types: what an arm is there for, how it ended, what a look decided,
why an arm may end before its budget without losing.

String enums, so the values are the very strings the store, JSON and the report already hold.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum

from ray_layout.model.baselines import BaselineName

ROLE_JOIN = " + "  # how an arm with several roles is shown: "candidate + Megatron default"


class ArmRole(StrEnum):
    """Why an arm is in the test; one arm may hold several (a candidate that is a baseline).  A
    baseline's role has its :class:`BaselineName`'s value: the store and the report hold one
    name for both."""

    CANDIDATE = "candidate"
    CURRENT = BaselineName.CURRENT.value
    DEFAULT = BaselineName.DEFAULT.value
    COUNT_BASED = BaselineName.COUNT_BASED.value

    @classmethod
    def of(cls, baseline: BaselineName) -> ArmRole:
        """The role of the arm that runs ``baseline``."""
        return cls(baseline.value)

    @property
    def baseline(self) -> BaselineName | None:
        """The baseline this role runs; None for a candidate."""
        return None if self is ArmRole.CANDIDATE else BaselineName(self.value)


class ArmStatus(StrEnum):
    """How an arm ended, as the report shows it."""

    WON = "won"
    LOST = "lost"
    STOPPED = "stopped"
    FAILED = "failed"
    FINISHED = "finished"  # ran, but too few steps for any verdict
    NOT_RUN = "not run"

    @property
    def ended_early(self) -> bool:
        """Stopped by the test or by a failure before its budget."""
        return self in (ArmStatus.STOPPED, ArmStatus.FAILED)


class ABAction(StrEnum):
    """What one look decided for one arm."""

    CONTINUE = "continue"
    STOP = "stop"
    WIN = "win"
    LOSE = "lose"

    @property
    def is_terminal(self) -> bool:
        """After a stop, a win or a loss the arm gets no more decisions."""
        return self is not ABAction.CONTINUE

    @property
    def status(self) -> ArmStatus:
        """The arm's status when this was its last decision (a continue: it ran to its end)."""
        return _STATUS_AFTER[self]


_STATUS_AFTER = {
    ABAction.CONTINUE: ArmStatus.FINISHED,
    ABAction.STOP: ArmStatus.STOPPED,
    ABAction.WIN: ArmStatus.WON,
    ABAction.LOSE: ArmStatus.LOST,
}


def role_label(roles: Iterable[ArmRole]) -> str:
    """Several roles as one label, in the order given."""
    return ROLE_JOIN.join(roles)


class StopReason(StrEnum):
    """Why the last arm standing ends before its budget though no look stopped it: more of its
    steps cannot change the verdict, so a resumed test counts it "not a loss".  The run's stored
    error is :attr:`text`, the code first; a resume reads the code back (:meth:`of`) and never
    compares the prose, so rewording it changes no verdict."""

    SETTLED = "settled"
    COVERED = "covered"

    @property
    def text(self) -> str:
        """What the run's error says: ``"<code>: <why>"``."""
        return f"{self.value}: {_STOP_PROSE[self]}"

    @classmethod
    def of(cls, error: str | None) -> StopReason | None:
        """The reason whose code heads a stored error (``"settled: ..."``, or the bare code);
        None for every other error, a real stop."""
        try:
            return cls((error or "").partition(":")[0].strip())
        except ValueError:
            return None


_STOP_PROSE = {
    StopReason.SETTLED: "every other arm is stopped or failed, so more steps cannot change the "
    "verdict",
    StopReason.COVERED: "every other arm is stopped, failed or ended, and each arm yet to run is "
    "expected to be decided within the steps this arm ran",
}
