"""Load a Megatron-LM ``pretrain_gpt.py`` command line, given as text or as a bash launch script.

The script is read, not run: backslash continuations, comments, ``NAME=value`` / ``export``
assignments and bash arrays are followed so that ``$NAME``, ``${NAME}``, ``${NAME:-default}`` and
``${ARRAY[@]}`` become what bash would pass.  Command substitution, arithmetic and control flow are
not evaluated; a variable set that way (or not set in the script at all) stays unresolved, which is
an error only where a flag this tool needs depends on it.  The flags are checked against the
argparse table of megatron-core 0.16.1, so a typo is an error rather than an ignored setting.

Megatron takes the world size from the launcher, so DP comes from torchrun's ``--nproc_per_node``
and ``--nnodes`` when the command has them; otherwise it is the smallest DP that Megatron's expert
grid allows (1 without expert parallelism), to be overridden once the real world size is known.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from typing import Any

from ray_layout.errors import ConfigError, LayoutError
from ray_layout.model.layout import parse_stages
from ray_layout.model.spec import MODEL_KEYS, Recipe, build_recipe

_FLAG_TABLE = Path(__file__).parent / "data" / "megatron_args_core_v0.16.1.json"

_SEPARATORS = frozenset({"\n", ";", ";;", "&", "&&", "|", "||", "(", ")"})
_REDIRECTIONS = frozenset({">", ">>", ">&", "&>", "<", "<&", "<<"})
_OPERATOR = re.compile(r"&&|\|\||;;|>>|>&|&>|<&|<<|[;&|<>()]")
_PUNCTUATION = frozenset("();<>|&")
_ASSIGNMENT = re.compile(r"([A-Za-z_]\w*)(\+?)=(.*)", re.DOTALL)
_DECLARATIONS = frozenset({"export", "declare", "typeset", "local", "readonly"})
_REFERENCE = re.compile(r"\$(?:\{(\w+)(?:\[[@*]\])?(?:(:?)-([^}]*))?\}|(\w+))")
_LEFTOVER = re.compile(r"\$\([^)]*\)?|\$\{?\w+")
_NEGATIVE_NUMBER = re.compile(r"-\d+|-\d*\.\d+")
_CONVERTERS = {"int": int, "float": float, "str": str, None: str}

_PARALLEL_FIELDS = {
    "tensor_model_parallel_size": "tp",
    "pipeline_model_parallel_size": "pp",
    "num_virtual_stages_per_pipeline_rank": "vpp",
    "context_parallel_size": "cp",
    "expert_model_parallel_size": "ep",
    "expert_tensor_parallel_size": "etp",
    "micro_batch_size": "micro_batch_size",
    "global_batch_size": "global_batch_size",
    "use_distributed_optimizer": "use_distributed_optimizer",
}
# Megatron's defaults for these differ from this project's (which follow modern MoE models), so a
# command line that leaves them out means what Megatron means: taken from the flag table.
_MEGATRON_DEFAULTS = (
    "swiglu",
    "normalization",
    "add_bias_linear",
    "position_embedding_type",
    "group_query_attention",
    "num_query_groups",
    "kv_lora_rank",
    "qk_head_dim",
    "qk_pos_emb_head_dim",
    "v_head_dim",
    "use_distributed_optimizer",
)
_REQUIRED = ("num_layers", "hidden_size", "num_attention_heads", "seq_length")
_DIVISORS = (  # sizes this module divides by; build_recipe checks the others
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
    "context_parallel_size",
    "expert_model_parallel_size",
    "expert_tensor_parallel_size",
    "num_layers_per_virtual_pipeline_stage",
)
_USED = MODEL_KEYS | set(_PARALLEL_FIELDS) | {"num_layers_per_virtual_pipeline_stage"}
_LAUNCHER_SIZES = {"--nproc_per_node": "nproc", "--nproc-per-node": "nproc", "--nnodes": "nnodes"}


FlagTable = dict[str, dict[str, Any]]  # option string -> argparse entry


@cache
def megatron_flag_table() -> FlagTable:
    """Every option string of Megatron's parser -> its argparse entry (dest, nargs, type, choices,
    default), as dumped from megatron-core 0.16.1.  Cached: treat it as read-only."""
    entries = json.loads(_FLAG_TABLE.read_text())
    return {flag: entry for entry in entries for flag in entry["flags"]}


def load_megatron_command_line(text: str, source: str = "command line") -> Recipe:
    """A recipe from the text of a ``pretrain_gpt.py`` command line (or a whole launch script)."""
    return _load(text, source, name="megatron-cmdline")


def load_megatron_script(path: str | Path) -> Recipe:
    """A recipe from a bash launch script that runs ``pretrain_gpt.py``; named after the script."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror})") from None
    return _load(text, str(path), name=path.stem)


