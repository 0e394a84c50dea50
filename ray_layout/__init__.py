"""ray_layout: measured pipeline-parallel layouts for Megatron-LM MoE + MTP models."""

__version__ = "0.1.0"
