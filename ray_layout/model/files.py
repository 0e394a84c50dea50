"""Every input file a user hands over (a CONFIG, a ``config.json``, COSTS.json, a hardware
profile, a launch script) read one way, so that each bad file is one ConfigError naming it.

A file is read only when it is a regular file of bounded size (a FIFO or ``/dev/zero`` would
block or never end, a sparse 9 GB file would fill memory), as strict UTF-8.  A YAML or JSON file
must be one mapping with text keys, each once (a repeated key silently taking the last value
hides a typo), and aliases may not expand past a bound (a "billion laughs" document is small on
disk and gigabytes once anything walks it).
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import Any, ClassVar

import yaml

from ray_layout.errors import ConfigError, clipped, quoted

MAX_INPUT_BYTES = 4_000_000  # a launch script, the largest kind of input
MAX_MAPPING_BYTES = 1_000_000  # a YAML or JSON input: parsing it stays under a few seconds
MAX_YAML_VALUES = 100_000  # values of a YAML document, an alias counted each time it is used
# A run log, of any size, is read this far: rank 0 prints what CONFIG needs at start-up.
LOG_OPENING_BYTES = 4_000_000

_KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def read_text(path: str | Path, source: str, *, limit: int = MAX_INPUT_BYTES) -> str:
    """The text of a regular file of at most ``limit`` bytes, decoded as strict UTF-8."""
    data = read_bytes(path, source, limit=limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ConfigError(f"{source}: not UTF-8 text at byte {exc.start} (line {line})") from None


def read_bytes(path: str | Path, source: str, *, limit: int = MAX_INPUT_BYTES) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes (a log, whose stray bytes its
    reader replaces, is read this way)."""
    data = _read(path, source, limit, whole=True)
    if len(data) > limit:
        raise ConfigError(f"{source}: more than the {limit:,} bytes an input file may hold")
    return data


def read_log_opening(path: str | Path, source: str, *, limit: int = LOG_OPENING_BYTES) -> str:
    """The first ``limit`` bytes of a regular file of any size, as text with stray bytes
    replaced: a training log grows without bound, what a run states at start-up is near its
    top."""
    return _read(path, source, limit, whole=False)[:limit].decode("utf-8", errors="replace")


def _read(path: str | Path, source: str, limit: int, *, whole: bool) -> bytes:
    """Up to ``limit`` + 1 bytes of a regular file (``whole``: of at most ``limit`` bytes)."""
    try:
        _check_regular(os.stat(path), source, limit, whole)
        # O_NONBLOCK: a FIFO swapped in after the stat opens at once instead of waiting for a
        # writer; fstat then refuses it.
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        with open(descriptor, "rb") as handle:
            _check_regular(os.fstat(handle.fileno()), source, limit, whole)
            return handle.read(limit + 1)  # /proc files say size 0: read no more than the cap
    except ConfigError:
        raise
    except OSError as exc:
        raise ConfigError(f"{source}: cannot read ({exc.strerror or exc})") from None
    except ValueError as exc:  # a NUL in the path
        raise ConfigError(f"{source}: cannot read ({exc})") from None


def _check_regular(info: os.stat_result, source: str, limit: int, whole: bool) -> None:
    kind = next((name for test, name in _KINDS if test(info.st_mode)), None)
    if kind is not None or not stat.S_ISREG(info.st_mode):
        how = "whole: a regular file of" if whole else "from a regular file,"
        raise ConfigError(
            f"{source}: {kind or 'a special file'}, not a regular file (an input file is read "
            f"{how} at most {limit:,} bytes)"
        )
    if whole and info.st_size > limit:
        raise ConfigError(
            f"{source}: {info.st_size:,} bytes, more than the {limit:,} an input file may hold"
        )


