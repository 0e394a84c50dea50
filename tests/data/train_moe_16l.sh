#!/bin/bash
# Pretrain a 16-layer MoE (64 experts, top-8, one MTP layer) on 2 nodes x 8 GPUs.
# Usage: bash train_moe_16l.sh CHECKPOINT_PATH

export CUDA_DEVICE_MAX_CONNECTIONS=1
export NCCL_IB_TIMEOUT=19

GPUS_PER_NODE=8
NUM_NODES=${NUM_NODES:-2}
MASTER_ADDR=${MASTER_ADDR:-"localhost"}
MASTER_PORT=${MASTER_PORT:-6000}
NODE_RANK=${NODE_RANK:-0}
WORLD_SIZE=$(($GPUS_PER_NODE*$NUM_NODES))

CHECKPOINT_PATH=$1
TOKENIZER_MODEL=/data/tokenizers/qwen3
DATA_PATH=/data/corpus/fineweb_text_document

NUM_LAYERS=16
SEQ_LEN=4096

DISTRIBUTED_ARGS=(
    --nproc_per_node $GPUS_PER_NODE
    --nnodes $NUM_NODES
    --node_rank $NODE_RANK
    --master_addr $MASTER_ADDR
    --master_port $MASTER_PORT
)

MODEL_ARGS=(
    --use-mcore-models
    --transformer-impl transformer_engine
    --num-layers ${NUM_LAYERS}
    --hidden-size 2048
    --ffn-hidden-size 6144
    --num-attention-heads 32
    --group-query-attention
    --num-query-groups 4
    --kv-channels 128
    --qk-layernorm
    --seq-length $SEQ_LEN
    --max-position-embeddings $SEQ_LEN
    --position-embedding-type rope
    --rotary-base 1000000
    --normalization RMSNorm
    --norm-epsilon 1e-6
    --swiglu
    --disable-bias-linear
    --untie-embeddings-and-output-weights
    # --num-layers 24
    --vocab-size 151936
    --mtp-num-layers 1
)

MOE_ARGS=(
    --num-experts 64
    --moe-ffn-hidden-size 768
    --moe-router-topk 8
    --moe-shared-expert-intermediate-size 1536
    --moe-layer-freq "([0]*2+[1]*14)"
    --moe-router-load-balancing-type aux_loss
    --moe-aux-loss-coeff 1e-3
    --moe-grouped-gemm
    --moe-token-dispatcher-type alltoall
)

DATA_ARGS=(
    --tokenizer-type HuggingFaceTokenizer
    --tokenizer-model ${TOKENIZER_MODEL}
    --data-path $DATA_PATH
    --split 99990,8,2
)

TRAINING_ARGS=(
    --micro-batch-size 1
    --global-batch-size 256
    --lr 1e-4
    --train-iters 500000
    --lr-decay-style cosine
    --min-lr 1.0e-5
    --weight-decay 0.1
    --lr-warmup-iters 500
    --clip-grad 1.0
    --bf16
    --use-distributed-optimizer
    --overlap-grad-reduce
    --overlap-param-gather
)

MODEL_PARALLEL_ARGS=(
    --tensor-model-parallel-size 2
    --pipeline-model-parallel-size 4
    --num-virtual-stages-per-pipeline-rank 2
    --expert-model-parallel-size 4
    --expert-tensor-parallel-size 1
    --sequence-parallel
)

LOGGING_ARGS=(
    --log-interval 1 \
    --save-interval 10000 \
    --eval-interval 1000 \
    --eval-iters 10 \
    --save $CHECKPOINT_PATH \
    --load $CHECKPOINT_PATH \
    --tensorboard-dir "${CHECKPOINT_PATH}/tensorboard" \
)

mkdir -p "${CHECKPOINT_PATH}"

torchrun ${DISTRIBUTED_ARGS[@]} pretrain_gpt.py \
    ${MODEL_ARGS[@]} \
    ${MOE_ARGS[@]} \
    ${DATA_ARGS[@]} \
    ${TRAINING_ARGS[@]} \
    ${MODEL_PARALLEL_ARGS[@]} \
    ${LOGGING_ARGS[@]} 2>&1 | tee "train_${NODE_RANK}.log"
