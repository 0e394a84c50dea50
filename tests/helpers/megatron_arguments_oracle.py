"""Megatron-LM's own ``parse_args`` + ``validate_args`` (core_v0.16.1), rewritten as a test oracle.

Tests use it to check that a rank command line this project prints is one that ``pretrain_gpt.py``
of Megatron-LM core_v0.16.1 accepts, without a GPU or a Megatron-LM checkout (``megatron.training``
is not part of the megatron-core wheel).  The code is this project's own: it expresses the same
rules as Megatron-LM, read from its sources at the release tag, and names for each rule the Megatron
function it mirrors.

* :func:`parse_megatron_args` is a real :class:`argparse.ArgumentParser` built from the bundled
  flag table (every option of Megatron's parser), so unknown flags and bad values fail with
  argparse's own message.
* :func:`validate_megatron_args` applies, in Megatron's order, the checks of ``validate_args`` and
  those that fire at start-up from the arguments alone: the micro-batch calculator, the tokenizer's
  required inputs, ``initialize_model_parallel``'s grids, the seed, ``TransformerConfig``'s
  ``__post_init__``, the layer specs, the layer split per pipeline stage, the MoE layers, the
  learning-rate schedule and the dataset sizes.  Each failing rule raises :class:`AssertionError`
  whose message starts with the rule's name.  Checks that depend on the GPU, on installed
  Transformer Engine / Apex versions, on environment variables or on files are left out.
* :func:`megatron_core_config` builds megatron-core's real ``TransformerConfig`` from validated
  arguments, as ``core_transformer_config_from_args`` does, for tests that cross-check this port.

The pipeline layout, the micro-batch calculator and the rank grids are judged by megatron-core's
own classes (``PipelineParallelLayerLayout``, ``ConstantNumMicroBatchesCalculator``,
``RankGenerator``), imported lazily so that their import-time warnings fall under the
``filterwarnings`` marks of the tests that use them.
"""

from __future__ import annotations

import argparse
import ast
import copy
import json
import re
import signal
import warnings
from collections.abc import Callable, Sequence
from functools import cache
from typing import Any

from tests.helpers.paths import ROOT

FLAG_TABLE = ROOT / "ray_layout" / "model" / "data" / "megatron_args_core_v0.16.1.json"
# pretrain_gpt.py's ``args_defaults``: applied by validate_args where the command line sets none.
PRETRAIN_GPT_DEFAULTS = {"tokenizer_type": "GPT2BPETokenizer"}

_LIST_NARGS = ("+", "*")
_PATTERN_CHARACTERS = re.compile(r"[^,\d\[\]\(\)\+\*]")


class MegatronArgumentParser(argparse.ArgumentParser):
    """argparse that raises :class:`argparse.ArgumentError` (argparse's own message) instead of
    printing usage and exiting, for every error, also those ``exit_on_error=False`` still sends
    to :meth:`error` in Python 3.11 (unrecognized arguments)."""

    def error(self, message: str) -> Any:  # type: ignore[override]
        raise argparse.ArgumentError(None, message)


# --------------------------------------------------------------------------------------------
# Megatron's custom argparse converters, as functions of the same names (argparse's messages
# name the converter: "invalid moe_freq_type value: 'x'").


def _list_expression(text: str) -> Any:
    """The value of a pattern such as ``([0]*3+[1]*58)``; ``_eval_pattern`` checks the characters
    and evaluates the text with Python, this walks its syntax tree instead (no ``eval``)."""
    if _PATTERN_CHARACTERS.search(text):
        raise ValueError(f"Invalid pattern: {text}")

    def value(node: ast.AST) -> Any:
        if isinstance(node, ast.Expression):
            return value(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.List):
            return [value(item) for item in node.elts]
        if isinstance(node, ast.Tuple):
            return tuple(value(item) for item in node.elts)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            return value(node.left) + value(node.right)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
            return value(node.left) * value(node.right)
        raise ValueError(f"Invalid pattern: {text}")

    return value(ast.parse(text.strip(), mode="eval"))  # a SyntaxError escapes, as from eval


def moe_freq_type(text: str | int) -> int | list[int]:
    """``moe_freq_type``: an int N (one MoE layer every N) or a list expression of 0/1."""
    if isinstance(text, int):
        return text
    return _list_expression(text) if "[" in text else int(text)


def no_rope_freq_type(text: str | int | None) -> Any:
    """``no_rope_freq_type``: as :func:`moe_freq_type`, None kept."""
    return text if text is None else moe_freq_type(text)


def la_freq_type(text: str | int | None) -> Any:
    """``la_freq_type``: as :func:`moe_freq_type`, None kept."""
    return text if text is None else moe_freq_type(text)


def tuple_type(text: str | tuple[int, ...] | None) -> tuple[int, ...] | None:
    """``tuple_type``: ``"1,2"`` or ``"(1,2)"`` as a tuple of ints."""
    if text is None or isinstance(text, tuple):
        return text
    return tuple(int(part) for part in text.strip("()").split(","))


@cache
def _enums() -> dict[str, Any]:
    """The enum classes behind Megatron's ``enum_type_handler`` options, by dest."""
    from megatron.core.transformer.enums import AttnBackend

    return {"attention_backend": AttnBackend, "exit_signal": signal.Signals}


def _enum_converter(enum_class: Any) -> Callable[[str], Any]:
    def enum_type_handler(text: str) -> Any:
        return enum_class[text]  # a KeyError escapes argparse, as in Megatron

    return enum_type_handler


def _cuda_graph_scope_converter() -> Callable[[str], Any]:
    from megatron.core.transformer.enums import CudaGraphScope

    return lambda scope: CudaGraphScope[scope] if scope != "full" else scope


def _switch_options(entry: dict[str, Any]) -> tuple[list[str], dict[str, Any]]:
    """Option strings and keywords of a switch: ``--x``/``--no-x`` pairs are
    ``BooleanOptionalAction``; any other switch stores ``not default``."""
    flags = entry["flags"]
    positive = [f for f in flags if f.startswith("--") and f"--no-{f[2:]}" in flags]
    if positive:
        return positive, {"action": argparse.BooleanOptionalAction, "default": entry["default"]}
    action = "store_false" if entry["default"] is True else "store_true"
    return flags, {"action": action, "default": entry["default"]}


def _value_options(entry: dict[str, Any]) -> dict[str, Any]:
    """Keywords of an option that takes values: type, nargs, choices and default as Megatron's."""
    dest, name, default = entry["dest"], entry["type"], entry["default"]
    choices = entry["choices"]
    nargs = entry["nargs"]
    list_nargs = nargs in _LIST_NARGS or isinstance(nargs, int)
    if list_nargs and isinstance(default, str) and default.startswith("["):
        default = ast.literal_eval(default)  # the table writes list defaults as their repr
    converters: dict[str | None, Any] = {
        "int": int,
        "float": float,
        "str": str,
        "bool": bool,
        None: None,  # no type: argparse keeps the text
        "moe_freq_type": moe_freq_type,
        "no_rope_freq_type": no_rope_freq_type,
        "la_freq_type": la_freq_type,
        "tuple_type": tuple_type,
    }
    if name == "enum_type_handler":
        enum_class = _enums()[dest]
        convert = _enum_converter(enum_class)
        choices = list(enum_class)
        default = (
            enum_class[default.partition(".")[2]]
            if isinstance(default, str)
            else enum_class(default)
        )
    elif name == "<lambda>" and dest == "cuda_graph_scope":
        convert = _cuda_graph_scope_converter()
    elif name in converters:
        convert = converters[name]
    else:
        raise ValueError(f"the flag table has a converter this oracle does not know: {name}")
    options: dict[str, Any] = {"nargs": nargs, "default": default, "choices": choices}
    if convert is not None:
        options["type"] = convert
    return options


@cache
def _parser() -> MegatronArgumentParser:
    parser = MegatronArgumentParser(
        prog="pretrain_gpt.py",
        description="Megatron-LM Arguments",
        allow_abbrev=False,
        exit_on_error=False,
    )
    for entry in json.loads(FLAG_TABLE.read_text()):
        if entry["dest"] == "help":
            continue  # argparse's own -h/--help
        if entry["nargs"] == 0:
            flags, options = _switch_options(entry)
        else:
            flags, options = entry["flags"], _value_options(entry)
        parser.add_argument(*flags, dest=entry["dest"], **options)
    return parser


def parse_megatron_args(argv: Sequence[str]) -> argparse.Namespace:
    """``parse_args`` of ``pretrain_gpt.py``: the namespace Megatron's parser gives for ``argv``
    (the words after the script name).  Raises :class:`argparse.ArgumentError` with argparse's
    message for an unknown flag, a missing value or a value of the wrong type or choice; a bad
    enum name raises ``KeyError`` and a list pattern that is not Python ``SyntaxError``, which
    argparse lets through in Megatron too."""
    return _parser().parse_args(list(argv))


# --------------------------------------------------------------------------------------------
# validate_args and the start-up checks


def _check(condition: Any, rule: str, detail: str) -> None:
    """Raise ``AssertionError("<rule>: <detail>")`` unless ``condition``."""
    if not condition:
        raise AssertionError(f"{rule}: {detail}")


def _megatron_core(rule: str, check: Callable[[], Any]) -> Any:
    """Run one of megatron-core's own checks; its AssertionError or ValueError becomes this
    oracle's, prefixed by the rule."""
    try:
        return check()
    except (AssertionError, ValueError, RuntimeError, NotImplementedError) as exc:
        raise AssertionError(f"{rule}: {exc}") from exc


def validate_megatron_args(
    args: argparse.Namespace, world_size: int, *, startup_checks: bool = True
) -> argparse.Namespace:
    """A copy of ``args`` completed as Megatron's ``validate_args`` completes it (data-parallel
    size, expert TP, global batch size, virtual pipeline size, ffn size, ...), for a run of
    ``world_size`` ranks; raises :class:`AssertionError` naming the first rule the command line
    breaks.  With ``startup_checks`` (the default) the checks that fire later at start-up from
    the arguments run too (micro-batches, tokenizer, rank grids, seed, ``TransformerConfig``,
    layer specs and split, MoE layers, schedule, dataset sizes)."""
    args = copy.deepcopy(args)
    args.rank = 0
    args.world_size = world_size
    _validate_args(args, PRETRAIN_GPT_DEFAULTS)
    if startup_checks:
        _initialize_checks(args)
        _transformer_config_checks(args)
        _model_checks(args)
        _training_checks(args)
    return args


