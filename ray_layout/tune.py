"""``python -m ray_layout.tune``: the tune command's entry (``ray job submit -- python -m ...``)."""

import sys

from ray_layout.commands.tune import main

if __name__ == "__main__":
    sys.exit(main())
