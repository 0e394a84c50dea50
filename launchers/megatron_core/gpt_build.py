"""megatron-core's own ``GPTModel`` for one rank, one module per virtual stage, as Megatron-LM's
``pretrain_gpt.py`` builds it, with the local (non-Transformer-Engine) layer specs.

The run's layout goes to ``TransformerConfig.pipeline_model_parallel_layout``, so which layers a
rank holds is megatron-core's decision; :func:`built_stage` reads it back from the modules, in
the layout language, for tests to hold against the layout.  Training is in fp32 on the CPU
(bf16 matmuls there are slow and prove nothing more).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from launchers.emulated.config import RunConfig
from ray_layout.errors import ConfigError
from ray_layout.model.fields import ModelSpec
from ray_layout.model.job_flags import JobFlags
from ray_layout.model.layout import MTP, Layout, build_problem
from ray_layout.model.memory_settings import MemorySettings


@dataclass(frozen=True)
class CoreSettings:
    """What the rank takes from its command line beyond :class:`RunConfig`."""

    dispatcher: str = "allgather"  # --moe-token-dispatcher-type
    init_method_std: float = 0.02


def transformer_config(run: RunConfig, settings: CoreSettings) -> Any:
    """The ``TransformerConfig`` of the run: model shape, MoE, MTP, parallel sizes, layout and
    the job's recompute settings (so a profiling run recomputes as the job will)."""
    import torch
    from megatron.core.transformer.transformer_config import TransformerConfig

    model, p, layout = run.model, run.parallel, run.layout
    kwargs: dict[str, Any] = dict(
        num_layers=model.num_layers,
        hidden_size=model.hidden_size,
        num_attention_heads=model.num_attention_heads,
        num_query_groups=model.num_query_groups,
        kv_channels=model.kv_channels,
        ffn_hidden_size=model.ffn_hidden_size,
        gated_linear_unit=model.gated_linear_unit,
        activation_func=_activation(model),
        normalization=model.normalization,
        add_bias_linear=model.add_bias_linear,
        add_qkv_bias=model.add_qkv_bias,
        qk_layernorm=model.qk_layernorm,
        mtp_num_layers=model.mtp_num_layers or None,
        init_method_std=settings.init_method_std,
        use_cpu_initialization=True,
        params_dtype=torch.float32,
        pipeline_dtype=torch.float32,
        cuda_graph_scope=[],
        tensor_model_parallel_size=p.tp,
        pipeline_model_parallel_size=p.pp,
        virtual_pipeline_model_parallel_size=layout.vpp if layout.vpp > 1 else None,
        context_parallel_size=p.cp,
        expert_model_parallel_size=p.ep,
        expert_tensor_parallel_size=p.etp,
        sequence_parallel=p.tp > 1,
        pipeline_model_parallel_layout=str(layout),
        overlap_p2p_comm=run.p2p_overlap,
        batch_p2p_comm=not run.p2p_overlap,
        microbatch_group_size_per_vp_stage=run.group_size if layout.vpp > 1 else None,
        gradient_accumulation_fusion=False,
        masked_softmax_fusion=False,
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        apply_rope_fusion=False,
        persist_layer_norm=False,
        **recompute_kwargs(run.memory),
    )
    if model.num_experts:
        kwargs.update(
            num_moe_experts=model.num_experts,
            moe_ffn_hidden_size=model.moe_ffn_hidden_size,
            moe_router_topk=model.moe_router_topk,
            moe_shared_expert_intermediate_size=model.moe_shared_expert_intermediate_size or None,
            moe_layer_freq=[int(moe) for moe in model.moe_layer_pattern],
            moe_router_pre_softmax=model.moe_router_topk == 1,
            moe_token_dispatcher_type=settings.dispatcher,
            moe_grouped_gemm=False,
        )
    return TransformerConfig(**kwargs)


def recompute_kwargs(memory: MemorySettings) -> dict[str, Any]:
    """``TransformerConfig``'s recompute fields for the job's settings, as Megatron-LM's
    ``core_transformer_config_from_args`` passes them: the method and layer count only under
    full recompute (megatron-core refuses a layer count with selective), the modules always."""
    granularity = memory.recompute_granularity
    full = granularity == "full"
    return dict(
        recompute_granularity=granularity,
        recompute_method=memory.recompute_method if full else None,
        recompute_num_layers=memory.recompute_num_layers if full else None,
        recompute_modules=sorted(memory.recompute_modules),
    )


def _activation(model: ModelSpec) -> Any:
    """The activation Megatron-LM's arguments pick: SiLU under --swiglu, else GELU."""
    import torch.nn.functional as F
    from megatron.core.fusions.fused_bias_geglu import quick_gelu

    return F.silu if model.swiglu else quick_gelu if model.quick_geglu else F.gelu