def _validate_args(args: argparse.Namespace, defaults: dict[str, Any]) -> None:
    """Megatron's ``validate_args``, in its order: every assert/raise that a GPT pretraining
    command line can trip without a GPU, environment variables, files or a checkpoint."""
    rule = "validate_args"
    # Files and other programs' arguments this oracle does not read: it refuses to judge.
    for dest in ("yaml_cfg", "heterogeneous_layers_config_path"):
        if getattr(args, dest) is not None:
            raise NotImplementedError(f"the oracle does not read --{dest.replace('_', '-')}")
    if args.heterogeneous_layers_config_encoded_json is not None:
        raise NotImplementedError("the oracle does not read heterogeneous layer configs")

    # validate_args: non-persistent checkpoint type (the nvidia_resiliency_ext import is left out)
    _check(
        args.non_persistent_ckpt_type in ("global", "local", None),
        rule,
        "Currently only global and local checkpoints are supported",
    )
    # validate_args: legacy models take the torch checkpoint format; update_use_dist_ckpt
    if args.use_legacy_models:
        _check(args.ckpt_format == "torch", rule, "legacy model format only supports 'torch'")
    args.use_dist_ckpt = args.ckpt_format != "torch"

    # validate_args: world size divisible by TP * PP * CP
    model_size = (
        args.tensor_model_parallel_size
        * args.pipeline_model_parallel_size
        * args.context_parallel_size
    )
    _check(
        args.world_size % model_size == 0,
        rule,
        f"world size ({args.world_size}) is not divisible by total_model_size ({model_size})",
    )
    # validate_args: --attention-backend local needs --spec local
    if args.attention_backend == _enums()["attention_backend"].local:
        _check(
            args.spec is not None and args.spec[0] == "local",
            rule,
            "--attention-backend local is only supported with --spec local",
        )
    args.transformer_pipeline_model_parallel_size = args.pipeline_model_parallel_size
    args.data_parallel_size = args.world_size // model_size

    # validate_args: RL checks (torch_memory_saver's import left out)
    if args.rl_offload_kv_cache_during_training:
        _check(
            not args.inference_dynamic_batching_unified_memory_level,
            rule,
            "The KV cache should not be instantiated in unified memory when it is offloaded",
        )
    if args.perform_rl_step:
        _check_rl_step(args)

    # validate_args: hierarchical context parallelism
    if args.hierarchical_context_parallel_sizes:
        product = 1
        for size in args.hierarchical_context_parallel_sizes:
            product *= size
        _check(
            args.context_parallel_size == product,
            rule,
            "--hierarchical-context-parallel-sizes must multiply to --context-parallel-size",
        )
    if "a2a+p2p" in args.cp_comm_type:
        _check(
            args.hierarchical_context_parallel_sizes is not None,
            rule,
            "--hierarchical-context-parallel-sizes must be set when a2a+p2p is used in cp comm",
        )
    if args.expert_tensor_parallel_size is None:
        args.expert_tensor_parallel_size = args.tensor_model_parallel_size

    # validate_args: deprecated arguments
    _check(args.batch_size is None, rule, "--batch-size argument is no longer valid")
    _check(args.warmup is None, rule, "--warmup argument is no longer valid")
    _check(args.model_parallel_size is None, rule, "--model-parallel-size is no longer valid")
    del args.batch_size, args.warmup, args.model_parallel_size
    # Megatron prints a notice and calls exit(): the job does not train.
    _check(not args.checkpoint_activations, rule, "--checkpoint-activations is no longer valid")
    del args.checkpoint_activations
    if args.recompute_activations:
        args.recompute_granularity = "selective"
    del args.recompute_activations

    # validate_args: deprecated CUDA graph switches
    if args.enable_cuda_graph or args.external_cuda_graph:
        _check(
            args.cuda_graph_impl == "none",
            rule,
            "Do not use --enable-cuda-graph or --external-cuda-graph with --cuda-graph-impl.",
        )
        _check(
            not (args.enable_cuda_graph and args.external_cuda_graph),
            rule,
            "--enable-cuda-graph and --external-cuda-graph cannot be enabled at the same time.",
        )
        if args.enable_cuda_graph:
            args.cuda_graph_impl = "local"
            del args.enable_cuda_graph
        if args.external_cuda_graph:
            args.cuda_graph_impl = "transformer_engine"
            del args.external_cuda_graph

    # validate_args: the script's defaults, where the command line sets none
    for key, value in defaults.items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)

    # validate_args: data sources
    if args.data_path is not None and args.split is None:
        args.split = "969, 30, 1"
    if args.data_path is not None or args.data_args_path is not None:
        _check(
            args.data_path is None or args.data_args_path is None,
            rule,
            "only one of --data-path and --data-args-path",
        )
    per_split = [args.train_data_path, args.valid_data_path, args.test_data_path]
    if any(p is not None for p in per_split) or args.per_split_data_args_path is not None:
        _check(
            not any(p is not None for p in per_split) or args.per_split_data_args_path is None,
            rule,
            "only one of --train/valid/test-data-path and --per-split-data-args-path",
        )
    if args.phase_transition_iterations:
        args.phase_transition_iterations = sorted(
            int(x.strip()) for x in args.phase_transition_iterations.split(",")
        )
        _check(
            args.rampup_batch_size is None,
            rule,
            "multi-phase training does not support batch size ramp-up",
        )

    # validate_args: batch sizes; the default global batch size is micro batch x DP
    _check(args.micro_batch_size is not None, rule, "--micro-batch-size is required")
    _check(args.micro_batch_size > 0, rule, "--micro-batch-size must be > 0")
    if args.global_batch_size is None:
        args.global_batch_size = args.micro_batch_size * args.data_parallel_size
    _check(args.global_batch_size > 0, rule, "--global-batch-size must be > 0")

    _virtual_pipeline(args)

    # validate_args: overlapped parameter gather
    if args.overlap_param_gather:
        _check(
            args.use_distributed_optimizer or args.use_megatron_fsdp,
            rule,
            "--overlap-param-gather only supported with distributed optimizer or megatron fsdp",
        )
        _check(
            args.overlap_grad_reduce,
            rule,
            "Must use --overlap-param-gather with --overlap-grad-reduce",
        )
        _check(
            not args.use_legacy_models,
            rule,
            "--overlap-param-gather only supported with MCore models",
        )
    # validate_args: torch FSDP2 (the torch version and CUDA_DEVICE_MAX_CONNECTIONS left out)
    if args.use_torch_fsdp2:
        for ok, detail in (
            (args.pipeline_model_parallel_size == 1, "not supported with pipeline parallelism"),
            (args.expert_model_parallel_size == 1, "not supported with expert parallelism"),
            (not args.use_distributed_optimizer, "not supported with the distributed optimizer"),
            (not args.gradient_accumulation_fusion, "not supported with gradient acc. fusion"),
            (args.ckpt_format in ("torch_dist", "torch_dcp"), "needs torch_dist or torch_dcp"),
            (args.untie_embeddings_and_output_weights, "needs untied embeddings"),
            (not args.fp16, "not supported with fp16 yet"),
        ):
            _check(ok, rule, f"--use-torch-fsdp2 {detail}")
    if args.overlap_param_gather_with_optimizer_step:
        detail = "--overlap-param-gather-with-optimizer-step"
        _check(args.use_distributed_optimizer, rule, f"{detail} needs the distributed optimizer")
        _check(args.overlap_param_gather, rule, f"{detail} needs --overlap-param-gather")
        _check(
            args.virtual_pipeline_model_parallel_size is not None,
            rule,
            f"{detail} only supported with interleaved pipeline parallelism",
        )
        _check(not args.use_dist_ckpt, rule, f"{detail} not supported with dist checkpointing")

    # validate_args: fp8 parameter gather (training runs with gradients enabled)
    if args.fp8_param_gather:
        _check(
            args.use_distributed_optimizer or args.use_torch_fsdp2 or args.use_megatron_fsdp,
            rule,
            "--fp8-param-gather only supported with distributed optimizer, torch fsdp2, "
            "megatron fsdp, or inference mode",
        )
    # validate_args: fp4 (the Transformer Engine version check left out)
    _check(not (args.fp4 and args.fp8), rule, "--fp4-format and --fp8-format cannot be combined")
    _check(not args.fp4_param or args.fp4, rule, "--fp4-param-gather needs --fp4-format")

    # validate_args: Megatron FSDP (CUDA_DEVICE_MAX_CONNECTIONS left out)
    if args.use_megatron_fsdp:
        args.use_custom_fsdp = True
        if args.data_parallel_sharding_strategy == "optim_grads_params":
            _check(
                args.check_weight_hash_across_dp_replicas_interval is None,
                rule,
                "check_weight_hash_across_dp_replicas_interval is not supported with "
                "optim_grads_params",
            )
        _check(
            args.ckpt_format == "fsdp_dtensor",
            rule,
            "Megatron FSDP only supports fsdp_dtensor checkpoint format",
        )
    if args.fsdp_manual_registration:
        _check(args.use_megatron_fsdp, rule, "FSDP manual registration needs Megatron FSDP")
        _check(args.nccl_ub, rule, "FSDP manual registration needs --nccl-ub")

    # validate_args: parameter dtype; fp16 and bf16 exclude each other
    args.params_dtype = "fp32"
    if args.fp16:
        _check(not args.bf16, rule, "--fp16 and --bf16 cannot both be set")
        args.params_dtype = "fp16"
        if not args.loss_scale:
            args.check_for_nan_in_loss_and_grad = False
    if args.bf16:
        _check(not args.fp16, rule, "--fp16 and --bf16 cannot both be set")
        args.params_dtype = "bf16"
        if args.accumulate_allreduce_grads_in_fp32:
            _check(
                args.main_grads_dtype == "fp32",
                rule,
                "--main-grads-dtype can only be fp32 when --accumulate-allreduce-grads-in-fp32",
            )
        if args.grad_reduce_in_bf16:
            args.accumulate_allreduce_grads_in_fp32 = False
        elif not args.accumulate_allreduce_grads_in_fp32 and args.main_grads_dtype == "fp32":
            args.accumulate_allreduce_grads_in_fp32 = True
    # validate_args: a full-iteration CUDA graph
    if args.cuda_graph_impl == "local" and _full_iteration_scope(args):
        if not args.inference_dynamic_batching:
            _check(
                not args.check_for_nan_in_loss_and_grad,
                rule,
                "--no-check-for-nan-in-loss-and-grad should be set with full_iteration CUDA graph",
            )
        else:
            _check(args.fp8 is None, rule, "fp8 is not supported with full_iteration CUDA graph")

    if args.dataloader_type is None:
        args.dataloader_type = "single"
    _check(args.num_dataset_builder_threads > 0, rule, "--num-dataset-builder-threads must be > 0")
    args.consumed_train_samples = args.skipped_train_samples = args.consumed_valid_samples = 0
    args.variable_seq_lengths = False

    # validate_args: iteration-based or sample-based training, not a mix
    if args.train_iters:
        _check(args.train_samples is None, rule, "expected iteration-based training")
        _check(args.lr_decay_samples is None, rule, "expected iteration-based lr decay")
        _check(args.lr_warmup_samples == 0, rule, "expected iteration-based lr warmup")
        _check(args.rampup_batch_size is None, rule, "expected no batch-size rampup")
        if args.lr_warmup_fraction is not None:
            _check(
                args.lr_warmup_iters == 0,
                rule,
                "can only specify one of lr-warmup-fraction and lr-warmup-iters",
            )
    if args.train_samples:
        _check(args.train_iters is None, rule, "expected sample-based training")
        _check(args.lr_decay_iters is None, rule, "expected sample-based lr decay")
        _check(args.lr_warmup_iters == 0, rule, "expected sample-based lr warmup")
        if args.lr_warmup_fraction is not None:
            _check(
                args.lr_warmup_samples == 0,
                rule,
                "can only specify one of lr-warmup-fraction and lr-warmup-samples",
            )

    # validate_args: layer count; the required model sizes
    if args.num_layers is not None:
        _check(args.encoder_num_layers is None, rule, "cannot have both num-layers and "
               "encoder-num-layers specified")  # fmt: skip
        args.encoder_num_layers = args.num_layers
    else:
        _check(
            args.encoder_num_layers is not None,
            rule,
            "either num-layers or encoder-num-layers should be specified",
        )
        args.num_layers = args.encoder_num_layers
    for dest in ("num_layers", "hidden_size", "num_attention_heads", "max_position_embeddings"):
        _check(getattr(args, dest) is not None, rule, f"{dest} argument is None")

    # validate_args: ffn and head sizes by default
    if args.ffn_hidden_size is None:
        if args.swiglu:
            args.ffn_hidden_size = int((4 * args.hidden_size * 2 / 3) / 64) * 64
        else:
            args.ffn_hidden_size = 4 * args.hidden_size
    if args.kv_channels is None:
        _check(
            args.hidden_size % args.num_attention_heads == 0,
            rule,
            "hidden size must be divisible by the number of attention heads without --kv-channels",
        )
        args.kv_channels = args.hidden_size // args.num_attention_heads

    # validate_args: sequence length with context parallelism; max positions >= sequence
    if args.seq_length is not None and args.context_parallel_size > 1:
        _check(
            args.seq_length % (args.context_parallel_size * 2) == 0,
            rule,
            "seq-length should be a multiple of 2 * context-parallel-size if "
            "context-parallel-size > 1.",
        )
    if args.seq_length is not None:
        _check(args.encoder_seq_length is None, rule, "--seq-length and --encoder-seq-length")
        args.encoder_seq_length = args.seq_length
    else:
        _check(args.encoder_seq_length is not None, rule, "--seq-length is required")
        args.seq_length = args.encoder_seq_length
    _check(
        args.max_position_embeddings >= args.seq_length,
        rule,
        f"max_position_embeddings ({args.max_position_embeddings}) must be greater than or "
        f"equal to seq_length ({args.seq_length}).",
    )
    if args.decoder_seq_length is not None:
        _check(
            args.max_position_embeddings >= args.decoder_seq_length,
            rule,
            "max_position_embeddings must be >= decoder_seq_length",
        )
    if args.lr is not None:
        _check(args.min_lr <= args.lr, rule, f"--min-lr {args.min_lr} > --lr {args.lr}")
    if args.save is not None:
        _check(args.save_interval is not None, rule, "--save needs --save-interval")
        _check(args.save_interval > 0, rule, "--save-interval must be > 0")
        if args.save_retain_interval is not None:
            _check(args.save_retain_interval > 0, rule, "--save-retain-interval must be > 0")
            _check(
                args.save_retain_interval % args.save_interval == 0,
                rule,
                "--save-retain-interval must be a multiple of --save-interval",
            )
    if args.log_memory_interval is not None:
        _check(
            args.log_memory_interval % args.log_interval == 0,
            rule,
            "--log-memory-interval must be a multiple of --log-interval",
        )
    # validate_args: mixed precision
    if args.fp16_lm_cross_entropy:
        _check(args.fp16, rule, "lm cross entropy in fp16 only support in fp16 mode.")
    if args.fp32_residual_connection:
        _check(args.fp16 or args.bf16, rule, "residual connection in fp32 needs fp16 or bf16.")
    # (--moe-grouped-gemm's compute capability check needs the GPU: left out)

    # validate_args: deprecated weight decay condition
    if args.no_weight_decay_cond_type is not None:
        _check(
            args.no_weight_decay_cond_type == "apply_wd_to_qk_layernorm",
            rule,
            f"Invalid no_weight_decay_cond_type: {args.no_weight_decay_cond_type}",
        )
        args.apply_wd_to_qk_layernorm = True
        args.no_weight_decay_cond_type = None
    # validate_args: weight decay schedule
    if args.weight_decay_incr_style == "constant":
        _check(args.start_weight_decay is None, rule, "constant weight decay takes no start")
        _check(args.end_weight_decay is None, rule, "constant weight decay takes no end")
        args.start_weight_decay = args.end_weight_decay = args.weight_decay
    else:
        _check(args.start_weight_decay is not None, rule, "--start-weight-decay is required")
        _check(args.end_weight_decay is not None, rule, "--end-weight-decay is required")

    # validate_args: activation recomputation
    if args.distribute_saved_activations:
        _check(
            args.tensor_model_parallel_size > 1,
            rule,
            "can distribute recomputed activations only across tensor model parallel groups",
        )
        _check(
            args.recompute_granularity == "full",
            rule,
            "distributed recompute activations is only application to full recompute granularity",
        )
        _check(
            args.recompute_method is not None,
            rule,
            "for distributed recompute activations to work you need to use a recompute method",
        )
    if args.recompute_granularity == "selective":
        _check(
            args.recompute_method is None,
            rule,
            "recompute method is not yet supported for selective recomputing granularity",
        )

    # validate_args: sequence parallelism is turned off without TP
    if args.tensor_model_parallel_size == 1:
        args.sequence_parallel = False
    if args.tp_comm_overlap:
        _check(
            args.sequence_parallel,
            rule,
            "Tensor parallel communication/GEMM overlap can happen only when sequence "
            "parallelism is enabled",
        )
    if args.hybrid_context_parallel:
        detail = "Hybrid context parallelism"
        _check(not args.pipeline_model_parallel_size > 1, rule, f"{detail} not supported with PP")
        _check(
            not getattr(args, "enable_cuda_graph", True),  # deleted once it was set
            rule,
            f"{detail} not supported with CUDA Graph",
        )
        _check(not args.use_megatron_fsdp, rule, f"{detail} not supported with Megatron FSDP")
        _check(args.dataloader_type == "single", rule, f"{detail} needs the single dataloader")
        _check(args.calculate_per_token_loss, rule, f"{detail} needs --calculate-per-token-loss")
    # (TP or CP > 1 asserts CUDA_DEVICE_MAX_CONNECTIONS=1 before Blackwell: an environment
    # variable, left out; launchers.megatron.rank_environment sets it.)

    if not args.add_bias_linear:
        args.bias_gelu_fusion = False
    if args.add_bias_linear:
        args.add_qkv_bias = True
    # validate_args: QK clipping (the Transformer Engine version check left out)
    if args.qk_clip:
        _check(0.0 < args.qk_clip_alpha < 1.0, rule, "--qk-clip-alpha must be in (0, 1)")
        _check(args.qk_clip_threshold > 0, rule, "--qk-clip-threshold must be > 0")
    if args.decoupled_lr is not None or args.decoupled_min_lr is not None:
        _check(not args.use_legacy_models, rule, "--decoupled-lr not supported in legacy models")

    # validate_args: position embeddings
    if args.use_rotary_position_embeddings:
        args.position_embedding_type = "rope"
    _check(
        not (args.rotary_interleaved and args.use_legacy_models),
        rule,
        "--rotary-interleaved is not supported in legacy models.",
    )
    if args.position_embedding_type != "rope":
        args.apply_rope_fusion = False
    _check(
        args.add_position_embedding or args.position_embedding_type == "rope",
        rule,
        "--no-position-embedding is deprecated, use --position-embedding-type",
    )
    if args.position_embedding_type == "relative":
        _check(
            args.transformer_impl == "transformer_engine",
            rule,
            "Local transformer implementation does not support relative position embeddings.",
        )
    if args.position_embedding_type == "mrope":
        _check(
            args.mrope_section is not None,
            rule,
            "--mrope-section should be set when using --position-embedding-type mrope.",
        )

    # validate_args: MoE sizes
    if args.num_experts == 0:
        args.num_experts = None
    if args.num_experts is not None and args.moe_ffn_hidden_size is None:
        args.moe_ffn_hidden_size = args.ffn_hidden_size
    if args.context_parallel_size > 1:
        _check(not args.use_legacy_models, rule, "Context parallelism is not supported in legacy")
    # validate_args: expert parallelism divides the experts
    if args.expert_model_parallel_size > 1:
        _check(
            args.num_experts is not None,
            rule,
            "num_experts must be non None to use expert model parallelism",
        )
        _check(
            args.num_experts % args.expert_model_parallel_size == 0,
            rule,
            "Number of experts should be a multiple of expert model parallel_size.",
        )
    for dest in ("moe_router_load_balancing_type", "moe_aux_loss_coeff"):
        value = getattr(args, dest)
        if isinstance(value, list) and len(value) == 1:
            setattr(args, dest, value[0])

    # validate_args: checkpoint formats
    _check(
        not (args.use_dist_ckpt and args.use_legacy_models),
        rule,
        "--use-dist-ckpt is not supported in legacy models.",
    )
    if args.ckpt_format == "torch_dcp":
        _check(args.use_torch_fsdp2, rule, "--ckpt-format torch_dcp is only tested with FSDP.")
        _check(args.tensor_model_parallel_size <= 1, rule, "torch_dcp is not tested with TP")
        _check(args.pipeline_model_parallel_size <= 1, rule, "torch_dcp is not tested with PP")
    if args.ckpt_format == "fsdp_dtensor":
        _check(args.use_megatron_fsdp, rule, "fsdp_dtensor is only tested with Megatron FSDP.")

    # validate_args: one data source
    _check(
        args.mock_data + bool(args.data_path) + any(per_split) <= 1,
        rule,
        "A single data source must be provided in training mode, else None",
    )
    if args.fim_data:
        tokens = (
            args.fim_prefix_token,
            args.fim_middle_token,
            args.fim_suffix_token,
            args.fim_pad_token,
            args.fim_eod_token,
        )
        _check(not args.mock_data, rule, "Mock dataset is not supported with FIM dataset.")
        _check(
            not args.legacy_tokenizer, rule, "FIM dataset is not supported with legacy tokenizers"
        )
        _check(args.fim_rate, rule, "--fim-rate should be specified.")
        _check(args.fim_spm_rate, rule, "--fim-spm-rate should be specified.")
        _check(all(t is not None for t in tokens), rule, "FIM extra tokens should be specified.")
    # validate_args: deterministic mode (NCCL_ALGO, an environment variable, left out)
    if args.deterministic_mode:
        _check(not args.use_flash_attn, rule, "Flash attention can not be used in deterministic")
        _check(
            not args.cross_entropy_loss_fusion,
            rule,
            "Cross Entropy Fusion is currently not deterministic.",
        )
    if args.apply_query_key_layer_scaling:
        args.attention_softmax_in_fp32 = True
    # (--result-rejected-tracker-filename reads a file: left out)

    # validate_args: without Gloo process groups
    if not args.enable_gloo_process_groups and args.use_distributed_optimizer:
        _check(
            args.use_dist_ckpt,
            rule,
            "the distributed optimizer without Gloo process groups needs distributed "
            "checkpointing (a --ckpt-format other than torch)",
        )
        if args.dist_ckpt_optim_fully_reshardable:
            _check(
                not args.distrib_optim_fully_reshardable_mem_efficient,
                rule,
                "--distrib-optim-fully-reshardable-mem-efficient requires Gloo process groups",
            )
    if args.fake_process_group:
        _check(
            args.moe_token_dispatcher_type != "flex",
            rule,
            "Fake process group is not supported with flex token dispatcher.",
        )
        args.check_for_nan_in_loss_and_grad = False
        args.enable_gloo_process_groups = False
    if args.load_main_params_from_ckpt:
        _check(args.no_load_optim, rule, "--load-main-params-from-ckpt needs --no-load-optim.")
    if args.use_dist_ckpt and args.async_save and not args.use_persistent_ckpt_worker:
        args.async_save = False

    # validate_args: inference settings
    if args.inference_batch_times_seqlen_threshold > -1:
        _check(
            args.pipeline_model_parallel_size > 1,
            rule,
            "--inference-batch-times-seqlen-threshold requires PP > 1.",
        )
        _check(args.cuda_graph_impl == "none", rule, "PP microbatched inference and CUDA graphs")
    if args.inference_dynamic_batching:
        _check(
            args.inference_dynamic_batching_buffer_size_gb is not None,
            rule,
            "--inference-dynamic-batching needs --inference-dynamic-batching-buffer-size-gb",
        )
        _check(
            args.inference_dynamic_batching_block_size % 256 == 0,
            rule,
            "block size should be a multiple of 256",
        )
    if args.cuda_graph_impl == "local" and args.expert_model_parallel_size > 1:
        _check(
            args.moe_pad_experts_for_cuda_graph_inference,
            rule,
            "--moe-pad-experts-for-cuda-graph-inference must be set when using CUDA graphs "
            "with expert parallelism",
        )
    # validate_args: MoE upcycling, skipped training
    if args.moe_use_upcycling:
        _check(args.save is not None, rule, "When using upcycling, --save must be specified.")
        args.no_load_optim = args.no_load_rng = True
    if args.skip_train and not args.no_load_optim:
        args.no_load_optim = True

    # validate_args: the Muon optimizer
    if "muon" in args.optimizer:
        for ok, detail in (
            (not args.overlap_grad_reduce, "overlap grad reduce"),
            (not args.overlap_param_gather, "overlap param gather"),
            (not args.use_distributed_optimizer, "distributed optimizer"),
            (not args.use_torch_fsdp2, "Torch-FSDP2"),
            (not args.use_megatron_fsdp, "Megatron-FSDP"),
        ):
            _check(ok, rule, f"Muon optimizer does not support {detail} for now.")
        _check(
            args.ckpt_format in ("torch", "torch_dist"),
            rule,
            "Muon optimizer supports torch and torch_dist checkpoint format.",
        )
    if args.optimizer_cpu_offload:
        _check(
            args.use_precision_aware_optimizer,
            rule,
            "The optimizer cpu offload needs --use-precision-aware-optimizer",
        )
        _check(
            not args.fp8_param_gather or args.fp8_recipe == "delayed",
            rule,
            "optimizer cpu offload with --fp8-param-gather needs --fp8-recipe delayed",
        )

    # validate_args: local non-persistent checkpoints, replication
    if args.non_persistent_ckpt_type == "local":
        _check(
            args.non_persistent_local_ckpt_dir is not None,
            rule,
            "Tried to use local checkpointing without specifying --local-ckpt-dir!",
        )
    if args.replication:
        _check(args.replication_jump is not None, rule, "--replication requires --replication-jump")
        _check(
            args.non_persistent_ckpt_type == "local",
            rule,
            "--replication requires --non-persistent-ckpt-type local",
        )
    elif args.replication_jump:
        args.replication_jump = None

    # validate_args: TE-only features (their TE version checks left out)
    if args.delay_wgrad_compute:
        _check(
            args.transformer_impl == "transformer_engine",
            rule,
            "Delaying wgrad compute is only supported with transformer_engine implementation",
        )
    if args.fine_grained_activation_offloading:
        _check(
            args.transformer_impl == "transformer_engine",
            rule,
            "Fine-grained activation offloading is only supported with transformer_engine",
        )
    # validate_args: multi-token prediction needs rope or no position embedding
    if args.mtp_num_layers:
        _check(not args.use_legacy_models, rule, "legacy models do not support MTP")
        _check(
            args.position_embedding_type in ("rope", "none"),
            rule,
            f"Multi-Token Prediction (MTP) is not supported with "
            f"{args.position_embedding_type} position embedding type.",
        )
    if args.cpu_offloading_num_layers > 0:
        args.cpu_offloading = True
    if args.cuda_graph_impl != "none" and "transformer_engine" in (
        args.transformer_impl,
        args.cuda_graph_impl,
    ):
        args.te_rng_tracker = True
    # validate_args: the deprecated "full" CUDA graph scope
    if "full" in args.cuda_graph_scope:
        _check(args.cuda_graph_scope == ["full"], rule, "full scope cannot be used with others.")
        args.cuda_graph_scope = []
    # validate_args: multi-latent attention excludes grouped-query attention
    if args.multi_latent_attention:
        _check(
            not args.group_query_attention,
            rule,
            "Group query attention is mutually exclusive with multi latent attention.",
        )
    # validate_args: MoE latent projections
    if args.moe_latent_size is not None:
        _check(args.moe_latent_size > 0, rule, "MoE latent projection dimension must be > 0.")
        _check(args.num_experts is not None, rule, "MoE latent projections need MoE.")
        _check(not args.use_legacy_models, rule, "MoE latent projections need mcore models.")
        _check(
            not args.moe_use_legacy_grouped_gemm,
            rule,
            "MoE latent projection is not supported yet with legacy grouped GEMM.",
        )
    if args.tiktoken_special_tokens and not args.tokenizer_special_tokens:
        args.tokenizer_special_tokens = args.tiktoken_special_tokens


