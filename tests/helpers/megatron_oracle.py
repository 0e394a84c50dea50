"""Build megatron-core's own ``GPTModel`` on the CPU from a :class:`ModelSpec`.

An oracle for tests that cross-check this project's analytic sizes against the modules
megatron-core really instantiates.  It uses the local (non-Transformer-Engine) layer spec, a
one-process gloo world and ``use_cpu_initialization``, and never runs a forward pass.

megatron-core is imported lazily, inside the functions, so that its import-time warnings
("Transformer Engine and Apex are not installed") fall under the ``filterwarnings`` marks of
the tests that use it instead of firing at collection time.
"""

from __future__ import annotations

import dataclasses
import os
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from ray_layout.model import sizing
from ray_layout.model.fields import ModelSpec
from ray_layout.model.megatron_args import parse_flags
from ray_layout.model.spec import Recipe

# Warnings megatron-core emits on a CPU-only machine without Transformer Engine or Apex, and
# its own deprecation notices (torch's for the jit decorators megatron-core uses); tests pass
# these to ``pytest.mark.filterwarnings``.
MEGATRON_CPU_WARNINGS = (
    "ignore:Transformer Engine and Apex are not installed:UserWarning",
    "ignore:Apex is not installed:UserWarning",
    "ignore::DeprecationWarning:megatron",
    "ignore:`torch.jit.script_method` is deprecated:DeprecationWarning",
)

SEED = 1234


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def megatron_cpu_world() -> Iterator[None]:
    """A one-rank gloo process group with megatron-core's model-parallel state at TP = PP = 1.

    Reuses a process group someone else already set up, and only tears down what it created.
    """
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state

    created_group = not dist.is_initialized()
    if created_group:
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(_free_port())
        dist.init_process_group(backend="gloo", rank=0, world_size=1)
    created_state = not parallel_state.model_parallel_is_initialized()
    if created_state:
        parallel_state.initialize_model_parallel(1, 1)
    torch.manual_seed(SEED)
    if torch.cuda.is_available():
        # Asserts "Torch not compiled with CUDA enabled" on a CPU build; the CPU initialization
        # path (use_cpu_initialization=True) draws from torch's default generator instead.
        from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

        model_parallel_cuda_manual_seed(SEED)
    try:
        yield
    finally:
        if created_state:
            parallel_state.destroy_model_parallel()
        if created_group:
            dist.destroy_process_group()


def transformer_config(model: ModelSpec) -> Any:
    """The ``TransformerConfig`` (``MLATransformerConfig`` with MLA) Megatron builds for
    ``model``, in fp32 and initialized on the CPU."""
    import torch
    from megatron.core.transformer.transformer_config import (
        MLATransformerConfig,
        TransformerConfig,
    )

    kwargs: dict[str, Any] = dict(
        num_layers=model.num_layers,
        hidden_size=model.hidden_size,
        num_attention_heads=model.num_attention_heads,
        num_query_groups=model.num_query_groups,
        kv_channels=model.kv_channels,
        ffn_hidden_size=model.ffn_hidden_size,
        gated_linear_unit=model.gated_linear_unit,
        activation_func=_activation(model),
        softmax_type=model.softmax_type,
        normalization=model.normalization,
        add_bias_linear=model.add_bias_linear,
        add_qkv_bias=model.add_qkv_bias,
        qk_layernorm=model.qk_layernorm,
        mtp_num_layers=model.mtp_num_layers or None,
        use_cpu_initialization=True,
        params_dtype=torch.float32,
        cuda_graph_scope=[],  # the default "full" only warns that it is deprecated
    )
    if model.num_experts:
        kwargs.update(
            num_moe_experts=model.num_experts,
            moe_ffn_hidden_size=model.moe_ffn_hidden_size,
            moe_router_topk=model.moe_router_topk,
            moe_shared_expert_intermediate_size=model.moe_shared_expert_intermediate_size or None,
            moe_shared_expert_gate=model.moe_shared_expert_gate,
            moe_layer_freq=[int(moe) for moe in model.moe_layer_pattern],
            # TransformerConfig rejects top-1 routing without it, as Megatron-LM's arguments do;
            # it changes no parameter.
            moe_router_pre_softmax=model.moe_router_topk == 1,
        )
    if model.mla is None:
        return TransformerConfig(**kwargs)
    return MLATransformerConfig(
        **kwargs,
        q_lora_rank=model.mla.q_lora_rank,
        kv_lora_rank=model.mla.kv_lora_rank,
        qk_head_dim=model.mla.qk_head_dim,
        qk_pos_emb_head_dim=model.mla.qk_pos_emb_head_dim,
        v_head_dim=model.mla.v_head_dim,
        rope_type="rope",
    )


def _activation(model: ModelSpec) -> Any:
    """The activation Megatron-LM's arguments pick: SiLU under --swiglu, quick GELU under
    --quick-geglu (both gated), else GELU."""
    import torch.nn.functional as F
    from megatron.core.fusions.fused_bias_geglu import quick_gelu

    return F.silu if model.swiglu else quick_gelu if model.quick_geglu else F.gelu