def read_mapping(path: str | Path, source: str) -> dict[str, Any]:
    """A YAML or JSON file's top-level mapping (JSON by a ``.json`` suffix in any case), or a
    one-line ConfigError naming ``source``."""
    is_json = Path(path).suffix.lower() == ".json"
    text = read_text(path, source, limit=MAX_MAPPING_BYTES)
    kind = "JSON" if is_json else "YAML"
    try:
        raw = _json(text, source) if is_json else _yaml(text, source)
    except ConfigError:
        raise
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = exc.problem or exc.context or "unreadable"
        raise ConfigError(f"{source}: not valid YAML: {clipped(problem)}{where}") from None
    except (ValueError, yaml.YAMLError) as exc:  # ValueError: JSON, or an int over 4,300 digits
        first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(f"{source}: not valid {kind}: {clipped(first_line)}") from None
    except RecursionError:
        raise ConfigError(f"{source}: nested too deeply") from None
    if not isinstance(raw, dict):
        expected = "a JSON object" if is_json else "a mapping"
        raise ConfigError(f"{source}: expected {expected} at the top level")
    return raw


def _json(text: str, source: str) -> Any:
    def mapping(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        result: dict[str, Any] = {}
        for key, value in pairs:
            if key in result:
                raise ConfigError(f"{source}: duplicate key {quoted(key)}")
            result[key] = value
        return result

    return json.loads(text, object_pairs_hook=mapping)


def _yaml(text: str, source: str) -> Any:
    loader = _BoundedLoader(text)
    loader.source = source
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


_INT, _FLOAT = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader that checks the composed document before building anything from it:
    its size with aliases expanded, and its keys.  A number is one only in plain decimal: YAML
    1.1 reads ``1_6`` and ``1:30`` as 16 and 90, ``016`` as octal 14 and ``0x10`` as 16, which
    no one writing a layer count means; those stay text, which the field's reader refuses."""

    source = "YAML"
    composed = 0
    yaml_implicit_resolvers: ClassVar[dict[str, list[tuple[str, re.Pattern[str]]]]] = {
        first: [(tag, pattern) for tag, pattern in resolvers if tag not in (_INT, _FLOAT)]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }

    def compose_node(self, parent: yaml.Node | None, index: object) -> yaml.Node:
        """Stop composing a document past the bound (an alias counts once here, so this only
        ends early what :meth:`_check` would refuse)."""
        self.composed += 1
        if self.composed > MAX_YAML_VALUES:
            self._too_many()
        return super().compose_node(parent, index)

    def _too_many(self) -> None:
        raise ConfigError(
            f"{self.source}: more than {MAX_YAML_VALUES:,} values (each use of an alias counted)"
        )

    def get_single_data(self) -> Any:
        node = self.get_single_node()
        if node is None:
            return None
        self._check(node)
        return self.construct_document(node)

    def _check(self, root: yaml.Node) -> None:
        """Walk the node graph as construction would (a shared node once per use), refusing it
        past MAX_YAML_VALUES (which a cycle always is) and any mapping with a key that is not
        text or comes twice."""
        stack, seen, values = [root], set(), 0
        while stack:
            node = stack.pop()
            values += 1
            if values > MAX_YAML_VALUES:
                self._too_many()
            if isinstance(node, yaml.MappingNode):
                if id(node) not in seen:
                    seen.add(id(node))
                    self._check_keys(node)
                stack += [n for pair in node.value for n in pair]
            elif isinstance(node, yaml.SequenceNode):
                stack += node.value

    def _check_keys(self, node: yaml.MappingNode) -> None:
        keys: set[str] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # <<: *base, which later keys override
                continue
            where = f"{self.source}:{key_node.start_mark.line + 1}"
            key = self.construct_object(key_node) if isinstance(key_node, yaml.ScalarNode) else None
            if not isinstance(key, str):
                shown = quoted(key) if isinstance(key_node, yaml.ScalarNode) else "a collection"
                raise ConfigError(f"{where}: key {shown} is not text (quote it if it is a name)")
            if key in keys:
                raise ConfigError(f"{where}: duplicate key {quoted(key)}")
            keys.add(key)


_BoundedLoader.add_implicit_resolver(
    _INT, re.compile(r"^[-+]?(?:0|[1-9][0-9]*)$"), list("-+0123456789")
)
_BoundedLoader.add_implicit_resolver(
    _FLOAT,
    re.compile(
        r"^(?:[-+]?(?:[0-9]+\.[0-9]*|\.[0-9]+)(?:[eE][-+][0-9]+)?|[-+]?\.(?:inf|Inf|INF)"
        r"|\.(?:nan|NaN|NAN))$"
    ),
    list("-+0123456789."),
)
