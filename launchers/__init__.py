"""What runs on one rank: Megatron-LM's ``pretrain_gpt.py`` command line and rank environment
(``megatron``), and the emulated Megatron that stands in for it on CPUs (``emulated``, run as
``python -m launchers.emulated_megatron``)."""