def _check_rl_step(args: argparse.Namespace) -> None:
    """validate_args: the batch-size checks of an RL step."""
    rule = "validate_args"
    _check(
        not (args.rl_remove_kv_cache_during_training and args.rl_offload_kv_cache_during_training),
        rule,
        "Cannot use both remove-kv-cache-during-training and offload-kv-cache-during-training",
    )
    _check(
        not (args.rl_partial_rollouts and args.rl_remove_kv_cache_during_training),
        rule,
        "Cannot use both partial-rollouts and remove-kv-cache-during-training",
    )
    _check(
        not (
            args.rl_offload_inference_model_weights_when_idle
            and args.rl_inference_model_unified_memory_level != 1
        ),
        rule,
        "--rl-offload-inference-model-weights-when-idle requires "
        "--rl-inference-model-unified-memory-level=1.",
    )
    if (
        args.rl_inference_expert_model_parallel_size is not None
        and args.rl_inference_expert_model_parallel_size != args.expert_model_parallel_size
    ):
        _check(
            not args.moe_use_legacy_grouped_gemm,
            rule,
            "Legacy GroupedMLP is not supported with different EP sizes for inference and training",
        )
    args.grpo_samples_per_iteration = args.grpo_prompts_per_step * args.grpo_group_size
    generated = args.grpo_samples_per_iteration * args.grpo_iterations
    _check(
        generated % args.global_batch_size == 0,
        rule,
        "grpo_group_size * grpo_prompts_per_step * grpo_iterations should be divisible by "
        "global_batch_size",
    )
    steps = generated // args.global_batch_size
    if args.exit_interval is not None:
        _check(args.exit_interval % steps == 0, rule, "exit_interval must divide into RL steps")
    if args.save_interval is not None:
        _check(args.save_interval % steps == 0, rule, "save_interval must divide into RL steps")
    if args.rl_use_sequence_packing:
        _check(args.micro_batch_size == 1, rule, "sequence packing needs micro_batch_size 1")