def _load(text: str, source: str, name: str) -> Recipe:
    """The recipe, carrying the script's flags as the user's own (``Recipe.megatron_args``):
    a profiling run is the user's job, shell words no flag takes left out; and what the script
    exports (``Recipe.environment``: NCCL and CUDA settings change what a run measures)."""
    commands, exported = _commands(_shell_tokens(text, source), source)
    launcher, arguments = _split_at_script(commands)
    recipe = _recipe(parse_flags(arguments, source), _world_size(launcher, source), name, source)
    flags = [
        w for use in walk_flags(arguments, source, strict=False) for w in (use.flag, *use.values)
    ]
    environment = tuple(sorted((k, v) for k, v in exported.items() if v is not None))
    unresolved = tuple(sorted(k for k, v in exported.items() if v is None))
    return replace(recipe, megatron_args=tuple(flags), environment=environment,
                   unresolved_environment=unresolved)  # fmt: skip


def _shell_tokens(text: str, source: str) -> list[str]:
    """Words and operators of the script, a ``"\\n"`` token ending each logical line.

    A line whose tokenising fails on a trailing backslash continues on the next line (bash drops
    the backslash-newline); one that fails on an open quote goes on with its newline kept.  A
    backslash inside a comment continues nothing, as in bash.
    """
    tokens: list[str] = []
    pending = ""
    for line in [*text.splitlines(), ""]:  # the empty line flushes a continuation at the end
        line = pending + line
        try:
            words = _split_line(line)
        except ValueError:
            pending = line[:-1] if line.endswith("\\") else line + "\n"
            continue
        pending = ""
        tokens += [*words, "\n"]
    if pending:
        raise ConfigError(f"{source}: a quotation is never closed")
    return _fold_substitutions(tokens, source)


def _split_line(line: str) -> list[str]:
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True  # comments stay on: "#" starts one, as shlex.split(comments=True)
    tokens: list[str] = []
    for token in lexer:
        operators = token and set(token) <= _PUNCTUATION
        tokens += _OPERATOR.findall(token) if operators else [token]
    return tokens


def _fold_substitutions(tokens: list[str], source: str) -> list[str]:
    """``$(...)`` and ``$((...))`` as one word that stays unresolved: the script is not run."""
    folded: list[str] = []
    i = 0
    while i < len(tokens):
        token, i = tokens[i], i + 1
        if token.endswith("$") and i < len(tokens) and tokens[i] == "(":
            token, i = token + "(...)", _after_parentheses(tokens, i, source)
        folded.append(token)
    return folded


def _commands(tokens: list[str], source: str) -> tuple[list[list[str]], dict[str, str | None]]:
    """Follow the script's assignments; return its commands with variables expanded, and what
    it exports: each name's plain value, or None where it has none (a substitution, an array)."""
    variables: dict[str, str | tuple[str, ...]] = {}
    commands: list[list[str]] = [[]]
    exported: list[str] = []
    exporting = False
    i = 0
    while i < len(tokens):
        token, i = tokens[i], i + 1
        assignment = None if commands[-1] else _ASSIGNMENT.fullmatch(token)
        if token in _SEPARATORS:
            commands.append([])
            exporting = False
        elif token in _REDIRECTIONS:
            i += 1  # the redirection's target is not an argument
        elif assignment and not assignment[3] and i < len(tokens) and tokens[i] == "(":
            end = _after_parentheses(tokens, i, source)
            items = tuple(
                word for t in tokens[i + 1 : end - 1] if t != "\n" for word in _expand(t, variables)
            )
            _assign(variables, assignment[1], items, append=bool(assignment[2]))
            i = end
        elif assignment:
            value = _substitute(assignment[3], variables)
            _assign(variables, assignment[1], value, append=bool(assignment[2]))
            exported += [assignment[1]] if exporting else []
        elif exporting and re.fullmatch(r"[A-Za-z_]\w*", token):
            exported.append(token)  # `export NAME` of a variable set before
        elif token not in _DECLARATIONS or commands[-1]:  # `export A=1` assigns like `A=1`
            commands[-1] += _expand(token, variables)
        else:
            exporting = token == "export"
    values = {name: variables.get(name) for name in exported}
    plain = {name: value if isinstance(value, str) else None for name, value in values.items()}
    return [command for command in commands if command], plain


