"""One Megatron-LM rank without torchrun: the ``pretrain_gpt.py`` arguments of a profile run and
the environment torchrun would have given the process.

A profile run is the user's own training job, shortened: the recipe's model and parallel sizes,
the layout under test, every flag of the user's own command line (``Recipe.megatron_args``)
except those the tuner owns (``launchers.megatron_flags``), mock data unless the user keeps
theirs, nothing saved, and timers, iteration and memory lines at every iteration.  Every argument
is checked against megatron-core 0.16.1's flag table before it leaves this machine, so a typo
fails here rather than minutes later on a GPU node.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from launchers.megatron_flags import MergedArguments, merge_arguments
from ray_layout.errors import ConfigError, LayoutError
from ray_layout.model.baselines import megatron_default
from ray_layout.model.fields import ModelSpec, model_flags
from ray_layout.model.layout import Layout, validate
from ray_layout.model.megatron_args import check_arguments, parse_flags
from ray_layout.model.spec import ParallelConfig, Recipe
from ray_layout.model.split import SPLIT_FLAGS, PipelineSplit

ARGUMENTS_SOURCE = "pretrain_gpt.py arguments"  # how errors in an argument list name it
DEFAULT_MICROBATCHES_PER_STAGE = 4  # bubble (PP - 1) / (M + PP - 1): about a fifth
_LAYOUT_FLAG = "--pipeline-model-parallel-layout"
# --eval-iters 0 already turns evaluation off, but Megatron still divides by the interval.
_NO_EVALUATION = 1_000_000_000
# torchrun's variables, which the launch sets for each rank whatever a script exports
_PER_RANK = frozenset(
    {
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "CUDA_VISIBLE_DEVICES",
    }
)
# Set only where the caller's environment has no value of its own.
_DEFAULT_ENVIRONMENT = {
    "PYTHONUNBUFFERED": "1",  # rank logs stream to the collector line by line
    "OMP_NUM_THREADS": "1",  # torchrun's default: one CPU thread pool per rank, not per core
}


@dataclass(frozen=True)
class MegatronRunSettings:
    """How long a profiling or A/B run trains and what it logs; the rest of the run is the recipe.

    Timing level 2 with option ``all`` gives every rank's forward/backward compute and p2p timers,
    which the cost fit needs per pipeline stage; a log interval of 1 gives one sample per step.
    """

    train_iters: int = 20
    log_interval: int = 1
    timing_log_level: int = 2
    timing_log_option: str = "all"
    lr: float = 1e-4  # lr, lr decay style, seed and bf16 only where the user sets none
    seed: int = 1234
    keep_data: bool = False  # the user's data and tokenizer flags instead of mock data
    profiling: bool = False  # a profiling run: EP overlap off (``megatron_flags.PROFILING_OFF``)

    def __post_init__(self) -> None:
        if self.train_iters < 1 or self.log_interval < 1:
            raise ConfigError(
                f"train_iters and log_interval must be >= 1, got {self.train_iters} and "
                f"{self.log_interval}"
            )


def megatron_arguments(
    recipe: Recipe, layout: Layout | None, settings: MegatronRunSettings
) -> MergedArguments:
    """The ``pretrain_gpt.py`` arguments that run ``recipe`` with ``layout`` as the user's job.

    The tuner's flags first (model, parallel sizes, layout, iterations, mock data, logging), then
    the user's own flags it does not own, unchanged (``launchers.megatron_flags``).  With TP > 1
    the run uses sequence parallelism (Megatron's MoE layer refuses TP without it).  Without a
    layout, Megatron's own split must exist for the model: 61 layers on PP 16 is an error here.
    """
    if layout is not None:
        _check_layout(recipe, layout)
    recipe, batch_note = _with_global_batch(recipe)
    merged = merge_arguments(
        [
            *_model_arguments(recipe.model, settings.keep_data),
            *_parallel_arguments(recipe.parallel, layout, recipe.split),
            *_training_arguments(settings),
        ],
        _default_arguments(recipe.model, settings),
        recipe.megatron_args,
        keep_data=settings.keep_data,
        profiling=settings.profiling,
        unresolved=recipe.unresolved_arguments,
    )
    check_arguments(merged.argv, ARGUMENTS_SOURCE, keep_unknown=True)
    if batch_note:
        merged = replace(merged, notes=(batch_note, *merged.notes))
    if layout is None:
        _check_default_split(recipe, merged.argv)
    return merged


def _with_global_batch(recipe: Recipe) -> tuple[Recipe, str | None]:
    """A config without a global batch size (an HF ``config.json`` has none) would train one
    micro-batch per step, Megatron's default, where a pipeline is nearly all bubble: the run
    takes ``DEFAULT_MICROBATCHES_PER_STAGE`` micro-batches per pipeline stage instead, and says
    so."""
    p = recipe.parallel
    if p.global_batch_size:
        return recipe, None
    microbatches = DEFAULT_MICROBATCHES_PER_STAGE * p.pp
    batch = p.micro_batch_size * p.dp * microbatches
    note = (
        f"no global batch size in the config: --global-batch-size {batch} ({microbatches} "
        "micro-batches a step); give --global-batch-size for your own"
    )
    return replace(recipe, parallel=replace(p, global_batch_size=batch)), note


def environment_notes(recipe: Recipe) -> tuple[str, ...]:
    """What became of a launch script's exports: carried into every rank, set per rank by the
    launch instead (torchrun's variables), or left out for want of a plain value."""
    carried = [f"{name}={value}" for name, value in recipe.environment if name not in _PER_RANK]
    per_rank = [name for name, _ in recipe.environment if name in _PER_RANK]
    notes = []
    if carried:
        notes.append(f"exports carried into every rank: {', '.join(carried)}")
    if per_rank:
        notes.append(f"exports the launch sets per rank instead: {', '.join(per_rank)}")
    if recipe.unresolved_environment:
        notes.append(
            f"exports left out, without a plain value in the script: "
            f"{', '.join(recipe.unresolved_environment)} (set them in the cluster's environment)"
        )
    return tuple(notes)


def megatron_command(python: str, megatron_path: Path, arguments: Sequence[str]) -> list[str]:
    """The command line of one rank: ``pretrain_gpt.py`` of a Megatron-LM checkout (it is not
    part of the megatron-core wheel)."""
    script = megatron_path / "pretrain_gpt.py"
    if not script.is_file():
        raise ConfigError(
            f"{script} not found: megatron_path must be a Megatron-LM checkout "
            "(e.g. the NGC container's /opt/megatron-lm)"
        )
    return [python, str(script), *arguments]


def rank_environment(
    rank: int,
    world_size: int,
    master_addr: str,
    master_port: int,
    gpu_ids: Sequence[int],
    parallel: ParallelConfig,
    base: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The variables torchrun would give global rank ``rank`` besides its device view, on top of
    ``base`` (typically a launch script's exports; None starts empty).

    ``gpu_ids`` are the rank's own GPUs, checked here; what the process sees (CUDA_VISIBLE_DEVICES,
    LOCAL_RANK) is decided only by ``ray_layout.runtime.placement.device_env``, so ``base``'s
    per-rank variables are dropped, not passed on.  Megatron asserts
    ``CUDA_DEVICE_MAX_CONNECTIONS=1`` with TP > 1 or CP > 1 (before Blackwell), so the launch
    sets it whatever ``base`` says.
    """
    if world_size != parallel.world_size:
        raise ConfigError(
            f"world size {world_size} differs from TP·CP·DP·PP = {parallel.world_size} of the "
            "parallel sizes"
        )
    if not 0 <= rank < world_size:
        raise ConfigError(f"rank {rank} is outside the world of {world_size} ranks")
    if not 0 < master_port < 65536:
        raise ConfigError(f"master port {master_port} is not a TCP port (1-65535)")
    if any(gpu < 0 for gpu in gpu_ids):
        raise ConfigError(f"GPU ids must be >= 0, got {list(gpu_ids)}")
    kept = {name: value for name, value in (base or {}).items() if name not in _PER_RANK}
    environment = {**_DEFAULT_ENVIRONMENT, **kept}
    environment |= {
        "RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
    }
    if parallel.tp > 1 or parallel.cp > 1:
        environment["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"
    return environment


def _check_default_split(recipe: Recipe, arguments: Sequence[str]) -> None:
    """Megatron's own split (with the user's split flags) must exist when no layout is given."""
    parsed = parse_flags(arguments, ARGUMENTS_SOURCE)
    m, p = recipe.model, recipe.parallel
    try:
        megatron_default(
            m.num_layers,
            m.mtp_num_layers,
            p.pp,
            p.vpp,
            account_for_embedding=parsed.get("account_for_embedding_in_pipeline_split", False),
            account_for_loss=parsed.get("account_for_loss_in_pipeline_split", False),
            first_stage_layers=parsed.get("decoder_first_pipeline_num_layers"),
            last_stage_layers=parsed.get("decoder_last_pipeline_num_layers"),
        )
    except LayoutError as exc:
        raise ConfigError(f"{m.num_layers} layers on PP {p.pp} without a layout: {exc}") from None


def _check_layout(recipe: Recipe, layout: Layout) -> None:
    """A layout Megatron would reject at start-up, or one for other parallel sizes, fails here."""
    p, m = recipe.parallel, recipe.model
    if (layout.pp, layout.vpp) != (p.pp, p.vpp):
        raise ConfigError(
            f"layout {layout} is for PP={layout.pp} VPP={layout.vpp}, the recipe has "
            f"PP={p.pp} VPP={p.vpp}"
        )
    try:
        validate(layout, m.num_layers, m.mtp_num_layers)
    except LayoutError as exc:
        raise ConfigError(f"layout {layout}: {exc}") from None


def _flags(values: Mapping[str, object]) -> list[str]:
    """``{flag: value}`` as arguments: True is a bare switch; False and None leave a flag out."""
    arguments: list[str] = []
    for flag, value in values.items():
        if value is True:
            arguments.append(flag)
        elif value is not False and value is not None:
            arguments += [flag, str(value)]
    return arguments


def _model_arguments(m: ModelSpec, keep_data: bool) -> list[str]:
    """The model's flags, from its fields' table (``ray_layout.model.fields``).  The NullTokenizer
    adds an end-of-document token: V - 1 gives the model's V; the user's own tokenizer (kept
    data) knows its vocabulary."""
    return _flags(model_flags(m) | {"--vocab-size": None if keep_data else m.vocab_size - 1})


def _parallel_arguments(
    p: ParallelConfig, layout: Layout | None, split: PipelineSplit
) -> list[str]:
    """DP is not an argument: Megatron derives it from WORLD_SIZE (see rank_environment).  The
    split is the tuner's: the layout under test, or (for Megatron's default) the config's own
    split flags with the VPP as virtual stages, so that no two VPP flags ever meet."""
    virtual_stages = p.vpp if layout is None and p.vpp > 1 else None  # a layout carries its VPP
    default_split = (
        {}
        if layout is not None
        else {SPLIT_FLAGS[key]: value for key, value in split.shapes_default.items()}
    )
    return _flags(
        {
            "--tensor-model-parallel-size": p.tp,
            "--pipeline-model-parallel-size": p.pp,
            "--context-parallel-size": p.cp,
            "--expert-model-parallel-size": p.ep,
            "--expert-tensor-parallel-size": p.etp,
            "--sequence-parallel": p.tp > 1,
            "--micro-batch-size": p.micro_batch_size,
            "--global-batch-size": p.global_batch_size or None,
            "--use-distributed-optimizer": p.use_distributed_optimizer,
            "--num-virtual-stages-per-pipeline-rank": virtual_stages,
            _LAYOUT_FLAG: None if layout is None else str(layout),
            **default_split,
        }
    )


def _training_arguments(s: MegatronRunSettings) -> list[str]:
    """What the tuner owns of training: mock data and a null tokenizer (no files on the nodes)
    unless the user keeps theirs, the iterations, no evaluation, no --save, every timer."""
    return _flags(
        {
            "--mock-data": not s.keep_data,
            "--tokenizer-type": None if s.keep_data else "NullTokenizer",
            "--train-iters": s.train_iters,
            "--eval-iters": 0,
            "--eval-interval": _NO_EVALUATION,
            "--log-interval": s.log_interval,
            "--timing-log-level": s.timing_log_level,
            "--timing-log-option": s.timing_log_option,
            "--log-throughput": True,
        }
    )


def _default_arguments(m: ModelSpec, s: MegatronRunSettings) -> list[str]:
    """What a run needs that the user's own flags set when they have them."""
    return _flags(
        {
            "--lr": s.lr,
            "--lr-decay-style": "constant",
            "--seed": s.seed,
            "--bf16": True,
            "--moe-token-dispatcher-type": "alltoall" if m.num_experts > 0 else None,
        }
    )
