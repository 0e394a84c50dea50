"""One flag of a Megatron fork's parser, as a table row: how argparse takes it and what it does
to the model, so that a fork's flags are read, passed on or refused from one table, not ifs."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

# "read": it changes the model and is sized here; "none": it does not change the model's size
# (passed on as written); "refused": it changes the model in a way this tool does not model.
Effect = Literal["read", "none", "refused"]
# argparse's shape of the value: a switch, one value of a type, or one or more of a type.
Kind = Literal["switch", "int", "float", "str", "ints", "strs"]

_NARGS: dict[str, Any] = {"switch": 0, "int": None, "float": None, "str": None}
_TYPES = {"switch": None, "int": "int", "float": "float", "str": "str", "ints": "int"}


@dataclass(frozen=True)
class DialectFlag:
    """A fork's flag: ``meaning`` says what the fork's source does with it (one line)."""

    name: str  # "--noop-layers"
    kind: Kind
    effect: Effect
    meaning: str
    choices: tuple[str, ...] | None = None
    dest: str | None = None  # argparse's dest; by default the name's
    marks: bool = True  # its presence says the dialect (False where another fork has it too)
    default: Any = None

    @property
    def key(self) -> str:
        """The dest the parsed flags hold it under."""
        return self.dest or self.name.lstrip("-").replace("-", "_")

    def entry(self) -> dict[str, Any]:
        """The flag as an argparse entry of ``megatron_args.walk_flags``' table."""
        return {
            "flags": [self.name],
            "dest": self.key,
            "nargs": _NARGS.get(self.kind, "+"),
            "type": _TYPES.get(self.kind, "str"),
            "choices": list(self.choices) if self.choices else None,
            "default": self.default,
        }


# A flag no table knows, whose name speaks of the model's shape: an error, since the model may be
# other than the one sized (one that the tables know to be harmless is listed as "none").
_SHAPE_WORDS = re.compile(
    r"(^|-)(layers?|hidden|heads?|experts?|vocab|ffn|intermediate|embeddings?|dims?|rank|"
    r"width|mlp|kv|lora|mamba|depth)(-|$)"
)
# ... and flags of an RL framework's inference engine (slime's --sglang-*, --rollout-*), which
# serve the model the trainer builds
_HARMLESS = re.compile(
    r"(^|-)(log|logging|tensorboard|wandb|profile|save|load|recompute|sglang|vllm|rollout)(-|$)"
)


def looks_like_shape(flag: str) -> bool:
    """Whether a flag no table knows may change the model's size, by its name."""
    name = flag.lstrip("-").lower().replace("_", "-")
    return bool(_SHAPE_WORDS.search(name)) and not _HARMLESS.search(name)


def sized(name: str, kind: Kind, meaning: str, **facts: Any) -> DialectFlag:
    """A flag that changes the model, read into this project's fields."""
    return DialectFlag(name, kind, "read", meaning, **facts)


def passed(name: str, kind: Kind, meaning: str, **facts: Any) -> DialectFlag:
    """A flag that leaves the model's size alone: passed on as written."""
    return DialectFlag(name, kind, "none", meaning, **facts)


def refused(name: str, kind: Kind, meaning: str, **facts: Any) -> DialectFlag:
    """A flag that changes the model in a way this tool does not model: an error when set."""
    return DialectFlag(name, kind, "refused", meaning, **facts)
