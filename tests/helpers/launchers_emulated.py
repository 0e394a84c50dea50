"""The emulated Megatron's test inputs: the shipped hardware profiles and the handbook recipe as
the ``pretrain_gpt.py`` arguments an emulated rank gets."""

from __future__ import annotations

import shlex

from tests.helpers.paths import ROOT

PROFILES = ROOT / "cluster_configs" / "hardware"
H200 = PROFILES / "h200_emulated.yaml"
MICROBATCHES, ITERATIONS = 8, 4
# configs/handbook_7b_a1b.yaml as pretrain_gpt.py flags (NullTokenizer adds one token to the
# vocabulary), on PP=4 with DP=1 (so EP=1)
HANDBOOK = shlex.split(
    "--num-layers 16 --hidden-size 2048 --num-attention-heads 16"
    " --group-query-attention --num-query-groups 2 --kv-channels 128"
    " --swiglu --normalization RMSNorm --position-embedding-type rope"
    " --disable-bias-linear --seq-length 4096 --max-position-embeddings 4096"
    " --vocab-size 128255 --num-experts 64 --moe-router-topk 8"
    " --moe-ffn-hidden-size 1024 --moe-layer-freq 1 --mtp-num-layers 1"
    " --pipeline-model-parallel-size 4 --expert-model-parallel-size 1"
    f" --micro-batch-size 2 --global-batch-size {2 * MICROBATCHES}"
    f" --train-iters {ITERATIONS} --log-interval 1 --eval-iters 0"
    " --timing-log-level 2 --timing-log-option all --log-throughput"
    " --mock-data --tokenizer-type NullTokenizer --bf16 --use-distributed-optimizer"
)
