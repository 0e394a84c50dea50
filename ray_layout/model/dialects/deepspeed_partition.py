"""How DeepSpeed's pipeline engine splits a Megatron-DeepSpeed model over its stages: there is no
layout flag, ``PipelineModule._partition_layers`` decides (``deepspeed/runtime/pipe/module.py``).

Megatron-DeepSpeed's ``GPTModelPipe`` (``megatron/model/gpt_model.py``) lists its layers as
``_to_float16``, the embedding, one ``ParallelTransformerLayerPipe`` per decoder layer, the MoE
loss hook (MoE models), the final norm, the output layer (the tied embedding) and
``float16_to_fp32``, and asks for ``partition_method='type:transformer'``: weight 1 for each layer
whose class name matches ``transformer``, 0 for the rest, split by ``partition_balanced``
(``deepspeed/runtime/utils.py``).  Rewritten here from those sources' rules, not copied.
"""

from __future__ import annotations

from collections.abc import Sequence

PARTITION_METHOD = "type:transformer"  # GPTModelPipe's, in place of PipelineModule's 'parameters'


def partition_uniform(items: int, parts: int) -> list[int]:
    """DeepSpeed's uniform split: the boundaries of ``parts`` runs of ``items``, the first
    ``items % parts`` runs one longer; with no more items than parts, one item a run."""
    if items <= parts:
        return [min(p, items) for p in range(parts + 1)]
    size, extra = divmod(items, parts)
    return [p * size + min(p, extra) for p in range(parts + 1)]


def partition_balanced(weights: Sequence[float], parts: int) -> list[int]:
    """DeepSpeed's linear partition: the boundaries that make the heaviest and lightest run
    closest (least max - min), by dynamic programming over (items, runs); of equal costs the
    last split point found wins, as DeepSpeed's ``>=`` keeps it."""
    n = len(weights)
    if n <= parts:
        return partition_uniform(n, parts)
    inf = float("inf")
    prefix = [0.0]
    for w in weights:
        prefix.append(prefix[-1] + w)
    high = [[inf] * (parts + 1) for _ in range(n + 1)]
    low = [[inf] * (parts + 1) for _ in range(n + 1)]
    cost = [[inf] * (parts + 1) for _ in range(n + 1)]
    cut = [[0] * (parts + 1) for _ in range(n + 1)]
    high[0][0] = cost[0][0] = 0.0
    for i in range(1, n + 1):
        for j in range(1, min(i, parts) + 1):
            for k in range(i):
                run = prefix[i] - prefix[k]
                top, bottom = max(high[k][j - 1], run), min(low[k][j - 1], run)
                if cost[i][j] >= top - bottom:
                    cost[i][j], high[i][j], low[i][j], cut[i][j] = top - bottom, top, bottom, k
    bounds = [n]
    for j in range(parts, 0, -1):
        bounds.append(cut[bounds[-1]][j])
    return bounds[::-1]


def transformer_layers_per_stage(num_layers: int, stages: int, moe: bool) -> list[int]:
    """The decoder layers DeepSpeed gives each pipeline stage of a GPTModelPipe."""
    # _to_float16, embedding, layers, [MoE loss hook], final norm, output layer, float16_to_fp32
    weights = [0, 0, *([1] * num_layers), *([0] * moe), 0, 0, 0]
    bounds = partition_balanced(weights, stages)
    return [int(sum(weights[bounds[s] : bounds[s + 1]])) for s in range(stages)]


def deepspeed_layout(counts: Sequence[int]) -> str:
    """The stages as a Megatron layout string (embedding first, loss last), for this tool's
    sizes of each stage: ``Et*12|t*12L``."""
    stages = [f"t*{n}" if n > 1 else "t" * n for n in counts]
    stages[0] = "E" + stages[0]
    stages[-1] += "L"
    return "|".join(stages)
