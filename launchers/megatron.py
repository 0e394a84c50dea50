"""One Megatron-LM rank without torchrun: the ``pretrain_gpt.py`` arguments of a profile run and
the environment torchrun would have given the process.

A profile run trains the recipe's model on mock data (no data or tokenizer files on the nodes),
saves nothing, and logs timers, iteration and memory lines at every iteration.  Every argument is
checked against megatron-core 0.16.1's flag table before it leaves this machine, so a typo fails
here rather than minutes later on a GPU node.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ray_layout.errors import ConfigError, LayoutError
from ray_layout.model.layout import Layout, validate
from ray_layout.model.megatron_args import typed_value, walk_flags
from ray_layout.model.spec import MLAConfig, ModelSpec, ParallelConfig, Recipe

ARGUMENTS_SOURCE = "pretrain_gpt.py arguments"  # how errors in an argument list name it
_LAYOUT_FLAG = "--pipeline-model-parallel-layout"
# Megatron rejects these together with a layout string: the layout alone sets the split and VPP.
_SPLIT_FLAGS = (
    "--num-layers-per-virtual-pipeline-stage",
    "--num-virtual-stages-per-pipeline-rank",
    "--decoder-first-pipeline-num-layers",
    "--decoder-last-pipeline-num-layers",
    "--account-for-embedding-in-pipeline-split",
    "--account-for-loss-in-pipeline-split",
)
# --eval-iters 0 already turns evaluation off, but Megatron still divides by the interval.
_NO_EVALUATION = 1_000_000_000
# Set only where the caller's environment has no value of its own.
_DEFAULT_ENVIRONMENT = {
    "PYTHONUNBUFFERED": "1",  # rank logs stream to the collector line by line
    "OMP_NUM_THREADS": "1",  # torchrun's default: one CPU thread pool per rank, not per core
}


@dataclass(frozen=True)
class ProfileSettings:
    """How long a profile run trains and what it logs; the rest of the run is the recipe.

    Timing level 2 with option ``all`` gives every rank's forward/backward compute and p2p timers,
    which the cost fit needs per pipeline stage; a log interval of 1 gives one sample per step.
    """

    train_iters: int = 20
    log_interval: int = 1
    timing_log_level: int = 2
    timing_log_option: str = "all"
    lr: float = 1e-4
    seed: int = 1234

    def __post_init__(self) -> None:
        if self.train_iters < 1 or self.log_interval < 1:
            raise ConfigError(
                f"train_iters and log_interval must be >= 1, got {self.train_iters} and "
                f"{self.log_interval}"
            )


def megatron_arguments(
    recipe: Recipe,
    layout: Layout | None,
    settings: ProfileSettings,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The ``pretrain_gpt.py`` arguments that train ``recipe`` on mock data with ``layout``.

    ``extra_args`` are appended verbatim.  Megatron's argparse keeps the last value of a repeated
    option, so a user's ``--train-iters 50`` overrides ours; a switch we set (``--bf16``,
    ``--use-distributed-optimizer``, ...) cannot be switched off that way: change the recipe.
    With TP > 1 the run uses sequence parallelism (Megatron's MoE layer refuses TP without it).
    """
    if layout is not None:
        _check_layout(recipe, layout)
    arguments = [
        *_model_arguments(recipe.model),
        *_parallel_arguments(recipe.parallel, layout),
        *_training_arguments(settings),
        *extra_args,
    ]
    check_arguments(arguments)
    given = {word.partition("=")[0] for word in arguments}
    clashing = [flag for flag in _SPLIT_FLAGS if flag in given]
    if _LAYOUT_FLAG in given and clashing:
        raise ConfigError(f"{_LAYOUT_FLAG} cannot be combined with {', '.join(clashing)}")
    return arguments


