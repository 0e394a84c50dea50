"""The oracle of Megatron-LM's ``parse_args`` + ``validate_args`` (tests/megatron_arguments_oracle)
passes the command lines Megatron accepts and refuses, naming the rule, those it refuses; its port
of ``TransformerConfig.__post_init__`` agrees with megatron-core's own class; and every rank
command line ``launchers.megatron`` prints for the test recipes is one Megatron accepts."""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import random
import re
import signal
from collections.abc import Mapping
from dataclasses import replace

import pytest

from launchers.megatron import (
    DEFAULT_MICROBATCHES_PER_STAGE,
    MegatronRunSettings,
    megatron_arguments,
)
from ray_layout.errors import ConfigError, LayoutError
from ray_layout.model.baselines import count_based, megatron_default
from ray_layout.model.hf_config import load_hf_config
from ray_layout.model.layout import Layout
from ray_layout.model.spec import Recipe, build_parallel, load_recipe_file, with_parallel
from tests.helpers.megatron_arguments_oracle import (
    FLAG_TABLE,
    _parser,
    megatron_core_config,
    parse_megatron_args,
    validate_megatron_args,
)
from tests.helpers.megatron_oracle import MEGATRON_CPU_WARNINGS
from tests.helpers.paths import HF_CONFIGS, ROOT

pytestmark = [pytest.mark.megatron, *(pytest.mark.filterwarnings(w) for w in MEGATRON_CPU_WARNINGS)]

HF = HF_CONFIGS

# A small MoE GPT that Megatron accepts on 8 ranks: TP 1, PP 2, EP 2, hence DP 4.
WORLD = 8
BASE: dict[str, object] = {
    "--num-layers": 8,
    "--hidden-size": 256,
    "--num-attention-heads": 8,
    "--seq-length": 512,
    "--max-position-embeddings": 512,
    "--swiglu": True,
    "--disable-bias-linear": True,
    "--normalization": "RMSNorm",
    "--position-embedding-type": "rope",
    "--num-experts": 8,
    "--moe-router-topk": 2,
    "--moe-token-dispatcher-type": "alltoall",
    "--pipeline-model-parallel-size": 2,
    "--expert-model-parallel-size": 2,
    "--micro-batch-size": 1,
    "--global-batch-size": 8,
    "--train-iters": 10,
    "--eval-iters": 0,
    "--eval-interval": 1000,
    "--mock-data": True,
    "--tokenizer-type": "NullTokenizer",
    "--vocab-size": 1000,
    "--lr": 1e-4,
    "--bf16": True,
}


def argv(changes: Mapping[str, object] = {}) -> list[str]:
    """BASE with ``changes``: a value replaces the flag's, True adds a switch, None drops it,
    a tuple gives several words."""
    words: list[str] = []
    for flag, value in {**BASE, **changes}.items():
        if value is True:
            words.append(flag)
        elif isinstance(value, tuple):
            words += [flag, *map(str, value)]
        elif value is not None and value is not False:
            words += [flag, str(value)]
    return words


def validated(changes: Mapping[str, object] = {}, world: int = WORLD) -> argparse.Namespace:
    return validate_megatron_args(parse_megatron_args(argv(changes)), world)


# --------------------------------------------------------------------------------------------
# parse_args


def test_every_flag_of_the_table_is_an_option_with_its_dest_and_arity():
    options = _parser()._option_string_actions
    for entry in json.loads(FLAG_TABLE.read_text()):
        for flag in entry["flags"]:
            action = options[flag]
            assert action.dest == entry["dest"], flag
            if entry["nargs"] == 0:
                assert action.nargs == 0, flag
            else:
                assert action.nargs == entry["nargs"], flag
                assert action.choices is None or len(action.choices) == len(entry["choices"])
    args = parse_megatron_args([])
    assert args.num_layers is None and args.tensor_model_parallel_size == 1
    assert args.cp_comm_type == ["p2p"] and args.profile_ranks == [0]  # list defaults, not repr
    assert args.moe_layer_freq == 1 and args.overlap_p2p_comm is True
    assert args.exit_signal == signal.SIGTERM and args.attention_backend.name == "auto"
    assert args.disable_chunked_prefill is True  # the first of two options with that dest wins


