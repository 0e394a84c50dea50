"""``python -m ray_layout``: every command but the tune (``ray_layout.commands.main``)."""

from ray_layout.commands.guard import run_entry

raise SystemExit(run_entry("ray_layout.commands.main"))
