"""Reading one key of a Hugging Face ``config.json``: checked, bounded and defaulted, with a
one-line error naming the file, the key and its value; and what one family's file reads as.

Shared by :mod:`ray_layout.model.hf_config` and :mod:`ray_layout.model.hf_families`, so that
every family's keys are checked the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ray_layout.errors import ConfigError, quoted
from ray_layout.model.config_values import integer as config_integer
from ray_layout.model.fields import MAX_DIMENSION
from ray_layout.model.hf_flags import Defaults

if TYPE_CHECKING:
    from ray_layout.model.fields import ModelSpec

Raw = dict[str, Any]
Shape = Callable[[Raw, int, str], dict[str, Any]]  # (config, decoder layers, source) -> fields


_PLAIN = Defaults()  # a dense family's: rotary base 10000, epsilon 1e-6


def _no_flags(raw: Raw, model: ModelSpec, source: str) -> tuple[str, ...]:
    return ()


def _no_notes(raw: Raw, model: ModelSpec) -> tuple[str, ...]:
    return ()


def _as_is(raw: Raw) -> Raw:
    return raw


@dataclass(frozen=True)
class Family:
    """One ``model_type``: its shape as Megatron's model fields, its HF defaults, the Megatron
    flags it needs beyond router, rotary and norm (``flags``), what the tool cannot train or
    size as released (``notes``, one line each), and ``router_keys``: its router and rotary keys
    under the names :func:`hf_flags.training_flags` reads (MiniMax's ``use_routing_bias`` is
    ``topk_method: noaux_tc``)."""

    shape: Shape
    defaults: Defaults = _PLAIN
    flags: Callable[[Raw, ModelSpec, str], tuple[str, ...]] = _no_flags
    notes: Callable[[Raw, ModelSpec], tuple[str, ...]] = _no_notes
    router_keys: Callable[[Raw], Raw] = _as_is


def optional_int(
    raw: Raw,
    key: str,
    source: str,
    minimum: int = 1,
    maximum: int = MAX_DIMENSION,
    why: str = "",
) -> int | None:
    """``raw[key]`` as an int in ``[minimum, maximum]`` (``why``: where ``maximum`` comes from);
    None when the key is absent."""
    value = raw.get(key)
    if value is None:
        return None
    return config_integer(value, key, source, low=minimum, high=maximum, why=why)


def boolean(raw: Raw, key: str, source: str, default: bool = False) -> bool:
    value = raw.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ConfigError(f"{source}: {key} must be true or false, got {quoted(value)}")
    return value


def integer(
    raw: Raw,
    key: str,
    source: str,
    default: int | None = None,
    minimum: int = 1,
    maximum: int = MAX_DIMENSION,
    why: str = "",
) -> int:
    """``raw[key]`` checked; a missing key takes ``default`` or, without one, is an error."""
    value = optional_int(raw, key, source, minimum, maximum, why)
    if value is None and default is None:
        raise ConfigError(f"{source}: missing key {key}")
    return default if value is None else value


def experts(raw: Raw, experts_key: str, ffn_key: str, source: str) -> dict[str, int]:
    """The routed experts: how many, top-k, and each one's FFN width."""
    count = integer(raw, experts_key, source)
    topk = integer(raw, "num_experts_per_tok", source)
    if topk > count:
        raise ConfigError(
            f"{source}: num_experts_per_tok {topk} is more than {experts_key} {count}"
        )
    return {
        "num_experts": count,
        "moe_router_topk": topk,
        "moe_ffn_hidden_size": integer(raw, ffn_key, source),
    }


def layer_flags(raw: Raw, key: str, num_layers: int, source: str, allowed: tuple) -> list[Any]:
    """A per-layer list (``layer_types``, ``no_rope_layers``): one of ``allowed`` per layer."""
    value = raw[key]
    if not isinstance(value, list) or len(value) != num_layers:
        raise ConfigError(
            f"{source}: {key} must be a list of {num_layers} entries (one a layer), got "
            f"{quoted(value)}"
        )
    wrong = [v for v in value if v not in allowed or isinstance(v, bool | float)]
    if wrong:
        shown = ", ".join(str(a) for a in allowed)
        raise ConfigError(f"{source}: {key} entries must be {shown}, got {quoted(wrong[0])}")
    return value


def layer_indices(raw: Raw, key: str, num_layers: int, source: str) -> frozenset[int] | None:
    """A list of layer indices (``mlp_only_layers``, ``moe_layers``), each a layer of the model
    (another number is a typo); None when the key is absent."""
    value = raw.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or not all(type(i) is int for i in value):
        raise ConfigError(f"{source}: {key} must be a list of layer indices, got {quoted(value)}")
    outside = [i for i in value if not 0 <= i < num_layers]
    if outside:
        raise ConfigError(
            f"{source}: {key} entry {quoted(outside[0])} is not a layer of the {num_layers} "
            f"(0 to {num_layers - 1})"
        )
    return frozenset(value)
