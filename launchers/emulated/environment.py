"""The variables a launcher sets for an emulated rank besides torchrun's, kept apart from the
rank's code so that a launcher can name them without importing torch."""

PROFILE_ENV = "RAY_LAYOUT_HARDWARE_PROFILE"  # the hardware profile YAML (required)
NODE_ENV = "RAY_LAYOUT_NODE_RANK"  # the node the rank runs on (default: RANK // gpus_per_node)