def build_chunks(run: RunConfig, config: Any) -> list[Any]:
    """One ``GPTModel`` per virtual stage of this rank, as Megatron-LM's ``get_model`` asks its
    model provider: ``pre_process``/``post_process`` by virtual stage, specs sliced by it."""
    from megatron.core import parallel_state
    from megatron.core.models.gpt.gpt_layer_specs import (
        get_gpt_decoder_block_spec,
        get_gpt_decoder_layer_specs,
        get_gpt_mtp_block_spec,
    )
    from megatron.core.models.gpt.gpt_model import GPTModel

    model = run.model
    vpp = run.layout.vpp
    decoder_layer_specs = get_gpt_decoder_layer_specs(
        config, use_transformer_engine=False, normalization=model.normalization
    )
    chunks = []
    for vp_stage in range(vpp):
        stage = vp_stage if vpp > 1 else None
        layer_spec = get_gpt_decoder_block_spec(
            config, use_transformer_engine=False, normalization=model.normalization, vp_stage=stage
        )
        mtp_spec = None
        if model.mtp_num_layers:
            # a stage without decoder layers (MTP on its own) takes the MTP layer's spec from
            # the model's last decoder layer, as Megatron-LM's gpt_builders does
            mtp_base = layer_spec if layer_spec.layer_specs else decoder_layer_specs[-1]
            mtp_spec = get_gpt_mtp_block_spec(
                config, mtp_base, use_transformer_engine=False, vp_stage=stage
            )
        chunks.append(
            GPTModel(
                config,
                layer_spec,
                vocab_size=model.padded_vocab_size(),
                max_sequence_length=model.seq_length,
                pre_process=parallel_state.is_pipeline_first_stage(
                    ignore_virtual=False, vp_stage=stage
                ),
                post_process=parallel_state.is_pipeline_last_stage(
                    ignore_virtual=False, vp_stage=stage
                ),
                share_embeddings_and_output_weights=model.tied_embeddings,
                position_embedding_type=model.position_embedding_type,
                mtp_block_spec=mtp_spec,
                vp_stage=stage,
            )
        )
    return chunks


@dataclass(frozen=True)
class BuiltStage:
    """What one virtual stage's module holds, read from the module megatron-core built."""

    symbols: str  # in the layout language: E, t per decoder layer, m per MTP layer, L
    layer_numbers: tuple[int, ...]  # the decoder layers' global numbers (1-based)


def built_stage(chunk: Any) -> BuiltStage:
    """The layers ``chunk`` really holds (embedding, decoder, MTP, output layer)."""
    layers = tuple(chunk.decoder.layers) if hasattr(chunk, "decoder") else ()
    mtp = len(chunk.mtp.layers) if getattr(chunk, "mtp_process", False) else 0
    symbols = (
        ("E" if chunk.pre_process else "")
        + "t" * len(layers)
        + "m" * mtp
        + ("L" if chunk.post_process else "")
    )
    return BuiltStage(symbols, tuple(layer.layer_number for layer in layers))


def expected_stage(layout: Layout, pp_rank: int, chunk: int) -> BuiltStage:
    """What the layout says the stage holds, in :func:`built_stage`'s terms."""
    stage = layout.stage(pp_rank, chunk)
    index = chunk * layout.pp + pp_rank
    before = "".join(layout.stages[:index]).count("t")
    layers = stage.count("t")
    symbols = ("E" if "E" in stage else "") + "t" * layers + "m" * stage.count("m")
    symbols += "L" if "L" in stage else ""
    return BuiltStage(symbols, tuple(range(before + 1, before + layers + 1)))


def embedding_group(pp_ranks: Sequence[int], layout: Layout, *, tied_embeddings: bool) -> list[int]:
    """``pretrain_gpt.py``'s ``get_embedding_ranks`` for the global ranks of one pipeline: the
    first, the last where the embeddings are tied, and every rank holding MTP (megatron-core's
    default, the first and the last, would leave a middle MTP rank's embedding copy unsynced and
    hang untied MTP on rank 0 with VPP)."""
    if len(pp_ranks) == 1:
        return [pp_ranks[0]]
    ranks = {pp_ranks[0]}
    if tied_embeddings:
        ranks.add(pp_ranks[-1])
    ranks.update(
        pp_ranks[rank]
        for rank in range(layout.pp)
        if any(MTP in chunk for chunk in layout.rank_chunks(rank))
    )
    return sorted(ranks)


def check_buildable(layout: Layout, *, tied_embeddings: bool) -> None:
    """Refuse, before any process group, a layout megatron-core 0.16.1 cannot build
    (``ray_layout.model.layout.build_problem``)."""
    problem = build_problem(layout, tied_embeddings=tied_embeddings)
    if problem:
        raise ConfigError(problem)


# combined 1F1B puts its all-to-alls on a stream of their own, a torch.cuda.Stream
# (megatron.core.pipeline_parallel.utils.set_streams), which a CPU rank cannot make
NO_EP_OVERLAP_ON_CPU = (
    "the megatron-core backend runs on CPU, where --overlap-moe-expert-parallel-comm cannot run "
    "(combined 1F1B puts its all-to-alls on a CUDA stream); tune it on the emulated or the "
    "megatron backend"
)


# the CPU ranks run the experts without grouped GEMM (SequentialMLP), and megatron-core's
# TransformerConfig refuses moe_act recompute without it
NO_MOE_ACT_RECOMPUTE_ON_CPU = (
    "the megatron-core backend runs on CPU without grouped GEMM, where megatron-core refuses "
    "--recompute-modules moe_act; tune it on the emulated or the megatron backend"
)


def check_runs_on_cpu(flags: JobFlags) -> None:
    """Refuse, before any run, a job whose schedule or recompute megatron-core cannot run on
    CPU ranks."""
    if flags.ep_overlap.on:
        raise ConfigError(NO_EP_OVERLAP_ON_CPU)
    if "moe_act" in flags.memory.selective:
        raise ConfigError(NO_MOE_ACT_RECOMPUTE_ON_CPU)
