"""The shell reader's one error: a script it refuses, in one line naming the construct, its line
and what would settle it (``--env NAME=VALUE``, an argument after ``--``)."""

from __future__ import annotations


class ShellError(Exception):
    """A script this reader refuses: read wrong it would plan for another model."""