def _after_parentheses(tokens: list[str], start: int, source: str) -> int:
    """The index after the ``)`` that closes the ``(`` at ``tokens[start]``."""
    depth = 0
    for j in range(start, len(tokens)):
        depth += (tokens[j] == "(") - (tokens[j] == ")")
        if depth == 0:
            return j + 1
    raise ConfigError(f"{source}: a '(' is never closed")


def _assign(
    variables: dict[str, str | tuple[str, ...]],
    name: str,
    value: str | tuple[str, ...],
    *,
    append: bool,
) -> None:
    if isinstance(value, str) and _leftover(value):
        variables.pop(name, None)  # left unset, so a flag that uses it names this variable
        return
    old = variables.get(name, "") if append else ""
    if isinstance(old, str) and isinstance(value, str):
        variables[name] = old + value
    else:
        variables[name] = _elements(old) + _elements(value)


def _elements(value: str | tuple[str, ...]) -> tuple[str, ...]:
    if isinstance(value, tuple):
        return value
    return (value,) if value else ()


def _expand(word: str, variables: dict[str, str | tuple[str, ...]]) -> list[str]:
    """An unquoted word as bash passes it: a lone variable splits into its words or elements."""
    whole = _REFERENCE.fullmatch(word)
    name = whole and (whole[1] or whole[4])
    if name in variables and not (whole[2] and not variables[name]):
        value = variables[name]
        return list(value) if isinstance(value, tuple) else value.split()
    return [_substitute(word, variables)]


def _substitute(text: str, variables: dict[str, str | tuple[str, ...]]) -> str:
    def replace(match: re.Match[str]) -> str:
        name, colon, default = match[1] or match[4], match[2], match[3]
        value = variables.get(name)
        if value is None or (colon and not value):
            return match[0] if default is None else default
        return value if isinstance(value, str) else " ".join(value)

    return _REFERENCE.sub(replace, text)


def _leftover(text: str) -> str | None:
    """The first variable or substitution the script could not resolve in ``text``, if any."""
    match = _LEFTOVER.search(text)
    return match and match[0].replace("{", "")


def _unresolved(source: str, flag: str, reference: str) -> ConfigError:
    return ConfigError(f"{source}: {flag} uses {reference}, which has no plain value in the script")


def _split_at_script(commands: list[list[str]]) -> tuple[list[str], list[str]]:
    """(launcher words, script arguments): the words before and after ``pretrain_gpt.py`` (else
    the first ``*.py``) in its command; without a script name every word is an argument."""
    scripts = [(c, j) for c in commands for j, word in enumerate(c) if word.endswith(".py")]
    if not scripts:
        return [], [word for command in commands for word in command]
    named = [(c, j) for c, j in scripts if Path(c[j]).name == "pretrain_gpt.py"]
    command, j = (named or scripts)[0]
    return command[:j], command[j + 1 :]


@dataclass(frozen=True)
class FlagUse:
    """One option of a command line as Megatron's argparse takes it."""

    flag: str  # the option string as written, before any "="
    entry: dict[str, Any]  # its argparse entry in the flag table
    values: tuple[str, ...]  # the words it takes; none for a switch