def check_arguments(args: Sequence[str]) -> None:
    """Walk ``args`` as Megatron's argparse would and raise :class:`ConfigError` at the first
    unknown flag, stray word, wrong number of values, value of the wrong type or value outside
    the flag's choices.  Values of Megatron's own converters (``--moe-layer-freq``, enums, ...)
    are not in the flag table and are not checked."""
    for use in walk_flags(args, ARGUMENTS_SOURCE, strict=True):
        for text in use.values:
            typed_value(use, text, ARGUMENTS_SOURCE)


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
    """The environment torchrun would give global rank ``rank``, on top of ``base`` (typically
    the caller's ``os.environ``; None starts empty).

    The process sees only ``gpu_ids`` (normally one GPU), so its ``LOCAL_RANK`` is 0.  Megatron
    asserts ``CUDA_DEVICE_MAX_CONNECTIONS=1`` with TP > 1 or CP > 1 (before Blackwell), so the
    launch sets it whatever ``base`` says.
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
    environment = {**_DEFAULT_ENVIRONMENT, **(base or {})}
    environment |= {
        "RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_RANK": "0",
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
        "CUDA_VISIBLE_DEVICES": ",".join(map(str, gpu_ids)),
    }
    if parallel.tp > 1 or parallel.cp > 1:
        environment["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"
    return environment


def _moe_layer_freq(pattern: Sequence[bool]) -> str:
    """Megatron's ``--moe-layer-freq`` for a dense/MoE pattern: N when every N-th layer from layer
    0 is MoE, else a list expression of runs such as ``([0]*3+[1]*58)``."""
    for every in range(1, len(pattern) + 1):
        if tuple(pattern) == tuple(i % every == 0 for i in range(len(pattern))):
            return str(every)
    runs = [f"[{int(moe)}]*{len(list(run))}" for moe, run in itertools.groupby(pattern)]
    return f"({'+'.join(runs)})"


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


def _model_arguments(m: ModelSpec) -> list[str]:
    gqa = m.num_query_groups < m.num_attention_heads
    moe = m.num_experts > 0
    return _flags(
        {
            "--num-layers": m.num_layers,
            "--hidden-size": m.hidden_size,
            "--ffn-hidden-size": m.ffn_hidden_size,
            "--num-attention-heads": m.num_attention_heads,
            "--group-query-attention": gqa,
            "--num-query-groups": m.num_query_groups if gqa else None,
            "--kv-channels": m.kv_channels,
            "--swiglu": m.swiglu,
            "--normalization": m.normalization,
            "--disable-bias-linear": not m.add_bias_linear,
            "--add-qkv-bias": m.add_qkv_bias,
            "--qk-layernorm": m.qk_layernorm,
            "--position-embedding-type": m.position_embedding_type,
            "--seq-length": m.seq_length,
            # Required by Megatron whatever the position embedding; >= seq_length.
            "--max-position-embeddings": m.max_position_embeddings or m.seq_length,
            "--untie-embeddings-and-output-weights": m.untie_embeddings_and_output_weights,
            "--make-vocab-size-divisible-by": m.make_vocab_size_divisible_by,
            # The NullTokenizer adds an end-of-document token: V - 1 gives the model's V.
            "--vocab-size": m.vocab_size - 1,
            "--num-experts": m.num_experts if moe else None,
            "--moe-ffn-hidden-size": m.moe_ffn_hidden_size if moe else None,
            "--moe-router-topk": m.moe_router_topk if moe else None,
            "--moe-shared-expert-intermediate-size": m.moe_shared_expert_intermediate_size or None,
            "--moe-layer-freq": _moe_layer_freq(m.moe_layer_pattern) if moe else None,
            "--moe-token-dispatcher-type": "alltoall" if moe else None,
            "--mtp-num-layers": m.mtp_num_layers or None,
        }
    ) + (_mla_arguments(m.mla) if m.mla else [])


def _mla_arguments(mla: MLAConfig) -> list[str]:
    return _flags(
        {
            "--multi-latent-attention": True,
            "--q-lora-rank": mla.q_lora_rank,
            "--kv-lora-rank": mla.kv_lora_rank,
            "--qk-head-dim": mla.qk_head_dim,
            "--qk-pos-emb-head-dim": mla.qk_pos_emb_head_dim,
            "--v-head-dim": mla.v_head_dim,
        }
    )


def _parallel_arguments(p: ParallelConfig, layout: Layout | None) -> list[str]:
    """DP is not an argument: Megatron derives it from WORLD_SIZE (see rank_environment)."""
    virtual_stages = p.vpp if layout is None and p.vpp > 1 else None  # a layout carries its VPP
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
            # the interleaved schedule as ray_layout simulates and emulates it: batched p2p
            "--no-overlap-p2p-communication": (layout.vpp if layout else p.vpp) > 1,
        }
    )


def _training_arguments(s: ProfileSettings) -> list[str]:
    """Mock data and a null tokenizer need no files; no --save, so nothing is written."""
    return _flags(
        {
            "--mock-data": True,
            "--tokenizer-type": "NullTokenizer",
            "--train-iters": s.train_iters,
            "--lr": s.lr,
            "--lr-decay-style": "constant",
            "--seed": s.seed,
            "--bf16": True,
            "--eval-iters": 0,
            "--eval-interval": _NO_EVALUATION,
            "--log-interval": s.log_interval,
            "--timing-log-level": s.timing_log_level,
            "--timing-log-option": s.timing_log_option,
            "--log-throughput": True,
        }
    )
