"""``python -m ray_layout.tune``: the tune command's entry (``ray job submit -- python -m ...``);
its ``main`` is ``ray_layout.commands.tune.main``."""

import sys

from ray_layout.commands.guard import run_entry

if __name__ == "__main__":
    sys.exit(run_entry("ray_layout.commands.tune"))
