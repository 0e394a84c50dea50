"""How control leaves a command: its exit status (or why the reader does not have it), and
bash's ``exit``, ``return``, ``break``/``continue`` as exceptions the interpreter catches where
bash would."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Unknown:
    """A command's exit status the reader does not have, and why."""

    reason: str


Status = int | Unknown


class Exit(Exception):
    def __init__(self, status: Status, why: str) -> None:
        super().__init__(why)
        self.status, self.why = status, why


class Return(Exception):
    def __init__(self, status: Status) -> None:
        self.status = status


class Break(Exception):
    def __init__(self, levels: int, again: bool) -> None:
        self.levels, self.again = levels, again  # again: continue


class Uncertain(Exception):
    """Control left some outcomes of an unknown decision and not others (a ``break`` under an
    unknown ``if``): the enclosing loop or function is followed no further."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
