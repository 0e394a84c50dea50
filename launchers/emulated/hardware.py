"""The emulated cluster a rank sleeps by: unit costs, HBM per GPU, time scale and noise.

A profile is a YAML file (schema: ``cluster_configs/hardware/h200_emulated.yaml``) that only the
emulated Megatron reads, never the tuner: the tuner has to find its costs by measuring.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ray_layout.errors import ConfigError, quoted
from ray_layout.model.config_values import Bound
from ray_layout.model.costs import FORMAT, UnitCosts, costs_from_dict
from ray_layout.model.files import read_mapping

# The profile the emulated backend uses by default, found from the package wherever it runs.
BUNDLED_PROFILE = (
    Path(__file__).resolve().parents[2] / "cluster_configs/hardware/h200_emulated.yaml"
)

_PROFILE_BOUNDS = {
    "hbm_gib": Bound(1e-3, 1024.0, " GiB"),
    "time_scale": Bound(1e-4, 100.0),  # real seconds per emulated second
    "jitter_cv": Bound(0.0, 1.0),
    "mtp_standalone_extra": Bound(0.0, 3.0),  # the factor's bounds, less 1
}


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
    numbers = {
        key: bound.check(raw.pop(key, None), key, source) for key, bound in _PROFILE_BOUNDS.items()
    }
    name = raw.pop("name", path.stem)
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{source}: name must be a non-empty string, got {quoted(name)}")
    extra = numbers.pop("mtp_standalone_extra")
    costs = costs_from_dict(
        {"format": FORMAT, "source": "manual", "mtp_standalone_factor": 1 + extra, **raw},
        source=source,
    )
    return HardwareProfile(name=name, costs=costs, **numbers)
