"""megatron-core 0.16.1's own ``Timers`` as the oracle of Megatron's timer blocks.

It formats its strings on the CPU; only the cross-rank gather (an all-gather on the GPU) is
replaced by the table it would gather.  The parser's tests read what it writes, the writer's
tests write the same bytes.
"""

from __future__ import annotations

import pytest

ORACLE_MS = {  # timer -> ms per rank (0 where a rank has no value: Megatron leaves it out)
    "forward-backward": [1234.5, 1236.25, 1230.125, 1235.0],
    "forward-compute": [310.4, 0.0, 288.91, 402.0],
    "optimizer": [20.5, 20.1, 0.0, 19.75],
    "a-timer-name-of-forty-seven-characters-or-more-x": [1.0, 2.0, 3.0, 4.0],
}
ORACLE_INTERVAL = 10


def megatron_timers_string(option: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """The block megatron-core prints for ORACLE_MS under ``--timing-log-option option``."""
    torch = pytest.importorskip("torch")
    timers_module = pytest.importorskip("megatron.core.timers")
    names = list(ORACLE_MS)
    world = len(ORACLE_MS[names[0]])
    seconds = torch.tensor(
        [[ORACLE_MS[n][r] * ORACLE_INTERVAL / 1000 for n in names] for r in range(world)]
    )
    timers = timers_module.Timers(log_level=2, log_option=option)
    monkeypatch.setattr(timers, "_get_elapsed_time_all_ranks", lambda *_: seconds)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda *_: world)
    return timers.get_all_timers_string(names, normalizer=ORACLE_INTERVAL)