def _virtual_pipeline(args: argparse.Namespace) -> None:
    """validate_args: the virtual pipeline size (from the layout string, the layers per virtual
    stage or the virtual stages per rank: at most one of them), the layer count per pipeline
    stage without one, and the interleaved schedule's overlap-p2p rule."""
    rule = "validate_args"
    given = [
        args.num_layers_per_virtual_pipeline_stage is not None,
        args.num_virtual_stages_per_pipeline_rank is not None,
        args.pipeline_model_parallel_layout is not None,
    ]
    _check(
        sum(given) <= 1,
        rule,
        "No more than one of the following arguments can be set at the same time: "
        "--num-layers-per-virtual-pipeline-stage, --num-virtual-stages-per-pipeline-rank, "
        "--pipeline-model-parallel-layout",
    )
    pp = args.pipeline_model_parallel_size
    if args.pipeline_model_parallel_layout is not None:
        from megatron.core.transformer.pipeline_parallel_layer_layout import (
            PipelineParallelLayerLayout,
        )

        layout = args.pipeline_model_parallel_layout
        stages = _megatron_core(
            rule, lambda: PipelineParallelLayerLayout.get_num_stages_from_str(layout)
        )
        _check(
            stages % pp == 0,
            rule,
            f"The length of pipeline_model_parallel_layout must be divisible by "
            f"pipeline_model_parallel_size (num_stages={stages}, pp={pp})",
        )
        args.virtual_pipeline_model_parallel_size = stages // pp
    elif given[0] or given[1]:
        if args.num_virtual_stages_per_pipeline_rank is None:
            _check(
                args.decoder_first_pipeline_num_layers is None
                and args.decoder_last_pipeline_num_layers is None,
                rule,
                "please use --num-virtual-stages-per-pipeline-rank to specify virtual pipeline "
                "parallel degree when enable uneven pipeline parallelism",
            )
            num_layers = args.num_layers if args.num_layers is not None else args.decoder_num_layers
            num_layers += args.account_for_embedding_in_pipeline_split
            num_layers += args.account_for_loss_in_pipeline_split
            _check(
                num_layers % pp == 0,
                rule,
                "number of layers of the model must be divisible pipeline model parallel size",
            )
            per_stage = num_layers // pp
            _check(
                per_stage % args.num_layers_per_virtual_pipeline_stage == 0,
                rule,
                "number of layers per pipeline stage must be divisible number of layers per "
                "virtual pipeline stage",
            )
            args.virtual_pipeline_model_parallel_size = (
                per_stage // args.num_layers_per_virtual_pipeline_stage
            )
        else:
            args.virtual_pipeline_model_parallel_size = args.num_virtual_stages_per_pipeline_rank
    else:
        args.virtual_pipeline_model_parallel_size = None
        no_uneven = (
            args.decoder_first_pipeline_num_layers is None
            and args.decoder_last_pipeline_num_layers is None
        )
        if no_uneven and args.num_layers is not None:
            num_layers = (
                args.num_layers
                + args.account_for_embedding_in_pipeline_split
                + args.account_for_loss_in_pipeline_split
            )
            _check(
                num_layers % pp == 0,
                rule,
                f"Number of layers should be divisible by the pipeline-model-parallel size "
                f"({num_layers} layers, PP {pp})",
            )
    if args.virtual_pipeline_model_parallel_size == 1:
        args.virtual_pipeline_model_parallel_size = None

    if args.virtual_pipeline_model_parallel_size is not None:
        if args.overlap_p2p_comm:
            _check(
                pp > 1,
                rule,
                "When interleaved schedule is used, pipeline-model-parallel size should be "
                "greater than 1",
            )
        else:
            _check(
                pp > 2,
                rule,
                "When interleaved schedule is used and p2p communication overlap is disabled, "
                "pipeline-model-parallel size should be greater than 2 to avoid having multiple "
                "p2p sends and recvs between same 2 ranks per communication batch",
            )
    else:
        args.overlap_p2p_comm = False
        args.align_param_gather = False


