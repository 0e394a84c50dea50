"""The variables a launcher sets for an emulated rank besides torchrun's, kept apart from the
rank's code so that a launcher can name them without importing torch; and how a rank reads
them."""

import os

from ray_layout.errors import ConfigError

PROFILE_ENV = "RAY_LAYOUT_HARDWARE_PROFILE"  # the hardware profile YAML (required)
NODE_ENV = "RAY_LAYOUT_NODE_RANK"  # the node the rank runs on (default: RANK // gpus_per_node)


def env_int(name: str, default: int | None = None) -> int:
    """The rank's integer environment variable ``name`` (``default`` when unset), or one line."""
    text = os.environ.get(name)
    if text is None and default is not None:
        return default
    if text is None or not text.strip().isdigit():
        raise ConfigError(
            f"environment variable {name} must be a non-negative integer, got {text!r}"
        )
    return int(text)
