"""The emulated Megatron: a CPU stand-in for one rank of Megatron-LM's ``pretrain_gpt.py``,
run as ``python -m launchers.emulated_megatron`` (whose docstring says what it emulates and how):
the hardware profile it sleeps by, the command line it reads, megatron-core's order of work, the
rank's costs and out-of-memory line, Megatron's log lines, and the rank's training loop."""