def _full_iteration_scope(args: argparse.Namespace) -> bool:
    from megatron.core.transformer.enums import CudaGraphScope

    return CudaGraphScope.full_iteration in args.cuda_graph_scope


# --------------------------------------------------------------------------------------------
# start-up: initialize_megatron


_TOKENIZER_INPUTS = {  # build_tokenizer: the arguments each tokenizer asserts are given
    "BertWordPieceLowerCase": ("vocab_file",),
    "BertWordPieceCase": ("vocab_file",),
    "GPT2BPETokenizer": ("vocab_file", "merge_file"),
    "SentencePieceTokenizer": ("tokenizer_model",),
    "GPTSentencePieceTokenizer": ("tokenizer_model",),
    "Llama2Tokenizer": ("tokenizer_model",),
    "TikTokenizer": ("tokenizer_model", "tiktoken_pattern"),
    "NullTokenizer": ("vocab_size",),
    "NullMultimodalTokenizer": ("vocab_size",),
}


def _initialize_checks(args: argparse.Namespace) -> None:
    """initialize_megatron after validate_args: the micro-batch calculator, the tokenizer's
    inputs, initialize_model_parallel's rank grids and the seed."""
    from megatron.core.num_microbatches_calculator import (
        ConstantNumMicroBatchesCalculator,
        RampupBatchsizeNumMicroBatchesCalculator,
    )

    # initialize_megatron: checkpoint conversion and checkpoint arguments
    if args.ckpt_convert_format is not None:
        rule = "initialize_megatron"
        _check(args.ckpt_convert_save is not None, rule, "--ckpt-convert-format needs a save dir")
        _check(args.load is not None, rule, "--ckpt-convert-format needs --load")
    if args.use_checkpoint_args:
        _check(
            args.load is not None or args.pretrained_checkpoint is not None,
            "initialize_megatron",
            "--use-checkpoint-args requires --load or --pretrained-checkpoint argument",
        )
        raise NotImplementedError("the oracle does not read arguments from a checkpoint")

    # set_global_variables -> init_num_microbatches_calculator: GBS divisible by MBS x DP
    sizes = (args.global_batch_size, args.micro_batch_size, args.data_parallel_size)
    flags = (args.decrease_batch_size_if_needed, args.rank)
    if args.rampup_batch_size is None:
        _megatron_core(
            "ConstantNumMicroBatchesCalculator",
            lambda: ConstantNumMicroBatchesCalculator(*sizes, *flags),
        )
    else:
        ramp = args.rampup_batch_size
        _check(
            len(ramp) == 3,
            "init_num_microbatches_calculator",
            "expected --rampup-batch-size <start batch size> <batch size increment> <samples>",
        )
        _megatron_core(
            "RampupBatchsizeNumMicroBatchesCalculator",
            lambda: RampupBatchsizeNumMicroBatchesCalculator(
                *sizes, *flags, int(ramp[0]), int(ramp[1]), int(ramp[2])
            ),
        )

    # set_global_variables -> build_tokenizer: the inputs each tokenizer asserts
    for dest in _TOKENIZER_INPUTS.get(args.tokenizer_type, ()):
        _check(
            getattr(args, dest) is not None,
            "build_tokenizer",
            f"{args.tokenizer_type} needs --{dest.replace('_', '-')}",
        )
    if args.tokenizer_type == "TikTokenizer":
        _check(args.tiktoken_pattern in {"v1", "v2"}, "build_tokenizer", "tiktoken pattern v1/v2")

    _model_parallel_grids(args)

    # _set_random_seed: a positive seed
    _check(
        args.seed is not None and args.seed > 0,
        "_set_random_seed",
        f"Seed ({args.seed}) should be a positive integer.",
    )


def _model_parallel_grids(args: argparse.Namespace) -> None:
    """initialize_model_parallel: the interleaved schedule needs PP > 1, the world splits into
    the expert grid ETP x EP x PP, attention and experts share the pipeline groups, and DP x CP
    splits into the distributed optimizer instances."""
    from megatron.core.parallel_state import RankGenerator

    rule = "initialize_model_parallel"
    world, pp = args.world_size, args.pipeline_model_parallel_size
    tp, cp = args.tensor_model_parallel_size, args.context_parallel_size
    ep, etp = args.expert_model_parallel_size, args.expert_tensor_parallel_size
    dp = args.data_parallel_size
    if args.virtual_pipeline_model_parallel_size is not None:
        _check(
            pp > 1,
            rule,
            "pipeline-model-parallel size should be greater than 1 with interleaved schedule",
        )
    expert_grid = etp * ep * pp
    _check(
        world % expert_grid == 0,
        rule,
        f"world_size ({world}) is not divisible by expert_tensor_model_pipeline_parallel size "
        f"(ETP {etp} x EP {ep} x PP {pp} = {expert_grid})",
    )
    order = "tp-cp-ep-pp-dp" if args.use_tp_pp_dp_mapping else "tp-cp-ep-dp-pp"
    expert_dp = world // expert_grid
    _check(
        order.endswith("pp") or pp == 1 or expert_dp == dp,
        rule,
        "When not using pp-last rank ordering, the data parallel size of the attention and moe "
        "layers must be the same",
    )
    decoder = RankGenerator(tp=tp, ep=1, dp=dp, pp=pp, cp=cp, order=order, rank_offset=0)
    experts = RankGenerator(tp=etp, ep=ep, dp=expert_dp, pp=pp, cp=1, order=order, rank_offset=0)
    _check(
        decoder.get_ranks("pp") == experts.get_ranks("pp"),
        rule,
        "Pipeline parallel groups are expected to be the same for Non-Expert and Expert part",
    )
    _check(
        (dp * cp) % args.num_distributed_optimizer_instances == 0,
        rule,
        "Data parallel size should be divisible by partial DistOpt shard factor",
    )


# --------------------------------------------------------------------------------------------
# start-up: the model's TransformerConfig


def _activation(args: argparse.Namespace) -> tuple[str, bool]:
    """core_transformer_config_from_args: the activation function's name and whether the MLP
    is gated (--swiglu: silu; --squared-relu; --quick-geglu: gated quick_gelu; else gelu)."""
    rule = "core_transformer_config_from_args"
    if args.squared_relu:
        _check(not args.swiglu, rule, "--squared-relu and --swiglu cannot both be set")
        return "squared_relu", bool(args.swiglu)
    if args.quick_geglu:
        _check(not args.swiglu, rule, "--quick-geglu and --swiglu cannot both be set")
        return "quick_gelu", True
    return ("silu", True) if args.swiglu else ("gelu", False)


