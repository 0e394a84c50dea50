"""Which recomputation the tune searches: the job's own setting alone (``--recompute job``), or
layout and recompute setting together (``search.recompute_search``), asked for with
``--recompute auto`` or taken when the job's own setting fits no layout under the HBM limit, as
an A/B of layouts that cannot run would measure nothing.  The arms are then ranked from the
pairs, and the baselines stay what the user runs today: their layouts under the job's own
flags."""

from __future__ import annotations

from collections.abc import Callable

from ray_layout.errors import ConfigError
from search.planner import MapShards, Plan, Problem
from search.recompute_search import searched_plan


def recompute_search(
    problem: Problem,
    mode: str,
    progress: Callable[[str], None] | None = None,
    map_shards: MapShards | None = None,
) -> tuple[Plan, str]:
    """The plan the tune chooses its arms from (``mode``: ``--recompute``'s job or auto), and
    why it searched layout x recompute (empty where it searched the job's own setting alone); a
    one-line :class:`ConfigError` where no layout fits under any setting."""
    found, joint, why = searched_plan(problem, mode, progress, map_shards)
    if joint is None:
        return found, ""
    if not found.candidates:
        raise ConfigError(
            f"no layout fits in {problem.options.hbm_gib:g} GiB under any recompute setting (the "
            f"smallest peak of any layout scored is {found.smallest_peak_gib:,.1f} GiB): more EP "
            "or TP, or a smaller micro-batch lowers it"
        )
    return found, f"{why}: searched layout x recompute"
