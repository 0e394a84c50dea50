"""The megatron-core backend's rank: megatron-core's own model, schedule and timers, on CPU.

    RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 \\
    python -m launchers.megatron_core_rank <the arguments pretrain_gpt.py gets>

It reads the ``pretrain_gpt.py`` command line the real backend builds (with the project's flag
table), applies megatron-core 0.16.1's CPU adaptations (``launchers.megatron_core.cpu_adaptations``,
only in this process), builds ``GPTModel`` per virtual stage with the local layer specs, trains with
``get_forward_backward_func()`` and a real optimizer step, and prints Megatron's training log.
Its times are CPU times on a logical clock (``launchers.megatron_core.logical_clock``): they prove
code paths and the tuning loop, never GPU speed.  Code: ``launchers/megatron_core/``.
"""

import sys

from launchers.megatron_core.rank_main import main

if __name__ == "__main__":
    sys.exit(main())