def build_gpt_model(model: ModelSpec) -> Any:
    """megatron-core's ``GPTModel`` for ``model`` as one process (TP = PP = 1) holds it: embedding,
    decoder layers, final norm, MTP layers and the output layer.  Needs
    :func:`megatron_cpu_world` to be active."""
    from megatron.core.models.gpt.gpt_layer_specs import (
        get_gpt_decoder_block_spec,
        get_gpt_mtp_block_spec,
    )
    from megatron.core.models.gpt.gpt_model import GPTModel

    config = transformer_config(model)
    layer_spec = get_gpt_decoder_block_spec(
        config, use_transformer_engine=False, normalization=model.normalization
    )
    if model.mla is not None:
        layer_spec = _mla_local_core_attention(layer_spec)
    mtp_spec = (
        get_gpt_mtp_block_spec(config, layer_spec, use_transformer_engine=False)
        if model.mtp_num_layers
        else None
    )
    learned = model.position_embedding_type == "learned_absolute"
    with _mla_on_this_machine(model), _sinks_on_this_machine(model):
        return GPTModel(
            config,
            layer_spec,
            vocab_size=model.padded_vocab_size(),
            # Megatron-LM passes --max-position-embeddings here; only learned positions use it.
            max_sequence_length=model.max_position_embeddings if learned else model.seq_length,
            position_embedding_type=model.position_embedding_type,
            share_embeddings_and_output_weights=not model.untie_embeddings_and_output_weights,
            mtp_block_spec=mtp_spec,
        )


def _mla_local_core_attention(block_spec: Any) -> Any:
    """``block_spec`` with a core attention the local MLA spec can build.

    ``MLASelfAttention.__init__`` builds its core attention with ``k_channels=`` and
    ``v_channels=`` keywords (megatron/core/transformer/multi_latent_attention.py, the
    ``self.core_attention = build_module(...)`` call, after the base ``Attention`` built one
    without them), which the local ``DotProductAttention`` does not accept, so
    ``get_gpt_layer_local_spec(multi_latent_attention=True)`` cannot be built as it stands in
    megatron-core 0.16.1.  Core attention holds no parameters (softmax and dropout only), so a
    subclass that drops the two keywords leaves every count unchanged.
    """
    import copy

    from megatron.core.transformer.dot_product_attention import DotProductAttention

    class MLADotProductAttention(DotProductAttention):
        def __init__(self, *args: Any, k_channels: Any = None, v_channels: Any = None, **kwargs):
            super().__init__(*args, **kwargs)

    block_spec = copy.deepcopy(block_spec)
    for layer_spec in block_spec.layer_specs:
        layer_spec.submodules.self_attention.submodules.core_attention = MLADotProductAttention
    return block_spec


@contextmanager
def _mla_on_this_machine(model: ModelSpec) -> Iterator[None]:
    """Let ``MLASelfAttention`` build without Transformer Engine and without CUDA.

    Two module-level quirks of megatron/core/transformer/multi_latent_attention.py stop it, and
    neither touches a parameter:

    * ``HAVE_TE``: the module imports ``TELinear`` from megatron.core.extensions.transformer_engine,
      which without TE defines it over a ``MagicMock`` (``te = MagicMock()``), so the import
      succeeds, ``HAVE_TE`` is True and ``isinstance(self.linear_proj, TELinear)`` in
      ``MLASelfAttention.__init__`` (the fp8 ``set_save_original_input`` check) raises TypeError.
      Set it to what the missing TE means: False.
    * ``RotaryEmbedding``: ``MLASelfAttention.__init__`` builds it without
      ``use_cpu_initialization``, so its ``inv_freq`` goes to ``torch.cuda.current_device()``,
      which asserts on a CPU build of torch.  ``inv_freq`` is a plain tensor, not a parameter.
    """
    if model.mla is None:
        yield
        return
    import torch
    from megatron.core.extensions import transformer_engine
    from megatron.core.transformer import multi_latent_attention

    patches: dict[str, Any] = {}
    if not transformer_engine.HAVE_TE:
        patches["HAVE_TE"] = False
    if not torch.cuda.is_available():
        cuda_rotary_embedding = multi_latent_attention.RotaryEmbedding

        def rotary_embedding_on_cpu(*args: Any, **kwargs: Any) -> Any:
            return cuda_rotary_embedding(*args, **{**kwargs, "use_cpu_initialization": True})

        patches["RotaryEmbedding"] = rotary_embedding_on_cpu
    originals = {name: getattr(multi_latent_attention, name) for name in patches}
    for name, value in patches.items():
        setattr(multi_latent_attention, name, value)
    try:
        yield
    finally:
        for name, value in originals.items():
            setattr(multi_latent_attention, name, value)


@contextmanager
def _sinks_on_this_machine(model: ModelSpec) -> Iterator[None]:
    """Let ``DotProductAttention`` build its attention sinks without CUDA.

    Under ``softmax_type="learnable"`` it allocates ``softmax_offset`` (one parameter per head) on
    ``torch.cuda.current_device()`` (megatron/core/transformer/dot_product_attention.py), which
    asserts on a CPU build of torch; the device changes no count, so the CPU stands in."""
    import torch

    if model.softmax_type == "vanilla" or torch.cuda.is_available():
        yield
        return
    current_device = torch.cuda.current_device
    torch.cuda.current_device = lambda: "cpu"
    try:
        yield
    finally:
        torch.cuda.current_device = current_device


def count_params(module: Any) -> int:
    """Parameters of ``module``; ``parameters()`` counts a tensor shared by two modules once."""
    return sum(p.numel() for p in module.parameters())


def megatron_core_takes(
    recipe: Recipe, source: str, as_read: Callable[[dict], dict] = dict
) -> dict[str, Any]:
    """megatron-core's GPTModel holds sizing's count of ``recipe``, and its TransformerConfig
    takes the recipe's derived flags (``as_read``: their values as Megatron's arguments hand them
    over), its checks run again; returns the settings it took."""
    assert sizing.parameter_count(recipe.model).total_with_everything == count_params(
        build_gpt_model(recipe.model)
    )
    config = transformer_config(recipe.model)
    names = {f.name for f in dataclasses.fields(config)}
    settings = {k: v for k, v in parse_flags(recipe.megatron_args, source).items() if k in names}
    dataclasses.replace(config, **as_read(settings))
    return settings