def _transformer_config_checks(args: argparse.Namespace) -> None:
    """``TransformerConfig.__post_init__`` (with ``ModelParallelConfig``'s and
    ``MLATransformerConfig``'s) for the config ``core_transformer_config_from_args`` builds;
    checks that need Transformer Engine or a given TE/torch version are left out."""
    rule = "TransformerConfig.__post_init__"
    activation, gated = _activation(args)
    if args.rope_type is not None:
        _check(
            args.multi_latent_attention or args.rope_type == "rope",
            "core_transformer_config_from_args",
            f'Common attention only support rope_type="rope", but got {args.rope_type}.',
        )
    tp, pp = args.tensor_model_parallel_size, args.pipeline_model_parallel_size
    experts = args.num_experts
    recompute_modules = args.recompute_modules
    cpu_offloading = getattr(args, "cpu_offloading", False)

    # ModelParallelConfig.__post_init__
    _check(
        not args.sequence_parallel or tp > 1,
        "ModelParallelConfig.__post_init__",
        "Cannot use sequence parallelism without tensor parallelism",
    )
    if args.defer_embedding_wgrad_compute:
        detail = "Cannot defer embedding wgrad compute"
        _check(pp > 1, "ModelParallelConfig.__post_init__", f"{detail} without PP")
        _check(
            args.gradient_accumulation_fusion,
            "ModelParallelConfig.__post_init__",
            f"{detail} without gradient accumulation fusion",
        )
        _check(
            args.wgrad_deferral_limit >= 0,
            "ModelParallelConfig.__post_init__",
            "Wgrad deferral limit should be >= 0",
        )
    if args.overlap_p2p_comm_warmup_flush:
        _check(
            args.overlap_p2p_comm,  # the config's batch_p2p_comm is not overlap_p2p_comm
            "ModelParallelConfig.__post_init__",
            "Pipeline parallel communication overlapping in warmup and flush is only compatible "
            "with overlap_p2p_comm but not batch_p2p_comm.",
        )

    _check(not (args.fp16 and args.bf16), rule, "Only one of fp16 and bf16 should be True.")
    # TransformerConfig.__post_init__: heads and query groups split over TP
    _check(
        args.num_attention_heads % tp == 0,
        rule,
        f"num_attention_heads ({args.num_attention_heads}) must be a multiple of "
        f"tensor_model_parallel_size ({tp}).",
    )
    groups = args.num_query_groups if args.group_query_attention else None
    groups = args.num_attention_heads if groups is None else groups
    _check(
        groups % tp == 0 or tp % groups == 0,
        rule,
        f"num_query_groups ({groups}) must be a multiple or divisor of "
        f"tensor_model_parallel_size ({tp}).",
    )
    if args.experimental_attention_variant == "gated_delta_net":
        _gated_delta_net_checks(args, rule)
    # TransformerConfig.__post_init__: fp8 / fp4
    if args.fp8:
        _check(
            not (args.first_last_layers_bf16 and args.fp8_recipe == "delayed"),
            rule,
            "Delayed scaling does not support first / last layer in BF16.",
        )
        most = args.num_layers // pp
        if args.first_last_layers_bf16:
            for dest in ("num_layers_at_start_in_bf16", "num_layers_at_end_in_bf16"):
                _check(
                    0 <= getattr(args, dest) <= most,
                    rule,
                    f"{dest} must be between 0 and the layers per pipeline stage ({most})",
                )
        if args.fp8_recipe == "custom":
            _check(args.fp8_quantizer_factory, rule, "fp8_recipe custom needs a quantizer factory")
    _check(not args.fp8_param_gather or args.fp8, rule, "fp8_param must be used with fp8 mode.")
    _check(not args.fp4_param or args.fp4, rule, "fp4_param must be used with fp4 mode.")
    _check(not (args.fp4 and args.fp8), rule, "fp4 and fp8 cannot be used simultaneously.")
    if args.fp4 and args.fp4_recipe == "custom":
        _check(args.fp4_quantizer_factory, rule, "fp4_recipe custom needs a quantizer factory")

    # TransformerConfig.__post_init__: MoE
    _check(
        not (args.expert_model_parallel_size > 1 and experts is None),
        rule,
        "num_moe_experts must be non None to use expert-parallel.",
    )
    _check(experts is None or experts > 0, rule, "num_moe_experts must be non-negative.")
    if experts is None:
        _check(
            args.moe_ffn_hidden_size is None,
            rule,
            "moe_ffn_hidden_size must be None when num_experts is not set.",
        )
    flex_backend = args.moe_flex_dispatcher_backend
    if args.moe_enable_deepep:
        _check(
            args.moe_token_dispatcher_type == "flex",
            rule,
            "DeepEP backend is only supported with flex token dispatcher.",
        )
        _check(flex_backend != "hybridep", rule, "Only one backend for the flex dispatcher.")
        flex_backend = "deepep"
    if args.moe_token_dispatcher_type == "flex":
        _check(
            not (args.moe_pad_expert_input_to_capacity and flex_backend == "deepep"),
            rule,
            "Flex token dispatcher with deepep backend does not support "
            "moe_pad_expert_input_to_capacity",
        )
    if args.moe_shared_expert_intermediate_size is not None:
        _check(
            args.moe_shared_expert_intermediate_size > 0,
            rule,
            "moe_shared_expert_intermediate_size must be > 0",
        )
        _check(
            not args.moe_shared_expert_overlap or args.moe_token_dispatcher_type == "alltoall",
            rule,
            "moe_shared_expert_overlap only works with alltoall token dispatcher.",
        )
    balancing = args.moe_router_load_balancing_type
    if isinstance(balancing, list):
        _check(
            isinstance(args.moe_aux_loss_coeff, list)
            and len(args.moe_aux_loss_coeff) == len(balancing),
            rule,
            "moe_aux_loss_coeff must be a list of the same length as "
            "moe_router_load_balancing_type",
        )
    capacity = args.moe_expert_capacity_factor
    if capacity is not None and capacity < 0:
        capacity = None
    if capacity is not None:
        capacity_types = ("aux_loss", "seq_aux_loss", "global_aux_loss", "none")
        types = balancing if isinstance(balancing, list) else [balancing]
        _check(
            all(t in capacity_types for t in types),
            rule,
            "moe_expert_capacity_factor only works with aux_loss, seq_aux_loss, global_aux_loss "
            "or none load balancing",
        )
    if args.moe_pad_expert_input_to_capacity:
        _check(
            capacity is not None,
            rule,
            "moe_expert_capacity_factor must be set to use moe_pad_expert_input_to_capacity",
        )

    # TransformerConfig.__post_init__: CPU offloading
    if cpu_offloading:
        _check(
            0 <= args.cpu_offloading_num_layers < args.num_layers,
            rule,
            f"CPU offloading can be done only for layers less than {args.num_layers}",
        )
        _check(pp == 1, rule, "no support for Pipeline parallelism with CPU offloading")
        _check(
            args.recompute_granularity is None,
            rule,
            "CPU offloading does not work when activation recomputation is enabled",
        )
    # TransformerConfig.__post_init__: recomputation
    _recompute_checks(args, rule)
    if recompute_modules is None:
        recompute_modules = ["core_attn"]
    granularity = args.recompute_granularity
    if granularity == "selective":
        allowed = {"core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe"}
        allowed.add("shared_experts")
        invalid = set(recompute_modules) - allowed
        _check(not invalid, rule, f"Invalid choices for recompute_modules: {sorted(invalid)}")
        _check(
            "moe_act" not in recompute_modules or args.moe_grouped_gemm,
            rule,
            "moe_act in recompute_modules is only supported with moe_grouped_gemm.",
        )
        _check(
            "mla_up_proj" not in recompute_modules or args.multi_latent_attention,
            rule,
            "mla_up_proj in recompute_modules is only supported with multi_latent_attention.",
        )
        if "shared_experts" in recompute_modules:
            _check(
                not (
                    args.moe_shared_expert_intermediate_size is not None
                    and args.moe_shared_expert_overlap
                ),
                rule,
                "shared_experts recompute cannot work with --moe-shared-expert-overlap.",
            )
        if args.fp8 and ("moe_act" in recompute_modules or "layernorm" in recompute_modules):
            _check(
                args.fp8_recipe != "delayed",
                rule,
                "Delayed scaling does not support moe_act and layernorm recompute for fp8.",
            )
    if args.moe_layer_recompute:
        _check(
            granularity != "full",
            rule,
            "Do not set --moe-layer-recompute with full recompute granularity.",
        )
        granularity = "selective"
        if "moe" not in recompute_modules:
            recompute_modules = [*recompute_modules, "moe"]
    if args.fine_grained_activation_offloading:
        modules = args.offload_modules
        allowed = {"core_attn", "attn_proj", "expert_fc1", "moe_act", "attn_norm", "mlp_norm"}
        allowed.add("qkv_linear")
        _check(not cpu_offloading, rule, "fine_grained_activation_offloading with cpu_offloading")
        _check(modules, rule, "fine_grained_activation_offloading needs --offload-modules")
        invalid = set(modules) - allowed
        _check(not invalid, rule, f"Invalid choices for offload_modules: {sorted(invalid)}")
        _check(
            "attn_proj" not in modules or "core_attn" in modules,
            rule,
            "attn_proj cannot be set to offload_modules alone without core_attn",
        )

    _pipeline_split_checks(args, rule)

    # TransformerConfig.__post_init__: fused bias activation
    bias_fusion = args.bias_swiglu_fusion if args.swiglu else args.bias_gelu_fusion
    if bias_fusion:
        _check(
            activation in ("gelu", "silu", "quick_gelu"),
            rule,
            "When bias_activation_fusion is True, activation function should be either gelu, "
            "swiglu, or quick_geglu",
        )
        _check(
            not (activation == "gelu" and not gated and not args.add_bias_linear),
            rule,
            "bias_activation_fusion with ungated gelu needs add_bias_linear",
        )
        _check(
            not (activation == "quick_gelu" and not gated),
            rule,
            "bias_activation_fusion with quick_gelu needs a gated linear unit",
        )
        _check(
            args.glu_linear_offset == 0.0 or activation == "quick_gelu",
            rule,
            "When bias_activation_fusion is True and glu_linear_offset is non-zero, activation "
            "function must be quick_gelu.",
        )
        _check(
            not args.use_te_activation_func,
            rule,
            "bias_activation_fusion and use_te_activation_func cannot be both true.",
        )
    if args.use_te_activation_func:
        _check(
            activation in ("gelu", "silu", "relu"),
            rule,
            "TransformerEngine only support gelu, geglu, silu, swiglu, relu, reglu.",
        )
    # (apply_rope_fusion needs TE's fused RoPE kernels: left out, except for MLA below)
    _check(
        not (args.multi_latent_attention and args.rotary_interleaved),
        rule,
        "rotary_interleaved does not work with multi_latent_attention.",
    )
    if experts is not None and args.add_bias_linear:
        _check(
            args.expert_tensor_parallel_size == 1,
            rule,
            "Bias in Moe is only supported when ETP==1",
        )
    _check(
        not args.moe_router_enable_expert_bias or args.moe_router_score_function == "sigmoid",
        rule,
        "Expert bias for aux-loss-free routing only supports sigmoid score function.",
    )
    if args.moe_router_padding_for_fp8 or args.moe_router_padding_for_quantization:
        _check(
            args.fp8 is not None or args.fp4 is not None,
            rule,
            "fp8/fp4 must be specified when moe_router_padding_for_quantization is True.",
        )
        _check(
            args.moe_token_dispatcher_type not in ("allgather", "alltoall_seq"),
            rule,
            "allgather and alltoall_seq dispatcher does not support "
            "moe_router_padding_for_quantization.",
        )
    # TransformerConfig.__post_init__: top-1 softmax routing needs the pre-softmax
    _check(
        not (
            args.moe_router_topk == 1
            and args.moe_router_score_function == "softmax"
            and not args.moe_router_pre_softmax
            and balancing != "sinkhorn"
        ),
        rule,
        "Please use --moe-router-pre-softmax when topk is 1.",
    )
    if args.moe_router_group_topk:
        _check(
            args.moe_router_num_groups,
            rule,
            "When using group limited routing, moe_router_num_groups must be specified.",
        )
        _check(
            experts is not None and experts % args.moe_router_num_groups == 0,
            rule,
            f"num_moe_experts ({experts}) should be divisible by moe_router_num_groups "
            f"({args.moe_router_num_groups}).",
        )
        _check(
            args.moe_router_group_topk <= args.moe_router_num_groups,
            rule,
            "moe_router_group_topk should be smaller than moe_router_num_groups",
        )
    _cuda_graph_checks(args, rule, experts, capacity, granularity, recompute_modules)
    _overlap_moe_checks(args, rule, granularity)
    if args.context_parallel_size > 1 and isinstance(args.cp_comm_type, list):
        comm = args.cp_comm_type
        _check(
            len(comm) == 1 or len(comm) == args.num_layers,
            rule,
            f"Length of cp_comm_type ({len(comm)}) should equal to the total number of "
            f"transformer layers ({args.num_layers})!",
        )
    if args.no_rope_freq:
        _check(not args.flash_decode, rule, "flash_decode cannot be used with no_rope.")
        if isinstance(args.no_rope_freq, int):
            _check(
                args.num_layers % args.no_rope_freq == 0,
                rule,
                "no_rope_freq should divide num_layers",
            )
        else:
            _check(
                len(args.no_rope_freq) == args.num_layers,
                rule,
                f"Length of no_rope list ({len(args.no_rope_freq)}) must match the number of "
                f"layers ({args.num_layers})",
            )
    if args.transformer_impl == "inference_optimized":
        _check(
            args.normalization == "RMSNorm"
            and not args.layernorm_zero_centered_gamma
            and not args.add_bias_linear
            and not args.add_qkv_bias,
            rule,
            "inference_optimized needs RMSNorm, no zero-centered gamma and no biases",
        )
    if args.experimental_attention_variant == "dsa":
        _check(args.context_parallel_size == 1, rule, "CP is not supported by DSAttention!")
        _check(not args.apply_rope_fusion, rule, "RoPE fusion is not supported for DSAttention")
    if args.inference_fuse_tp_communication:
        _check(
            args.transformer_impl == "inference_optimized",
            rule,
            "inference_fuse_tp_communication is only supported for inference_optimized",
        )
    if args.batch_invariant_mode:
        _check(
            args.attention_backend == _enums()["attention_backend"].flash,
            rule,
            "Batch invariant mode only supports FlashAttention",
        )
    # MLATransformerConfig.__post_init__
    if args.multi_latent_attention:
        rope_type = args.rope_type or "yarn"
        mla = "MLATransformerConfig.__post_init__"
        _check(
            not (args.apply_rope_fusion and rope_type != "yarn"),
            mla,
            "apply_rope_fusion for MLA only works with YARN RoPE.",
        )
        _check(not args.attention_output_gate, mla, "Output gate is not supported for MLA yet.")
        _check(
            not (args.cache_mla_latents and args.apply_rope_fusion),
            mla,
            "Rope Fusion is not compatible with caching latents",
        )