@pytest.mark.parametrize(
    ("words", "message"),
    [
        (["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
        (["--num-layer", "4"], "unrecognized arguments: --num-layer 4"),  # no abbreviations
        (["--num-layers", "four"], "argument --num-layers: invalid int value: 'four'"),
        (["--lr", "fast"], "argument --lr: invalid float value: 'fast'"),
        (["--num-layers"], "argument --num-layers: expected one argument"),
        (["--bf16=yes"], "argument --bf16: ignored explicit argument 'yes'"),
        (["--normalization", "BatchNorm"], "argument --normalization: invalid choice: 'BatchNorm'"),
        (["--moe-layer-freq", "every"], "invalid moe_freq_type value: 'every'"),
        (["--moe-layer-freq", "[1]*2+x"], "invalid moe_freq_type value: '[1]*2+x'"),
        (["--moe-layer-freq", "__import__('os')"], "invalid moe_freq_type value"),  # no eval
        (["--rampup-batch-size", "8", "8"], "expected 3 arguments"),
        (["--recompute-modules"], "expected at least one argument"),
        (["7"], "unrecognized arguments: 7"),
    ],
)
def test_parse_refuses_with_argparses_message(words, message):
    with pytest.raises(argparse.ArgumentError, match=re.escape(message)):
        parse_megatron_args(words)


def test_megatron_converters():
    from megatron.core.transformer.enums import AttnBackend, CudaGraphScope

    args = parse_megatron_args(
        ["--moe-layer-freq", "([0]*3+[1]*58)", "--attention-backend", "flash",
         "--window-size", "(128,0)", "--cuda-graph-scope", "attn", "moe_router",
         "--no-rope-freq", "4", "--exit-signal", "SIGINT"]
    )  # fmt: skip
    assert args.moe_layer_freq == [0, 0, 0] + [1] * 58
    assert args.attention_backend is AttnBackend.flash
    assert args.window_size == (128, 0)
    assert args.cuda_graph_scope == [CudaGraphScope.attn, CudaGraphScope.moe_router]
    assert args.no_rope_freq == 4 and args.exit_signal == signal.SIGINT
    assert parse_megatron_args(["--moe-layer-freq", "2"]).moe_layer_freq == 2
    assert parse_megatron_args(["--moe-layer-freq", "[1,0]*2"]).moe_layer_freq == [1, 0, 1, 0]
    with pytest.raises(KeyError):  # Megatron's enum_type_handler: argparse lets it through
        parse_megatron_args(["--attention-backend", "fastest"])


def test_switches_follow_their_actions():
    args = parse_megatron_args(
        ["--no-overlap-p2p-communication", "--no-inference-wandb-logging", "--bf16",
         "--disable-bias-linear", "--enable-chunked-prefill"]
    )  # fmt: skip
    assert args.overlap_p2p_comm is False  # store_false
    assert args.inference_wandb_logging is False  # BooleanOptionalAction
    assert args.bf16 is True and args.add_bias_linear is False
    assert args.disable_chunked_prefill is False
    assert parse_megatron_args(["--inference-wandb-logging"]).inference_wandb_logging is True


# --------------------------------------------------------------------------------------------
# validate_args: accepted command lines and what Megatron derives


def test_base_command_line_is_accepted_with_megatrons_derived_sizes():
    args = validated()
    assert args.data_parallel_size == 4 and args.expert_tensor_parallel_size == 1
    assert args.virtual_pipeline_model_parallel_size is None
    assert args.overlap_p2p_comm is False  # no interleaving: Megatron turns the overlap off
    assert args.ffn_hidden_size == int((4 * 256 * 2 / 3) / 64) * 64 and args.kv_channels == 32
    assert args.moe_ffn_hidden_size == args.ffn_hidden_size
    assert args.accumulate_allreduce_grads_in_fp32 is True  # bf16 with fp32 main grads


def test_default_global_batch_size_is_micro_batch_times_dp():
    assert validated({"--global-batch-size": None, "--micro-batch-size": 3}).global_batch_size == 12


def test_virtual_stages_from_each_flag():
    layers_per_stage = validated({"--num-layers-per-virtual-pipeline-stage": 2})
    assert layers_per_stage.virtual_pipeline_model_parallel_size == 2
    stages = validated({"--num-virtual-stages-per-pipeline-rank": 4})
    assert stages.virtual_pipeline_model_parallel_size == 4
    layout = validated({"--pipeline-model-parallel-layout": "Et*2|t*2|t*2|t*2L"})
    assert layout.virtual_pipeline_model_parallel_size == 2
    assert validated({"--pipeline-model-parallel-layout": "Et*4|t*4L"}).overlap_p2p_comm is False


def test_sequence_parallel_is_turned_off_without_tp():
    assert validated({"--sequence-parallel": True}).sequence_parallel is False


def test_layout_with_mtp_and_uneven_split_are_accepted():
    validated({"--mtp-num-layers": 1, "--pipeline-model-parallel-layout": "Et*3|t*5mL"})
    validated({"--decoder-first-pipeline-num-layers": 3, "--decoder-last-pipeline-num-layers": 5})
    validated({"--account-for-embedding-in-pipeline-split": True,
               "--account-for-loss-in-pipeline-split": True, "--num-layers": 6})  # fmt: skip


# --------------------------------------------------------------------------------------------
# validate_args and start-up: one refusal per rule family

REFUSALS = [
    ("world not divisible by TP*PP*CP", {"--tensor-model-parallel-size": 3}, WORLD,
     "validate_args: world size (8) is not divisible by total_model_size"),
    ("two virtual pipeline flags", {"--num-layers-per-virtual-pipeline-stage": 2,
     "--num-virtual-stages-per-pipeline-rank": 2}, WORLD, "No more than one of"),
    ("layout and virtual stages", {"--num-virtual-stages-per-pipeline-rank": 2,
     "--pipeline-model-parallel-layout": "Et*4|t*4L"}, WORLD, "No more than one of"),
    ("layers not divisible by PP", {"--num-layers": 7}, WORLD,
     "Number of layers should be divisible by the pipeline-model-parallel size"),
    ("layers per virtual stage", {"--num-layers-per-virtual-pipeline-stage": 3}, WORLD,
     "number of layers per pipeline stage must be divisible number of layers per virtual"),
    ("layers per virtual stage and uneven split", {"--num-layers-per-virtual-pipeline-stage": 2,
     "--decoder-first-pipeline-num-layers": 2}, WORLD,
     "please use --num-virtual-stages-per-pipeline-rank"),
    ("VPP with PP 2 without p2p overlap", {"--num-virtual-stages-per-pipeline-rank": 2,
     "--no-overlap-p2p-communication": True}, WORLD,
     "pipeline-model-parallel size should be greater than 2"),
    ("VPP with PP 1", {"--pipeline-model-parallel-size": 1,
     "--num-virtual-stages-per-pipeline-rank": 2}, WORLD,
     "pipeline-model-parallel size should be greater than 1"),
    ("layout stages not divisible by PP", {"--pipeline-model-parallel-layout": "Et*4|t*2|t*2L"},
     WORLD, "The length of pipeline_model_parallel_layout must be divisible"),
    ("layout with an unknown layer", {"--pipeline-model-parallel-layout": "Et*4|t*3xL"}, WORLD,
     "Invalid layer character: x"),
    ("layout for the wrong number of layers", {"--pipeline-model-parallel-layout": "Et*4|t*3L"},
     WORLD, "PipelineParallelLayerLayout.validate_layer_layout: Number of decoder layers 7"),
    ("layout without the MTP layer", {"--mtp-num-layers": 1,
     "--pipeline-model-parallel-layout": "Et*4|t*4L"}, WORLD,
     "Number of mtp layers in layout must match mtp_num_layers"),
    ("layout with MTP before a decoder layer", {"--mtp-num-layers": 1,
     "--pipeline-model-parallel-layout": "Et*4|mt*4L"}, WORLD,
     "decoder layers must be placed before MTP layers"),
    ("layout and first-stage layers", {"--pipeline-model-parallel-layout": "Et*4|t*4L",
     "--decoder-first-pipeline-num-layers": 4}, WORLD,
     "pipeline_model_parallel_layout cannot be set with other pipeline layout arguments"),
    ("layout and account-for-loss", {"--pipeline-model-parallel-layout": "Et*4|t*4L",
     "--account-for-loss-in-pipeline-split": True, "--num-layers": 7}, WORLD,
     "pipeline_model_parallel_layout cannot be set with other pipeline layout arguments"),
    ("uneven split and account-for-embedding", {"--decoder-first-pipeline-num-layers": 3,
     "--account-for-embedding-in-pipeline-split": True}, WORLD,
     "cannot be set at the same time with account_for_embedding_in_pipeline_split"),
    ("uneven split leaves middle layers", {"--decoder-first-pipeline-num-layers": 3,
     "--decoder-last-pipeline-num-layers": 3}, WORLD, "Mismatch: 2 middle layers remaining"),
    ("uneven first stage and VPP", {"--pipeline-model-parallel-size": 4,
     "--expert-model-parallel-size": 1, "--num-virtual-stages-per-pipeline-rank": 2,
     "--decoder-first-pipeline-num-layers": 3, "--num-layers": 9}, WORLD,
     "number of layers at first stage: 3 must be divisible by virtual pipeline parallel degree"),
    ("virtual stages that do not split a rank", {"--num-virtual-stages-per-pipeline-rank": 3},
     WORLD, "get_num_layers_to_build: num_layers_per_pipeline_rank 4 should be divisible by vp"),
    ("global batch not divisible by micro batch x DP", {"--global-batch-size": 6}, WORLD,
     "ConstantNumMicroBatchesCalculator: global batch size (6) is not divisible by micro batch"),
    ("experts not divisible by EP", {"--num-experts": 6, "--expert-model-parallel-size": 4},
     WORLD, "Number of experts should be a multiple of expert model parallel_size"),
    ("EP without experts", {"--num-experts": None}, WORLD,
     "num_experts must be non None to use expert model parallelism"),
    ("world not divisible by ETP*EP*PP", {"--expert-model-parallel-size": 8}, WORLD,
     "initialize_model_parallel: world_size (8) is not divisible by expert_tensor_model"),
    ("MoE with TP and no sequence parallelism", {"--tensor-model-parallel-size": 2}, WORLD,
     "MoELayer.forward: During training, performance may degrade if MoE and tensor parallel"),
    ("MoE layer pattern of the wrong length", {"--moe-layer-freq": "([0]*2+[1]*5)"}, WORLD,
     "get_gpt_decoder_layer_specs: Invalid length of moe_layer_pattern: 7, expected 8"),
    ("MoE FFN size without experts", {"--num-experts": None, "--expert-model-parallel-size": 1,
     "--moe-ffn-hidden-size": 128}, WORLD, "moe_ffn_hidden_size must be None when num_experts"),
    ("top-1 softmax routing without pre-softmax", {"--moe-router-topk": 1}, WORLD,
     "Please use --moe-router-pre-softmax when topk is 1."),
    ("expert bias with softmax scores", {"--moe-router-enable-expert-bias": True}, WORLD,
     "Expert bias for aux-loss-free routing only supports sigmoid score function."),
    ("flex dispatcher without TP x EP", {"--expert-model-parallel-size": 1,
     "--moe-token-dispatcher-type": "flex"}, WORLD, "Flex token dispatcher requires TPxEP > 1"),
    ("shared expert overlap with allgather", {"--moe-token-dispatcher-type": "allgather",
     "--moe-shared-expert-intermediate-size": 256, "--moe-shared-expert-overlap": True}, WORLD,
     "moe_shared_expert_overlap only works with alltoall token dispatcher."),
    ("legacy grouped GEMM with biases", {"--moe-grouped-gemm": True,
     "--moe-use-legacy-grouped-gemm": True, "--disable-bias-linear": False}, WORLD,
     "GroupedMLP: bias not supported in Grouped GEMM yet"),
    ("MoE biases with expert TP", {"--disable-bias-linear": False, "--tensor-model-parallel-size":
     2, "--sequence-parallel": True, "--expert-model-parallel-size": 1}, WORLD,
     "Bias in Moe is only supported when ETP==1"),
    ("MTP with learned positions", {"--mtp-num-layers": 1,
     "--position-embedding-type": "learned_absolute"}, WORLD,
     "Multi-Token Prediction (MTP) is not supported with learned_absolute"),
    ("MLA with grouped-query attention", {"--multi-latent-attention": True,
     "--group-query-attention": True, "--num-query-groups": 2}, WORLD,
     "Group query attention is mutually exclusive with multi latent attention."),
    ("sequence longer than the positions", {"--max-position-embeddings": 256}, WORLD,
     "max_position_embeddings (256) must be greater than or equal to seq_length (512)."),
    ("sequence not split over 2 x CP", {"--context-parallel-size": 2, "--seq-length": 510,
     "--max-position-embeddings": 512}, WORLD, "seq-length should be a multiple of 2 * context"),
    ("heads not split over TP", {"--tensor-model-parallel-size": 4, "--sequence-parallel": True,
     "--pipeline-model-parallel-size": 1, "--num-attention-heads": 6, "--hidden-size": 384},
     WORLD, "num_attention_heads (6) must be a multiple of tensor_model_parallel_size (4)."),
    ("query groups neither divide nor multiply TP", {"--tensor-model-parallel-size": 2,
     "--sequence-parallel": True, "--expert-model-parallel-size": 1, "--group-query-attention":
     True, "--num-query-groups": 3, "--num-attention-heads": 6, "--hidden-size": 384}, WORLD,
     "num_query_groups (3) must be a multiple or divisor of tensor_model_parallel_size (2)."),
    ("fp16 and bf16", {"--fp16": True}, WORLD, "--fp16 and --bf16 cannot both be set"),
    ("fp8 param gather without fp8", {"--fp8-param-gather": True,
     "--use-distributed-optimizer": True}, WORLD, "fp8_param must be used with fp8 mode."),
    ("overlap param gather without distributed optimizer", {"--overlap-param-gather": True,
     "--overlap-grad-reduce": True}, WORLD, "--overlap-param-gather only supported with dist"),
    ("overlap param gather without grad overlap", {"--overlap-param-gather": True,
     "--use-distributed-optimizer": True}, WORLD, "Must use --overlap-param-gather with --over"),
    ("distributed optimizer, no Gloo, torch checkpoints", {"--use-distributed-optimizer": True,
     "--disable-gloo-process-groups": True, "--ckpt-format": "torch"}, WORLD,
     "the distributed optimizer without Gloo process groups needs distributed checkpointing"),
    ("full recompute without a method", {"--recompute-granularity": "full"}, WORLD,
     'recompute_method must be "block" or "uniform"'),
    ("full recompute without a layer count", {"--recompute-granularity": "full",
     "--recompute-method": "uniform"}, WORLD, "recompute_num_layers must be between 1 and"),
    ("selective recompute with a method", {"--recompute-activations": True,
     "--recompute-method": "block"}, WORLD,
     "recompute method is not yet supported for selective recomputing granularity"),
    ("distributed saved activations without TP", {"--distribute-saved-activations": True}, WORLD,
     "can distribute recomputed activations only across tensor model parallel groups"),
    ("CPU offloading with PP", {"--cpu-offloading-num-layers": 2}, WORLD,
     "no support for Pipeline parallelism with CPU offloading"),
    ("iteration- and sample-based training", {"--train-samples": 100}, WORLD,
     "expected iteration-based training"),
    ("neither iterations nor samples", {"--train-iters": None}, WORLD,
     "get_optimizer_param_scheduler: either train-iters or train-samples should be provided."),
    ("no evaluation interval", {"--eval-interval": None}, WORLD,
     "get_train_valid_test_num_samples: --eval-interval is needed"),
    ("two data sources", {"--data-path": "/data/corpus"}, WORLD,
     "A single data source must be provided in training mode, else None"),
    ("GPT2 tokenizer without its files", {"--tokenizer-type": None}, WORLD,
     "build_tokenizer: GPT2BPETokenizer needs --vocab-file"),
    ("null tokenizer without a vocabulary size", {"--vocab-size": None}, WORLD,
     "build_tokenizer: NullTokenizer needs --vocab-size"),
    ("seed 0", {"--seed": 0}, WORLD, "_set_random_seed: Seed (0) should be a positive integer."),
    ("min lr above lr", {"--min-lr": 1e-3}, WORLD, "--min-lr 0.001 > --lr 0.0001"),
    ("save without an interval", {"--save": "/ckpt"}, WORLD, "--save needs --save-interval"),
    ("deprecated batch size", {"--batch-size": 4}, WORLD, "--batch-size argument is no longer"),
    ("linear weight decay without its ends", {"--weight-decay-incr-style": "linear"}, WORLD,
     "--start-weight-decay is required"),
    ("muon with the distributed optimizer", {"--optimizer": "muon",
     "--use-distributed-optimizer": True}, WORLD, "Muon optimizer does not support distributed"),
    ("TP comm overlap without sequence parallelism", {"--tp-comm-overlap": True}, WORLD,
     "Tensor parallel communication/GEMM overlap can happen only when sequence parallelism"),
    ("the deprecated full CUDA graph scope with another", {"--cuda-graph-scope": ("full", "attn")},
     WORLD, "full scope cannot be used with others."),
    ("EP overlap without VPP", {"--overlap-moe-expert-parallel-comm": True}, WORLD,
     "overlap_moe_expert_parallel_comm needs virtual pipeline stages when PP > 1"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("changes", "world", "message"),
    [pytest.param(c, w, m, id=name) for name, c, w, m in REFUSALS],
)
def test_refused_naming_the_rule(changes, world, message):
    args = parse_megatron_args(argv(changes))
    with pytest.raises(AssertionError, match=re.escape(message)):
        validate_megatron_args(args, world)


def test_refusal_table_covers_each_case_once():
    names = [name for name, *_ in REFUSALS]
    assert len(names) == len(set(names))


# --------------------------------------------------------------------------------------------
# the port of TransformerConfig.__post_init__ against megatron-core's own class

# Refusals that TransformerConfig's __post_init__ makes: megatron-core's message for each.
CONFIG_RULES = {
    "heads not split over TP": "num_attention_heads (6) must be a multiple",
    "query groups neither divide nor multiply TP": "num_query_groups (3) must be a multiple or",
    "MoE FFN size without experts": "moe_ffn_hidden_size must be None when num_experts",
    "top-1 softmax routing without pre-softmax": "Please use --moe-router-pre-softmax",
    "expert bias with softmax scores": "Expert bias for aux-loss-free routing only supports",
    "shared expert overlap with allgather": "moe_shared_expert_overlap only works with alltoall",
    "MoE biases with expert TP": "Bias in Moe is only supported when ETP==1",
    "full recompute without a method": 'recompute_method must be "block" or "uniform"',
    "full recompute without a layer count": "recompute_num_layers must be between 1 and",
    "CPU offloading with PP": "no support for Pipeline parallelism with CPU offloading",
    "fp8 param gather without fp8": "fp8_param must be used together with fp8 mode.",
    "layout for the wrong number of layers": "Number of decoder layers 7",
    "layout without the MTP layer": "Number of mtp layers in layout must match mtp_num_layers",
    "layout with MTP before a decoder layer": "decoder layers must be placed before MTP layers",
    "layout and first-stage layers": "pipeline_model_parallel_layout cannot be set with other",
    "uneven split and account-for-embedding": "num_layers_in_first_pipeline_stage and num_",
    "uneven split leaves middle layers": "Mismatch: 2 middle layers remaining",
    "uneven first stage and VPP": "number of layers at first stage: 3",
    "EP overlap without VPP": "virtual_pipeline_model_parallel_size must be specified",
}


def test_the_config_rules_are_in_the_refusal_table():
    assert set(CONFIG_RULES) <= {name for name, *_ in REFUSALS}


@pytest.mark.parametrize(
    ("changes", "world", "message"),
    [pytest.param(c, w, CONFIG_RULES[n], id=n) for n, c, w, _ in REFUSALS if n in CONFIG_RULES],
)
def test_megatron_cores_transformer_config_refuses_them_too(changes, world, message):
    args = validate_megatron_args(parse_megatron_args(argv(changes)), world, startup_checks=False)
    with pytest.raises((ValueError, AssertionError), match=re.escape(message)):
        megatron_core_config(args)


def test_megatron_cores_transformer_config_takes_the_accepted_ones():
    for changes in (
        {},
        {"--mtp-num-layers": 1, "--pipeline-model-parallel-layout": "Et*3|t*5mL"},
        {"--decoder-first-pipeline-num-layers": 3, "--decoder-last-pipeline-num-layers": 5},
        {"--num-virtual-stages-per-pipeline-rank": 2},
        {"--recompute-granularity": "full", "--recompute-method": "uniform",
         "--recompute-num-layers": 1},
        {"--multi-latent-attention": True, "--q-lora-rank": 64, "--kv-lora-rank": 32},
    ):  # fmt: skip
        args = validated(changes)
        config = megatron_core_config(validate_megatron_args(
            parse_megatron_args(argv(changes)), WORLD, startup_checks=False))  # fmt: skip
        assert config.num_layers == args.num_layers


# Variations of BASE for the sweep below: the first value of each is BASE's own.
SWEEP: dict[str, list[object]] = {
    "--tensor-model-parallel-size": [None, 2, 4],
    "--pipeline-model-parallel-size": [None, 1, 4],
    "--sequence-parallel": [None, True],
    "--num-attention-heads": [None, 4, 6],
    "--group-query-attention": [None, True],
    "--num-query-groups": [None, 1, 2, 3],
    "--num-experts": [None, 4, 8],
    "--expert-model-parallel-size": [None, 1, 4],
    "--expert-tensor-parallel-size": [None, 1, 2],
    "--moe-router-topk": [None, 1],
    "--moe-router-pre-softmax": [None, True],
    "--moe-router-score-function": [None, "sigmoid"],
    "--moe-router-enable-expert-bias": [None, True],
    "--moe-router-load-balancing-type": [None, "sinkhorn"],
    "--moe-token-dispatcher-type": [None, "allgather", "flex"],
    "--moe-shared-expert-intermediate-size": [None, 128],
    "--moe-shared-expert-overlap": [None, True],
    "--moe-expert-capacity-factor": [None, 1.0],
    "--moe-pad-expert-input-to-capacity": [None, True],
    "--moe-grouped-gemm": [None, True],
    "--disable-bias-linear": [None, False],
    "--swiglu": [None, False],
    "--squared-relu": [None, True],
    "--use-te-activation-func": [None, True],
    "--multi-latent-attention": [None, True],
    "--position-embedding-type": [None, "learned_absolute"],
    "--recompute-granularity": [None, "full", "selective"],
    "--recompute-method": [None, "uniform"],
    "--recompute-num-layers": [None, 1],
    "--recompute-modules": [None, ("moe_act",), ("core_attn", "mlp")],
    "--cpu-offloading-num-layers": [None, 2],
    "--fp8-param-gather": [None, True],
    "--overlap-p2p-communication-warmup-flush": [None, True],
    "--pipeline-model-parallel-layout": [
        None, "Et*4|t*4L", "Et*3|t*5mL", "Et*2|t*2|t*2|t*2L", "Et*4|t*3L",
    ],
    "--mtp-num-layers": [None, 1],
    "--num-virtual-stages-per-pipeline-rank": [None, 2],
    "--decoder-first-pipeline-num-layers": [None, 3, 4],
    "--decoder-last-pipeline-num-layers": [None, 5],
    "--account-for-loss-in-pipeline-split": [None, True],
}  # fmt: skip
# Rules the oracle checks before the model's config (a refusal there says nothing of it).
_BEFORE_CONFIG = (
    "validate_args",
    "initialize_megatron",
    "ConstantNumMicroBatchesCalculator",
    "RampupBatchsizeNumMicroBatchesCalculator",
    "init_num_microbatches_calculator",
    "build_tokenizer",
    "initialize_model_parallel",
    "_set_random_seed",
)
_CONFIG = (
    "ModelParallelConfig.",
    "TransformerConfig.",
    "MLATransformerConfig.",
    "PipelineParallelLayerLayout",
    "core_transformer_config_from_args",
)


def test_the_config_port_agrees_with_megatron_core_on_a_sweep():
    """Seeded combinations of BASE's variations: where the oracle gets as far as the model's
    config, it refuses there exactly when megatron-core's TransformerConfig refuses."""
    rng = random.Random(20260516)
    compared = refused = 0
    for _ in range(600):
        changes = {flag: rng.choice(v[1:]) for flag, v in SWEEP.items() if rng.random() < 0.12}
        args = parse_megatron_args(argv(changes))
        try:
            before = validate_megatron_args(args, WORLD, startup_checks=False)
            validate_megatron_args(args, WORLD)
            oracle = None
        except AssertionError as exc:
            oracle = str(exc)
        if oracle is not None and oracle.startswith(_BEFORE_CONFIG):
            continue
        try:
            megatron_core_config(before)
            core = None
        except (ValueError, AssertionError) as exc:
            core = str(exc)
        oracle_config = oracle is not None and oracle.startswith(_CONFIG)
        assert oracle_config == (core is not None), (changes, oracle, core)
        compared += 1
        refused += oracle_config
    assert compared > 200 and refused > 50 and compared - refused > 50  # both, many times


# --------------------------------------------------------------------------------------------
# what the product prints

SETTINGS = MegatronRunSettings()


def _handbook() -> tuple[Recipe, Layout | None]:
    return load_recipe_file(ROOT / "configs" / "handbook_7b_a1b.yaml"), Layout.parse(
        "Et*5|t*6|t*5|mL", 4
    )


def _deepseek_v3() -> tuple[Recipe, Layout | None]:
    model = load_hf_config(HF / "DeepSeek-V3" / "config.json").model
    sizes = {"tp": 2, "pp": 8, "ep": 8, "dp": 4, "micro_batch_size": 1, "global_batch_size": 64}
    return Recipe(model, build_parallel(model, sizes)), Layout.parse("Et*7|(t*8|)*6t*6mL", 8)


def _mixtral() -> tuple[Recipe, Layout | None]:
    model = load_hf_config(HF / "Mixtral-8x7B-v0.1" / "config.json").model
    sizes = {"tp": 2, "pp": 4, "vpp": 2, "ep": 8, "dp": 4, "global_batch_size": 32}
    return Recipe(model, build_parallel(model, sizes)), None


def _qwen3_interleaved() -> tuple[Recipe, Layout | None]:
    model = load_hf_config(HF / "Qwen3-30B-A3B" / "config.json").model
    sizes = {"tp": 2, "pp": 4, "vpp": 2, "ep": 4, "dp": 2}
    recipe = Recipe(model, build_parallel(model, sizes))
    stages = ["E" + "t" * 6, *["t" * 6] * 6, "t" * 6 + "L"]
    return recipe, Layout.parse("|".join(stages), 4)


PRODUCT_CASES = [_handbook, _deepseek_v3, _mixtral, _qwen3_interleaved]


@pytest.mark.parametrize("case", PRODUCT_CASES)
def test_every_rank_command_line_of_the_product_is_accepted(case):
    """With the case's layout and with Megatron's own split (no layout string)."""
    recipe, layout = case()
    p = recipe.parallel
    for given in {layout, None}:
        try:
            arguments = megatron_arguments(recipe, given, SETTINGS).argv
        except ConfigError:  # Megatron's own split does not exist: the product prints nothing
            assert given is None
            continue
        args = validate_megatron_args(parse_megatron_args(arguments), p.world_size)
        assert args.data_parallel_size == p.dp
        # without one in the config, the run takes 4 micro-batches per pipeline stage
        default = p.micro_batch_size * p.dp * DEFAULT_MICROBATCHES_PER_STAGE * p.pp
        assert args.global_batch_size == (p.global_batch_size or default)
        assert (args.virtual_pipeline_model_parallel_size or 1) == p.vpp


def test_the_users_own_flags_in_a_product_command_line():
    recipe, layout = _handbook()
    extra = ("--recompute-granularity", "full", "--recompute-method", "uniform",
             "--recompute-num-layers", "1", "--overlap-grad-reduce",
             "--overlap-param-gather")  # fmt: skip
    arguments = megatron_arguments(replace(recipe, megatron_args=extra), layout, SETTINGS).argv
    args = validate_megatron_args(parse_megatron_args(arguments), recipe.parallel.world_size)
    assert args.recompute_method == "uniform" and args.overlap_param_gather


def test_product_interleaving_on_two_stages():
    """The user's p2p overlap is kept (Megatron's default), which lets VPP run on PP 2."""
    recipe, _ = _handbook()
    recipe = with_parallel(recipe, pp=2, vpp=2, dp=4)
    layout = Layout.parse("Et*4|t*4|t*4|t*4mL", 2)
    arguments = megatron_arguments(recipe, layout, SETTINGS).argv
    validate_megatron_args(parse_megatron_args(arguments), recipe.parallel.world_size)


def test_the_products_command_lines_over_parallel_sizes_and_layouts():
    """Every argv the product prints for a grid of sizes, with no layout, Megatron's default
    split and the count-based rule as layouts: Megatron accepts each (PP 2 with VPP too: the
    runs keep Megatron's p2p overlap)."""
    models = [_handbook()[0].model, load_hf_config(HF / "OLMoE-1B-7B-0924" / "config.json").model]
    printed = 0
    for model, tp, pp, vpp, ep, cp in itertools.product(
        models, [1, 2], [1, 2, 4], [1, 2], [1, 2], [1, 2]
    ):
        try:
            parallel = build_parallel(model, {"tp": tp, "pp": pp, "vpp": vpp, "ep": ep, "cp": cp})
        except ConfigError:
            continue
        layouts: list[Layout | None] = [None]
        for rule in (megatron_default, count_based):
            with contextlib.suppress(LayoutError):
                layouts.append(rule(model.num_layers, model.mtp_num_layers, pp, vpp))
        for layout in layouts:
            try:
                arguments = megatron_arguments(Recipe(model, parallel), layout, SETTINGS).argv
            except ConfigError:
                continue
            printed += 1
            validate_megatron_args(parse_megatron_args(arguments), parallel.world_size)
    assert printed > 100