def walk_flags(
    words: Sequence[str], source: str, *, strict: bool, table: FlagTable | None = None
) -> Iterator[FlagUse]:
    """Walk ``words`` as Megatron's argparse does (``table``: the bundled one unless given): each
    option with the words it takes.

    Raises :class:`ConfigError` (prefixed by ``source``) at an unknown flag, a value given to a
    switch or too few values.  A word that no option takes is an error when ``strict``; otherwise
    it is skipped, as a launch script leaves shell words around (the ``2`` of ``2>&1``).
    """
    table = table or megatron_flag_table()
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        flag, has_inline, inline = word.partition("=")
        if not flag.startswith("--"):
            if not strict:
                continue
            if not flag.startswith("-"):
                raise ConfigError(
                    f"{source}: argument {word!r} is not a flag and follows no flag that takes it"
                )
        entry = table.get(flag)
        if entry is None:
            raise ConfigError(f"{source}: unknown Megatron flag {flag}")
        nargs = entry["nargs"]
        if nargs == 0:
            if has_inline:
                raise ConfigError(f"{source}: {flag} takes no value, got {word!r}")
            yield FlagUse(flag, entry, ())
            continue
        least, most = _arity(nargs)
        if has_inline:
            values = [inline]
        else:
            end = i
            while end < len(words) and (most is None or end - i < most) and _is_value(words[end]):
                end += 1
            values, i = list(words[i:end]), end
        if len(values) < least:
            count = f"{'at least ' if most is None else ''}{least} value{'s' * (least > 1)}"
            raise ConfigError(f"{source}: {flag} expects {count}, got {len(values)}")
        yield FlagUse(flag, entry, tuple(values))


def typed_value(use: FlagUse, text: str, source: str) -> Any:
    """The value argparse would store for one of ``use``'s words; Megatron's own converters
    (moe_freq_type, enums, ...) are not in the flag table, so their values keep their text.
    Raises :class:`ConfigError` for a value of the wrong type or outside the flag's choices."""
    entry = use.entry
    convert = _CONVERTERS.get(entry["type"])
    if convert is None:
        return text
    try:
        value = convert(text)
    except ValueError:
        raise ConfigError(
            f"{source}: {use.flag} needs a value of type {entry['type']}, got {text!r}"
        ) from None
    if entry["choices"] is not None and value not in entry["choices"]:
        choices = ", ".join(map(str, entry["choices"]))
        raise ConfigError(f"{source}: {use.flag} must be one of {choices}, got {text!r}")
    return value


def check_arguments(args: Sequence[str], source: str, table: FlagTable | None = None) -> None:
    """Walk ``args`` as Megatron's argparse would and raise :class:`ConfigError` at the first
    unknown flag, stray word, wrong number of values, value of the wrong type or value outside
    the flag's choices.  Values of Megatron's own converters (``--moe-layer-freq``, enums, ...)
    are not in the flag table and are not checked."""
    for use in walk_flags(args, source, strict=True, table=table):
        for text in use.values:
            typed_value(use, text, source)


def parse_flags(words: Sequence[str], source: str) -> dict[str, Any]:
    """Megatron's argparse over a script's arguments: dest -> typed value, the last one winning.

    Words that no flag takes are skipped; a value that depends on a variable the script could not
    resolve keeps its text (an error only for a flag this tool uses, see :func:`_recipe`).
    """
    parsed: dict[str, Any] = {}
    for use in walk_flags(words, source, strict=False):
        entry = use.entry
        if entry["nargs"] == 0:
            parsed[entry["dest"]] = _switch(use.flag, entry)
            continue
        values = [
            text if _leftover(text) else typed_value(use, text, source) for text in use.values
        ]
        parsed[entry["dest"]] = values[0] if entry["nargs"] is None else values
    return parsed


def _arity(nargs: int | str | None) -> tuple[int, int | None]:
    """argparse's nargs as (fewest, most) values; None for no upper bound."""
    if nargs is None:
        return 1, 1
    if isinstance(nargs, int):
        return nargs, nargs
    return {"?": (0, 1), "*": (0, None), "+": (1, None)}[nargs]


def _is_value(word: str) -> bool:
    """Whether argparse would take ``word`` as a value rather than as the next option."""
    return not word.startswith("-") or bool(_NEGATIVE_NUMBER.fullmatch(word))


def _switch(flag: str, entry: dict[str, Any]) -> bool:
    """store_true/store_false store ``not default``; BooleanOptionalAction pairs --x with --no-x."""
    if flag.startswith("--no-") and f"--{flag[5:]}" in entry["flags"]:
        return False
    if f"--no-{flag[2:]}" in entry["flags"]:
        return True
    return not entry["default"]