def _gated_delta_net_checks(args: argparse.Namespace, rule: str) -> None:
    """TransformerConfig.__post_init__: the gated delta net attention variant's sizes."""
    for dest in (
        "linear_attention_freq",
        "linear_conv_kernel_dim",
        "linear_key_head_dim",
        "linear_value_head_dim",
        "linear_num_key_heads",
        "linear_num_value_heads",
    ):
        _check(getattr(args, dest) is not None, rule, f"{dest} must be set for gated delta net.")
    tp = args.tensor_model_parallel_size
    keys, values = args.linear_num_key_heads, args.linear_num_value_heads
    _check(values % keys == 0, rule, "linear_num_value_heads must be a multiple of key heads")
    _check(keys % tp == 0, rule, "linear_num_key_heads must be a multiple of TP")
    _check(values % tp == 0, rule, "linear_num_value_heads must be a multiple of TP")
    _check(args.context_parallel_size == 1, rule, "Gated delta net does not support CP for now")


def _recompute_checks(args: argparse.Namespace, rule: str) -> None:
    """TransformerConfig.__post_init__: recompute granularity, method and layer count."""
    granularity = args.recompute_granularity
    if granularity is None:
        return
    if args.recompute_method is None:
        _check(
            granularity == "selective",
            rule,
            f'Using recompute_granularity: {granularity} so recompute_method must be "block" '
            'or "uniform"',
        )
    if granularity != "selective":
        _check(
            args.recompute_num_layers is not None,
            rule,
            f"When using recompute_granularity: {granularity} recompute_num_layers must be "
            f"between 1 and num_layers_per_pipeline_rank",
        )
    else:
        _check(
            args.recompute_num_layers is None,
            rule,
            "When using recompute_granularity: selective recompute_num_layers must be None.",
        )
    _check(
        not (args.distribute_saved_activations and args.sequence_parallel),
        rule,
        "distribute_saved_activations must be false when sequence parallel is enabled",
    )


