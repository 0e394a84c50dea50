"""The A/B test's words as types: what an arm is there for, how it ended, what a look decided.

String enums, so the values are the very strings the store, JSON and the report already hold.
"""

from enum import StrEnum


class ArmRole(StrEnum):
    """Why an arm is in the test; one arm may hold several roles (a candidate that is a baseline)."""

    CANDIDATE = "candidate"
    DEFAULT = "Megatron default"
    COUNT_BASED = "count-based rule"


class ArmStatus(StrEnum):
    """How an arm ended, as the report shows it."""

    WON = "won"
    LOST = "lost"
    STOPPED = "stopped"
    FAILED = "failed"
    NOT_RUN = "not run"


class ABAction(StrEnum):
    """What one look decided for one arm."""

    CONTINUE = "continue"
    STOP = "stop"
    WIN = "win"
    LOSE = "lose"