def _world_size(launcher: list[str], source: str) -> int | None:
    """Processes started by torchrun's --nproc_per_node and --nnodes; None when neither is given."""
    sizes: dict[str, int] = {}
    for i, word in enumerate(launcher):
        flag, has_inline, inline = word.partition("=")
        if flag in _LAUNCHER_SIZES:
            text = inline if has_inline else (launcher[i + 1] if i + 1 < len(launcher) else "")
            if reference := _leftover(text):
                raise _unresolved(source, flag, reference)
            size = int(text) if text.isascii() and text.isdigit() and len(text) <= 9 else 0
            if size < 1:
                raise ConfigError(
                    f"{source}: torchrun {flag} {text!r} is not a fixed count, so the world size "
                    "is unknown"
                )
            sizes[_LAUNCHER_SIZES[flag]] = size
    return math.prod(sizes.values()) if sizes else None


def _recipe(parsed: dict[str, Any], world: int | None, name: str, source: str) -> Recipe:
    """Megatron's parsed arguments as this project's model and parallel fields."""
    for dest, value in parsed.items():
        if dest in _USED and isinstance(value, str) and (reference := _leftover(value)):
            raise _unresolved(source, _flag(dest), reference)
        if dest in _DIVISORS and value < 1:
            raise ConfigError(f"{source}: {_flag(dest)} must be >= 1, got {value}")
    for dest in _REQUIRED:
        if dest not in parsed:
            raise ConfigError(f"{source}: the command line has no {_flag(dest)}")
    if "vocab_size" not in parsed:
        tokenizer = parsed.get("tokenizer_type")
        reason = f" (Megatron reads it from the {tokenizer}, which this tool does not load)"
        raise ConfigError(
            f"{source}: vocab size is needed: add --vocab-size N{reason if tokenizer else ''}"
        )
    table = megatron_flag_table().values()
    values = {e["dest"]: e["default"] for e in table if e["dest"] in _MEGATRON_DEFAULTS} | parsed
    model = {key: value for key, value in values.items() if key in MODEL_KEYS} | {"name": name}
    if values.get("tokenizer_type") == "NullTokenizer":
        model["vocab_size"] += 1  # NullTokenizer adds an end-of-document token to --vocab-size
    parallel = {field: values[dest] for dest, field in _PARALLEL_FIELDS.items() if dest in values}
    parallel.setdefault("etp", parallel.get("tp", 1))  # Megatron: expert TP defaults to TP
    if "num_layers_per_virtual_pipeline_stage" in values:
        parallel["vpp"] = _virtual_stages(values, source)
    if values.get("pipeline_model_parallel_layout"):  # Megatron: VPP = layout stages / PP
        try:
            stages = len(parse_stages(values["pipeline_model_parallel_layout"]))
        except LayoutError as exc:
            raise ConfigError(f"{source}: --pipeline-model-parallel-layout: {exc}") from None
        parallel["vpp"] = max(1, stages // parallel.get("pp", 1))
    pp = parallel.get("pp", 1)
    model_parallel = parallel.get("tp", 1) * parallel.get("cp", 1) * pp
    if world is None:  # unknown: the smallest DP that the expert grid allows (1 without EP)
        world = math.lcm(model_parallel, parallel["etp"] * parallel.get("ep", 1) * pp)
    if world % model_parallel:
        raise ConfigError(
            f"{source}: torchrun world size {world} is not divisible by TP·CP·PP = {model_parallel}"
        )
    parallel["dp"] = world // model_parallel
    return build_recipe(model, parallel, source=source)


def _flag(dest: str) -> str:
    """The option string of a dest this module uses (they all follow argparse's naming)."""
    return "--" + dest.replace("_", "-")


def _virtual_stages(values: dict[str, Any], source: str) -> int:
    """The virtual pipeline size Megatron derives from --num-layers-per-virtual-pipeline-stage."""
    if "num_virtual_stages_per_pipeline_rank" in values:
        raise ConfigError(
            f"{source}: set only one of --num-layers-per-virtual-pipeline-stage and "
            "--num-virtual-stages-per-pipeline-rank"
        )
    per_stage = values["num_layers_per_virtual_pipeline_stage"]
    layers = (
        values["num_layers"]
        + values.get("account_for_embedding_in_pipeline_split", False)
        + values.get("account_for_loss_in_pipeline_split", False)
    )
    pp = values.get("pipeline_model_parallel_size", 1)
    if layers % pp or (layers // pp) % per_stage:
        raise ConfigError(
            f"{source}: --num-layers-per-virtual-pipeline-stage {per_stage} does not evenly split "
            f"{layers} layers over {pp} pipeline stages"
        )
    return layers // pp // per_stage
