"""The emulated cluster a rank sleeps by: unit costs, HBM per GPU, time scale and noise.

A profile is a YAML file (schema: ``cluster_configs/hardware/h200_emulated.yaml``) that only the
emulated Megatron reads, never the tuner: the tuner has to find its costs by measuring.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from ray_layout.errors import ConfigError
from ray_layout.model.costs import FORMAT, UnitCosts, costs_from_dict
from ray_layout.model.spec import read_mapping

_PROFILE_NUMBERS = ("hbm_gib", "time_scale", "jitter_cv", "mtp_standalone_extra")
_POSITIVE_NUMBERS = frozenset({"hbm_gib", "time_scale"})


@dataclass(frozen=True)
class HardwareProfile:
    """An emulated cluster: unit costs in the planner's own format (so a fit of emulated runs can
    be compared with them field by field), HBM per GPU, the time scale and per-op noise."""

    name: str
    hbm_gib: float
    time_scale: float
    jitter_cv: float
    costs: UnitCosts  # mtp_standalone_factor = 1 + the profile's mtp_standalone_extra


def load_profile(path: str | Path) -> HardwareProfile:
    """Read a profile YAML (schema: ``cluster_configs/hardware/h200_emulated.yaml``); any problem
    is a one-line :class:`ConfigError` naming the file."""
    path = Path(path)
    source = str(path)
    raw = read_mapping(path, source)
    reserved = sorted({"format", "source", "mtp_standalone_factor"} & set(raw))
    if reserved:
        raise ConfigError(
            f"{source}: {', '.join(reserved)} is not a profile field (the profile has "
            "mtp_standalone_extra instead of a factor)"
        )
    numbers = {}
    for key in _PROFILE_NUMBERS:
        value = raw.pop(key, None)
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
        ):
            raise ConfigError(f"{source}: {key} must be a finite number, got {value!r}")
        if value < 0 or (key in _POSITIVE_NUMBERS and value == 0):
            bound = "> 0" if key in _POSITIVE_NUMBERS else ">= 0"
            raise ConfigError(f"{source}: {key} must be {bound}, got {value}")
        numbers[key] = float(value)
    name = raw.pop("name", path.stem)
    extra = numbers.pop("mtp_standalone_extra")
    costs = costs_from_dict(
        {"format": FORMAT, "source": "manual", "mtp_standalone_factor": 1 + extra, **raw},
        source=source,
    )
    return HardwareProfile(name=str(name), costs=costs, **numbers)