def _pipeline_split_checks(args: argparse.Namespace, rule: str) -> None:
    """TransformerConfig.__post_init__: the layout string against the other split flags and
    megatron-core's own ``PipelineParallelLayerLayout`` check; the uneven first/last stage
    sizes; the embedding/loss accounting with virtual stages."""
    pp = args.pipeline_model_parallel_size
    vpp = args.virtual_pipeline_model_parallel_size
    first, last = args.decoder_first_pipeline_num_layers, args.decoder_last_pipeline_num_layers
    accounting = args.account_for_embedding_in_pipeline_split or (
        args.account_for_loss_in_pipeline_split
    )
    _check(
        not ((first is not None or last is not None) and accounting),
        rule,
        "num_layers_in_first_pipeline_stage and num_layers_in_last_pipeline_stage cannot be set "
        "at the same time with account_for_embedding_in_pipeline_split and "
        "account_for_loss_in_pipeline_split",
    )
    if args.pipeline_model_parallel_layout is not None:
        from megatron.core.transformer.pipeline_parallel_layer_layout import (
            PipelineParallelLayerLayout,
        )

        _check(
            first is None and last is None and not accounting,
            rule,
            "pipeline_model_parallel_layout cannot be set with other pipeline layout arguments.",
        )
        text = args.pipeline_model_parallel_layout
        layout = _megatron_core(
            "PipelineParallelLayerLayout", lambda: PipelineParallelLayerLayout(text, pp)
        )
        detected = layout.virtual_pipeline_model_parallel_size
        _check(
            vpp is None or vpp == detected,
            rule,
            "virtual_pipeline_model_parallel_size conflicts with pipeline_model_parallel_layout",
        )
        _megatron_core(
            "PipelineParallelLayerLayout.validate_layer_layout",
            lambda: layout.validate_layer_layout(
                num_layers=args.num_layers, mtp_num_layers=args.mtp_num_layers
            ),
        )
    elif first is not None or last is not None:
        layers, stages = args.num_layers, pp
        for name, count in (("first", first), ("last", last)):
            if count is None:
                continue
            _check(count > 0, rule, f"num_layers_in_{name}_pipeline_stage must be larger than 0")
            if vpp is not None:
                _check(
                    count % vpp == 0,
                    rule,
                    f"number of layers at {name} stage: {count} must be divisible by virtual "
                    f"pipeline parallel degree {vpp}",
                )
            layers -= count
            stages -= 1
        _check(
            bool(layers) == bool(stages),
            rule,
            f"Mismatch: {layers} middle layers remaining but {stages} middle PP stages available.",
        )
        if stages:
            _check(
                layers % stages == 0,
                rule,
                f"number of layers at middle stage: {layers} must be divisible by the middle "
                f"pipeline model parallel size {stages}",
            )
            if vpp is not None:
                _check(
                    (layers // stages) % vpp == 0,
                    rule,
                    f"number of layers on each middle pipeline rank: {layers // stages} must be "
                    f"divisible by virtual pipeline parallel degree {vpp}",
                )
    elif accounting:
        layers = (
            args.num_layers
            + args.account_for_embedding_in_pipeline_split
            + args.account_for_loss_in_pipeline_split
        )
        _check(
            layers % pp == 0,
            rule,
            f"num_layers: {layers} after account_for_embedding/loss_in_pipeline_split must be "
            f"divisible by pipeline_model_parallel_size {pp}",
        )
        if vpp is not None:
            _check(
                (layers // pp) % vpp == 0,
                rule,
                f"number of layers on each pipeline rank: {layers // pp} (after account_for_"
                f"embedding/loss_in_pipeline_split) must be divisible by "
                f"virtual_pipeline_model_parallel_size {vpp}",
            )


def _cuda_graph_checks(
    args: argparse.Namespace,
    rule: str,
    experts: int | None,
    capacity: float | None,
    granularity: str | None,
    recompute_modules: list[str],
) -> None:
    """TransformerConfig.__post_init__: CUDA graph implementation and scopes."""
    if args.cuda_graph_impl == "none":
        return
    from megatron.core.transformer.enums import CudaGraphScope as Scope

    scope = list(args.cuda_graph_scope)
    _check(not getattr(args, "cpu_offloading", False), rule, "CUDA graphs with CPU offloading")
    if args.cuda_graph_impl == "local" and (
        Scope.moe_router in scope or Scope.moe_preprocess in scope
    ):
        scope += [s for s in (Scope.moe_router, Scope.moe_preprocess) if s not in scope]
    if args.cuda_graph_impl == "transformer_engine":
        _check(
            Scope.full_iteration not in scope,
            rule,
            "To use full iteration cuda graph, please use cuda_graph_impl=local",
        )
    _check(
        not (Scope.moe in scope and Scope.moe_router in scope),
        rule,
        "cuda_graph_scope must not contain both moe and moe_router.",
    )
    if Scope.moe_preprocess in scope:
        _check(Scope.moe_router in scope, rule, "moe_preprocess graph needs moe_router graph.")
    if experts is None or experts <= 1:
        _check(
            Scope.moe not in scope and Scope.moe_router not in scope,
            rule,
            "moe cuda graph is only supported for MoE.",
        )
    else:
        freq = args.moe_layer_freq
        if freq == 1 or (isinstance(freq, list) and 0 not in freq):
            _check(Scope.mlp not in scope, rule, "mlp cuda graph needs dense layers in the model")
        if capacity is None or not args.moe_pad_expert_input_to_capacity:
            _check(Scope.moe not in scope, rule, "moe cuda graph needs drop-padding MoE.")
            if args.moe_token_dispatcher_type == "alltoall" and (
                capacity is not None or args.moe_router_padding_for_fp8
            ):
                _check(
                    Scope.moe_preprocess not in scope,
                    rule,
                    "moe_preprocess cuda graph is not supported with DtoH copies",
                )
    if granularity:
        if granularity != "selective":
            _check(
                scope == [Scope.full_iteration],
                rule,
                "full recompute is only supported with full iteration CUDA graph.",
            )
        else:
            if args.cuda_graph_impl == "transformer_engine" and "moe" in recompute_modules:
                _check(
                    Scope.moe_router not in scope,
                    rule,
                    "moe recompute is not supported with moe_router CUDA graph",
                )
            full = not scope or Scope.full_iteration in scope
            if args.attention_dropout != 0.0:
                _check(
                    (
                        (not full and Scope.attn not in scope)
                        or "core_attn" not in recompute_modules
                    ),
                    rule,
                    "attention dropout is not supported with graphed attention recomputation.",
                )
            if args.hidden_dropout != 0.0:
                _check(
                    ((not full and Scope.mlp not in scope) or "mlp" not in recompute_modules)
                    and ((not full and Scope.moe not in scope) or "moe" not in recompute_modules),
                    rule,
                    "hidden dropout is not supported with graphed MLP/MoE recomputation.",
                )
            if args.moe_input_jitter_eps is not None:
                _check(
                    (not full and Scope.moe not in scope) or "moe" not in recompute_modules,
                    rule,
                    "moe_input_jitter_eps is not supported with graphed moe recomputation.",
                )


def _overlap_moe_checks(args: argparse.Namespace, rule: str, granularity: str | None) -> None:
    """TransformerConfig.__post_init__: EP all-to-all overlap and delayed weight gradients
    (the torch and TE version checks left out)."""
    if args.overlap_moe_expert_parallel_comm:
        detail = "overlap_moe_expert_parallel_comm"
        if args.pipeline_model_parallel_size > 1:
            _check(
                args.virtual_pipeline_model_parallel_size is not None,
                rule,
                f"{detail} needs virtual pipeline stages when PP > 1",
            )
        _check(args.expert_model_parallel_size > 1, rule, f"{detail} needs EP > 1")
        _check(
            args.moe_token_dispatcher_type in ("alltoall", "flex"),
            rule,
            f"{detail} is supported with alltoall/flex token dispatcher",
        )
        _check(granularity != "full", rule, f"disable full recomputation with {detail}")
        _check(args.recompute_method is None, rule, f"disable recompute method with {detail}")
        _check(args.recompute_num_layers is None, rule, f"recompute_num_layers with {detail}")
        _check(args.bf16 or args.fp16, rule, f"{detail} needs bf16 or fp16")
        _check(not args.moe_shared_expert_overlap, rule, f"shared expert overlap with {detail}")
        _check(
            args.mtp_num_layers is None or args.mtp_num_layers == 1,
            rule,
            f"MTP layernum only supports 1 with {detail}",
        )
        if args.mtp_num_layers == 1:
            _check(
                args.pipeline_model_parallel_size > 1,
                rule,
                f"PP must be > 1 with {detail} and an MTP layer",
            )
        if args.cuda_graph_impl != "none":
            from megatron.core.transformer.enums import CudaGraphScope as Scope

            _check(
                args.cuda_graph_impl == "transformer_engine"
                and Scope.moe not in args.cuda_graph_scope
                and Scope.mlp not in args.cuda_graph_scope,
                rule,
                f"CUDA graph scope on moe and mlp is not supported with {detail}",
            )
    if args.delay_wgrad_compute:
        _check(
            args.overlap_moe_expert_parallel_comm,
            rule,
            "overlap_moe_expert_parallel_comm must be enabled when enabling delay_wgrad_compute",
        )
        _check(
            not args.moe_use_legacy_grouped_gemm,
            rule,
            "delay_wgrad_compute is not supported with legacy groupedgemm implementation",
        )
    if args.ep_overlap_early_attn_memory_release:
        _check(
            args.overlap_moe_expert_parallel_comm,
            rule,
            "overlap_moe_expert_parallel_comm must be enabled for "
            "ep_overlap_early_attn_memory_release",
        )


# --------------------------------------------------------------------------------------------
# start-up: the model and the training loop


def _moe_layer_pattern(args: argparse.Namespace) -> list[int]:
    """get_gpt_decoder_layer_specs: --moe-layer-freq as one 0/1 per layer, its length checked."""
    rule = "get_gpt_decoder_layer_specs"
    freq = args.moe_layer_freq
    if isinstance(freq, int):
        _check(freq != 0, rule, "--moe-layer-freq 0 (a modulo by zero)")
        return [1 if i % freq == 0 else 0 for i in range(args.num_layers)]
    _check(isinstance(freq, list), rule, f"Invalid moe_layer_freq: {type(freq)}, {freq}")
    _check(
        len(freq) == args.num_layers,
        rule,
        f"Invalid length of moe_layer_pattern: {len(freq)}, expected {args.num_layers}, "
        f"current moe layer pattern: {freq}",
    )
    _check(all(x in (0, 1) for x in freq), rule, f"Invalid layer pattern: {freq}")
    return freq


def _layers_per_stage(args: argparse.Namespace) -> None:
    """get_num_layers_to_build (without a layout string, whose stages megatron-core's layout
    class has already checked): each pipeline rank's layers split over its virtual stages, and
    the embedding/loss stage that counts as a layer keeps >= 0 decoder layers."""
    rule = "get_num_layers_to_build"
    pp = args.pipeline_model_parallel_size
    vpp = args.virtual_pipeline_model_parallel_size
    first, last = args.decoder_first_pipeline_num_layers, args.decoder_last_pipeline_num_layers
    embedding = args.account_for_embedding_in_pipeline_split
    loss = args.account_for_loss_in_pipeline_split
    if first is not None or last is not None:
        _check(not (embedding or loss), rule, "no standalone embedding/loss stage with uneven PP")
        layers = args.num_layers - (first or 0) - (last or 0)
        stages = pp - (first is not None) - (last is not None)
        if stages > 0:
            _check(
                layers % stages == 0,
                rule,
                "With uneven pipelineing the left over layers must be divisible by left over "
                "stages",
            )
        middle = layers // stages if stages > 0 else 0
        per_rank = [middle] * pp
        if first is not None:
            per_rank[0] = first
        if last is not None:
            per_rank[-1] = last
    else:
        layers = args.num_layers + embedding + loss
        _check(
            layers % pp == 0,
            rule,
            f"num_layers should be divisible by pipeline_model_parallel_size ({layers} layers, "
            f"PP {pp})",
        )
        per_rank = [layers // pp] * pp
    chunks = vpp if vpp is not None and pp > 1 else 1
    for rank, count in enumerate(per_rank):
        _check(
            count % chunks == 0,
            rule,
            f"num_layers_per_pipeline_rank {count} should be divisible by vp_size {chunks}",
        )
        per_chunk = count // chunks
        if embedding and rank == 0:
            _check(per_chunk - 1 >= 0, rule, "Not enough layers in the first virtual stage")
        if loss and rank == pp - 1:
            _check(per_chunk - 1 >= 0, rule, "Not enough layers in the last virtual stage")


def _model_checks(args: argparse.Namespace) -> None:
    """Building and first running the GPT model: the MoE layer pattern, the layers of each
    pipeline stage, the MoE layer's dispatcher and experts, and sequence parallelism."""
    # gpt_builder: the inference-optimized layers have no MoE or MTP spec
    for used, what in ((args.num_experts, "MoE"), (args.mtp_num_layers is not None, "MTP")):
        _check(
            not (used and args.transformer_impl == "inference_optimized"),
            "gpt_builder",
            f"--transformer-impl inference_optimized does not build {what} layers",
        )
    # get_gpt_layer_*_spec: the MLA layer takes no L2-normalised QK (the TE spec and the MoE
    # block spec pass --qk-l2-norm on; the dense local spec does not)
    if args.multi_latent_attention and args.qk_l2_norm:
        _check(
            args.transformer_impl != "transformer_engine" and not args.num_experts,
            "get_gpt_layer_with_transformer_engine_spec",
            "qk_l2_norm is not supported with MLA.",
        )
    pattern = _moe_layer_pattern(args) if args.num_experts else []
    if args.pipeline_model_parallel_layout is None:
        _layers_per_stage(args)
    if not any(pattern):
        return
    # MoELayer.__init__ / the token dispatchers
    rule = "MoELayer"
    _check(
        args.num_experts % args.expert_model_parallel_size == 0,
        rule,
        "num_moe_experts must be divisible by the expert parallel size",
    )
    if args.moe_token_dispatcher_type == "flex":
        _check(
            args.expert_tensor_parallel_size * args.expert_model_parallel_size > 1,
            "MoEFlexTokenDispatcher",
            "Flex token dispatcher requires TPxEP > 1",
        )
        _check(
            not (
                args.moe_shared_expert_overlap
                and args.moe_shared_expert_intermediate_size is not None
            ),
            "MoEFlexTokenDispatcher",
            "Shared expert overlap is not supported in Flex Token Dispatcher.",
        )
    # MoELayer.forward: training with TP > 1 needs sequence parallelism
    _check(
        args.tensor_model_parallel_size == 1 or args.sequence_parallel,
        "MoELayer.forward",
        "During training, performance may degrade if MoE and tensor parallelism are enabled "
        "without also enabling sequence parallelism.",
    )
    if args.moe_grouped_gemm:
        activation, gated = _activation(args)
        legacy = args.moe_use_legacy_grouped_gemm or args.transformer_impl == "local"
        if legacy:  # GroupedMLP.__init__ / forward (the grouped_gemm package check left out)
            rule = "GroupedMLP"
            _check(not args.add_bias_linear, rule, "bias not supported in Grouped GEMM yet")
            _check(args.moe_latent_size is None, rule, "MoE latent projection not supported")
            _check(
                not gated or activation in ("silu", "gelu"),
                rule,
                "Activation function must be silu or gelu when using GroupedMLP.",
            )
            _check(args.bf16, rule, "Currently GroupedMLP for MoE only supports bf16.")
        else:  # TEGroupedMLP.__init__
            _check(
                not (args.add_bias_linear and args.bias_dropout_fusion),
                "TEGroupedMLP",
                "bias_dropout_fusion is not supported in TEGroupedMLP when add_bias_linear=True",
            )
    if args.moe_apply_probs_on_input:
        _check(
            args.moe_router_topk == 1,
            "experts",
            "`moe_apply_probs_on_input` only works with `moe_router_topk`=1.",
        )


def _training_checks(args: argparse.Namespace) -> None:
    """pretrain after the model: the DDP buckets, the learning-rate schedule's length and the
    dataset sizes."""
    if not args.use_torch_fsdp2 and args.ddp_num_buckets is not None:  # get_model
        _check(
            args.ddp_bucket_size is None,
            "get_model",
            "Cannot specify both --ddp-num-buckets and --ddp-bucket-size",
        )
        _check(args.ddp_num_buckets > 0, "get_model", "--ddp-num-buckets must be greater than 0")
    # get_optimizer_param_scheduler
    _check(
        args.train_iters or args.train_samples,
        "get_optimizer_param_scheduler",
        "either train-iters or train-samples should be provided.",
    )
    # get_train_valid_test_num_samples (datasets are built unless this is an RL step)
    if not args.perform_rl_step and not args.full_validation and not args.skip_train:
        rule = "get_train_valid_test_num_samples"
        _check(args.train_iters is not None, rule, "sample-based training needs --train-iters")
        _check(
            args.eval_interval is not None and args.eval_interval > 0,
            rule,
            "--eval-interval is needed (train_iters // eval_interval)",
        )


# --------------------------------------------------------------------------------------------
# cross-check: megatron-core's own TransformerConfig


def megatron_core_config(args: argparse.Namespace) -> Any:
    """megatron-core's ``TransformerConfig`` (``MLATransformerConfig`` with MLA) for validated
    ``args``, built as ``core_transformer_config_from_args`` builds it, so that tests can check
    this port of ``__post_init__`` against the real one.  RoPE fusion is turned off: it needs
    Transformer Engine's kernels, absent on a CPU machine."""
    import dataclasses

    import torch
    import torch.nn.functional as F
    from megatron.core.activations import squared_relu
    from megatron.core.fusions.fused_bias_geglu import quick_gelu
    from megatron.core.transformer.transformer_config import (
        MLATransformerConfig,
        TransformerConfig,
    )

    config_class = MLATransformerConfig if args.multi_latent_attention else TransformerConfig
    kwargs = {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(config_class)
        if hasattr(args, f.name)
    }
    dtypes = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
    kwargs.update(
        persist_layer_norm=not args.no_persist_layer_norm,
        deallocate_pipeline_outputs=True,
        pipeline_dtype=dtypes[args.params_dtype],
        params_dtype=dtypes[args.params_dtype],
        batch_p2p_comm=not args.overlap_p2p_comm,
        num_moe_experts=args.num_experts,
        rotary_interleaved=args.rotary_interleaved,
        num_layers_in_first_pipeline_stage=args.decoder_first_pipeline_num_layers,
        num_layers_in_last_pipeline_stage=args.decoder_last_pipeline_num_layers,
        fp8_param=args.fp8_param_gather,
        num_query_groups=args.num_query_groups if args.group_query_attention else None,
        config_logger_dir=args.config_logger_dir,
        inference_sampling_seed=args.seed,
        moe_latent_size=args.moe_latent_size,
        apply_rope_fusion=False,
    )
    if args.swiglu:
        kwargs.update(
            activation_func=F.silu,
            gated_linear_unit=True,
            bias_activation_fusion=args.bias_swiglu_fusion,
        )
    else:
        kwargs["bias_activation_fusion"] = args.bias_gelu_fusion
    if args.squared_relu:
        kwargs["activation_func"] = squared_relu
    elif args.quick_geglu:
        kwargs.update(gated_linear_unit=True, activation_func=quick_gelu)
    if args.rope_type is None:
        kwargs.pop("rope_type", None)
    if len(args.cp_comm_type) == 1:
        kwargs["cp_comm_type"] = args.cp_comm_type[0]
    with warnings.catch_warnings():  # its advice (deprecations, performance) is not a refusal
        warnings.simplefilter("ignore")
        return config_class(**kwargs)
